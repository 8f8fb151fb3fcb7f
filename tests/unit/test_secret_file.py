"""The generated server secret: created 0600 (never readable by others, not for an instant),
written in full before it appears, and one secret for processes starting at once."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln_platform.settings import Settings


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that hides nothing, so only the code's own mode protects the file."""
    old = os.umask(0)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("open_umask")
def test_secret_file_is_0600_from_creation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file in the folder is 0600 whenever the code touches the file system after
    creating it (fsync, chmod, link): a file made with the umask's mode and narrowed later
    would show up here with its wider mode."""
    seen: list[tuple[str, int, str]] = []

    def observing(name: str) -> None:
        real = getattr(os, name)

        def call(*args: object, **kw: object) -> object:
            seen.extend((name, _mode(p), p.read_text()) for p in tmp_path.iterdir())
            return real(*args, **kw)

        monkeypatch.setattr(os, name, call)

    for name in ("fsync", "chmod", "link", "replace", "rename"):
        observing(name)
    secret = Settings(data_dir=tmp_path).hmac_key()
    path = tmp_path / "secret.key"
    assert _mode(path) == 0o600
    assert len(secret) >= 64
    assert seen, "nothing observed"
    assert {mode for _, mode, _ in seen} == {0o600}, seen
    assert ("link", 0o600, secret.decode()) in seen  # written in full before it is published
    assert [p.name for p in tmp_path.iterdir()] == ["secret.key"]  # no temporary file left
    assert Settings(data_dir=tmp_path).hmac_key() == secret  # read, not made anew


@pytest.mark.usefixtures("open_umask")
def test_concurrent_starts_share_one_secret(tmp_path: Path) -> None:
    n = 8
    barrier = threading.Barrier(n)
    results: list[bytes] = []

    def start() -> None:
        barrier.wait()
        results.append(Settings(data_dir=tmp_path).hmac_key())

    threads = [threading.Thread(target=start) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == n
    assert len(set(results)) == 1
    assert _mode(tmp_path / "secret.key") == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret.key"]
