"""The ``s3://`` artifact store against moto's standalone S3 server: what one cache writes,
another materializes; bytes that do not match their digest are refused both ways; two processes
materialize one tree at once; the cache evicts least recently used trees under its cap."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

import boto3
import pytest

from kiln_runtimes._s3 import DigestMismatch
from kiln_runtimes.store import ArtifactStore, open_store, tree_hex

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


@pytest.fixture
def url(
    s3_server: dict[str, str], new_bucket: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> str:
    """A fresh bucket's store URL, with this process's ``AWS_*`` pointing at moto."""
    for name, value in s3_server.items():
        monkeypatch.setenv(name, value)
    return new_bucket()


def _folder(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _objects(url: str) -> list[str]:
    bucket = url.removeprefix("s3://").split("/")[0]
    listed = boto3.session.Session().client("s3").list_objects_v2(Bucket=bucket)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def test_a_tree_written_by_one_cache_is_materialized_by_another(tmp_path: Path, url: str) -> None:
    files = {"model.onnx": os.urandom(3000), "sub/tokenizer.json": b"{}", "kiln.json": b"{}"}
    a = open_store(tmp_path / "a", url)
    digest = a.put_dir(_folder(tmp_path / "src", files))
    a.put_bytes("engines/x", b"ref")
    b = open_store(tmp_path / "b", url)
    assert not b.path(digest).exists()
    assert b.has(digest)
    folder = b.ensure(digest)
    assert {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file()} == files  # fmt: skip
    assert b.get_bytes("engines/x") == b"ref"
    assert f"kiln/trees/{tree_hex(digest)}" in _objects(url)
    with pytest.raises(FileNotFoundError):
        b.ensure("sha256:" + "0" * 64)


@pytest.mark.parametrize("size", [1000, 9 << 20], ids=["put", "multipart"])
def test_an_upload_whose_bytes_change_is_refused(tmp_path: Path, url: str, size: int) -> None:
    src = tmp_path / "f"
    src.write_bytes(os.urandom(size))
    store = open_store(tmp_path / "cache", url)
    assert store.remote is not None
    with pytest.raises(DigestMismatch):
        store.remote.upload("blobs/sha256/" + "a" * 64, src, "a" * 64)
    assert _objects(url) == []  # nothing under the key, no half object
    hexdigest = store.put_file(src)
    assert _objects(url) == [f"kiln/blobs/sha256/{hexdigest}"]


def test_a_blob_that_does_not_match_its_digest_is_refused(tmp_path: Path, url: str) -> None:
    digest = open_store(tmp_path / "a", url).put_dir(_folder(tmp_path / "src", {"m": b"good"}))
    bucket = url.removeprefix("s3://").split("/")[0]
    key = next(k for k in _objects(url) if "/blobs/" in k)
    boto3.session.Session().client("s3").put_object(Bucket=bucket, Key=key, Body=b"evil")
    b = open_store(tmp_path / "b", url)
    with pytest.raises(DigestMismatch):
        b.ensure(digest)
    assert not b.path(digest).exists()
    assert not b.blob(key.rsplit("/", 1)[1]).exists()


def test_two_processes_materialize_one_tree_at_once(tmp_path: Path, url: str) -> None:
    files = {f"part{i}.bin": os.urandom(200_000) for i in range(6)}
    digest = open_store(tmp_path / "a", url).put_dir(_folder(tmp_path / "src", files))
    cache = tmp_path / "shared"
    script = (
        "import os, sys, pathlib; from kiln_runtimes.worker import materialize; "
        "materialize(pathlib.Path(sys.argv[1]), os.environ)"
    )
    model_dir = ArtifactStore(cache).path(digest)
    env = {**os.environ, "KILN_ARTIFACT_STORE": url}
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(model_dir)], env=env) for _ in range(2)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert {p.name: p.read_bytes() for p in model_dir.iterdir()} == files
    assert not [p for p in (cache / "trees").iterdir() if p.name.startswith(".tmp-")]
    assert len(list((cache / "blobs" / "sha256").iterdir())) == len(files)


def test_the_cache_evicts_least_recently_used_trees(tmp_path: Path, url: str) -> None:
    shared, one, two = os.urandom(4000), os.urandom(4000), os.urandom(4000)
    writer = open_store(tmp_path / "a", url)
    first = writer.put_dir(_folder(tmp_path / "1", {"shared": shared, "own": one}))
    second = writer.put_dir(_folder(tmp_path / "2", {"shared": shared, "own": two}))
    cache = open_store(tmp_path / "cache", url, max_bytes=10_000)
    cache.ensure(first)
    os.utime(cache.path(first), (1, 1))  # long ago
    cache.ensure(second)  # 12 kB of blobs > 10 kB: the first tree goes, the shared blob stays
    assert not cache.path(first).exists()
    assert (cache.path(second) / "shared").read_bytes() == shared
    blobs = sorted(p.stat().st_size for p in (tmp_path / "cache" / "blobs" / "sha256").iterdir())
    assert blobs == [4000, 4000]
    assert (cache.ensure(first) / "own").read_bytes() == one  # fetched again on demand
    assert not cache.path(second).exists()
