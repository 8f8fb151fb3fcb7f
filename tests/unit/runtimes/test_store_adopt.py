"""``ArtifactStore.adopt``: a file hashed as it was written is moved into the store, not read,
hashed and copied again; the blob is the one ``put_file`` names for the same bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kiln_runtimes.store import ArtifactStore

DATA = b'{"custom_id": "a"}\n'


def test_adopt_moves_the_file_into_place(tmp_path: Path) -> None:
    store, staged = ArtifactStore(tmp_path / "store"), tmp_path / "staged"
    staged.write_bytes(DATA)
    inode, digest = staged.stat().st_ino, hashlib.sha256(DATA).hexdigest()
    store.adopt(staged, digest)
    blob = store.blob(digest)
    assert not staged.exists()
    assert blob.stat().st_ino == inode  # renamed, not copied
    assert blob.read_bytes() == DATA
    again = tmp_path / "again"
    again.write_bytes(DATA)
    assert store.put_file(again) == digest
    store.adopt(again, digest)  # the bytes are there: nothing replaced
    assert blob.stat().st_ino == inode


def test_adopt_refuses_a_digest_that_is_no_hex_sha256(tmp_path: Path) -> None:
    staged = tmp_path / "staged"
    staged.write_bytes(DATA)
    with pytest.raises(ValueError, match="not a sha256 hex digest"):
        ArtifactStore(tmp_path / "store").adopt(staged, "../../escape")
    assert staged.exists()
