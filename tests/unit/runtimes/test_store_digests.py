"""A digest from a request or a message is checked as 64 lowercase hex characters before it
becomes a path: the store, the compiler and the worker's adapter field refuse anything else
without touching the filesystem."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from kiln_runtimes import _generate
from kiln_runtimes._errors import BadRequest
from kiln_runtimes.compile import compile_engine
from kiln_runtimes.protocol import GenerateRequest
from kiln_runtimes.store import ArtifactStore, tree_hex

GOOD = "sha256:" + "0123456789abcdef" * 4
ESCAPE = "../../" + "x" * 58
"""64 characters that climb out of ``<store>/trees`` (a length check alone lets it through)."""
BAD = [
    "sha256:../../etc",
    f"sha256:{ESCAPE}",
    "sha256:" + "0123456789ABCDEF" * 4,
    "sha256:" + "a" * 63,
    "sha256:" + "a" * 65,
    "sha256:" + "a" * 63 + "\x00",
    "sha256:" + "a" * 63 + "/",
    "sha1:" + "a" * 64,
    "a" * 64,
    "",
]


def test_a_hex_digest_names_its_tree(tmp_path: Path) -> None:
    assert tree_hex(GOOD) == GOOD.removeprefix("sha256:")
    assert ArtifactStore(tmp_path).path(GOOD) == tmp_path / "trees" / tree_hex(GOOD)


@pytest.mark.parametrize("digest", BAD)
def test_the_store_refuses_what_is_not_a_digest(tmp_path: Path, digest: str) -> None:
    (tmp_path / ("x" * 58)).mkdir()  # where ESCAPE lands: has() said True before the check
    root = tmp_path / "store"
    store = ArtifactStore(root)
    with pytest.raises(ValueError, match="not a sha256 tree digest"):
        store.path(digest)
    with pytest.raises(ValueError, match="not a sha256 tree digest"):
        store.has(digest)
    assert not root.exists()


@pytest.mark.parametrize("digest", BAD[:3])
def test_the_compiler_refuses_before_it_reads_or_writes(tmp_path: Path, digest: str) -> None:
    root = tmp_path / "store"
    with pytest.raises(ValueError, match="not a sha256 tree digest"):
        compile_engine(ArtifactStore(root), digest, target="cpu", precision="fp32", threads=1)
    assert not root.exists()


@pytest.mark.parametrize("adapter", BAD[:3])
def test_a_worker_refuses_an_adapter_that_is_not_a_digest(adapter: str) -> None:
    request = GenerateRequest(request_id="r", prompt_ids=[1, 2], max_tokens=1, adapter=adapter)
    with pytest.raises(BadRequest, match="adapter"):
        _generate.validate(request, context_length=16)
    _generate.validate(msgspec.structs.replace(request, adapter=GOOD), context_length=16)
