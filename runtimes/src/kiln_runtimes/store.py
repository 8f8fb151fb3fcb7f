"""Content-addressed artifact store (local directory; S3-compatible storage is the production seam).

Files are stored once as ``blobs/sha256/<hex>``; a folder is a *tree*: a JSON list of
``[relative path, blob digest, size]`` whose own sha256 names it. ``path(digest)`` returns the
tree materialized as hard links, which is what workers load from.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

import msgspec

_CHUNK = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")


def tree_hex(digest: str) -> str:
    """The 64 lowercase hex characters of a ``sha256:<hex>`` tree digest, checked before it
    names a folder: anything else (``../../etc``, upper case, a NUL) raises ``ValueError``
    without touching the filesystem."""
    algo, _, hexdigest = digest.partition(":")
    if algo != "sha256" or not _HEX64.fullmatch(hexdigest):
        raise ValueError(f"not a sha256 tree digest: {digest[:80]!r}")
    return hexdigest


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _copy_into(src: Path, dest: Path) -> None:
    """Copy ``src`` to ``dest`` atomically (a temporary file beside it, then a rename); a
    failed copy (a full disk) leaves neither."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class ArtifactStore:
    """A local content-addressed store rooted at ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._blobs = root / "blobs" / "sha256"
        self._trees = root / "trees"

    def put_file(self, src: Path) -> str:
        """Store one file; returns its hex sha256."""
        return self._put_file(src)[0]

    def _put_file(self, src: Path) -> tuple[str, bool]:
        """Store one file: its hex sha256, and whether the store did not have it before."""
        digest = _sha256_file(src)
        dest = self._blobs / digest
        if dest.exists():
            return digest, False
        dest.parent.mkdir(parents=True, exist_ok=True)
        _copy_into(src, dest)
        return digest, True

    def adopt(self, src: Path, hexdigest: str) -> None:
        """Store a file whose sha256 its writer computed on the way (``hexdigest``) by moving it
        into place: not read, hashed or copied again (copied only from another filesystem).
        ``src`` is moved, unless the store has those bytes already."""
        dest = self.blob(hexdigest)
        if dest.exists():
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(src, dest)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            _copy_into(src, dest)

    def put_dir(self, src: Path) -> str:
        """Store every file under ``src``; returns the tree digest ``sha256:<hex>``.

        All or nothing: if a file cannot be stored (a full disk), the blobs this call added
        and no tree holds are removed again before the error propagates."""
        entries: list[list[str | int]] = []
        added: list[str] = []
        try:
            for p in sorted(src.rglob("*")):
                if p.is_file():
                    blob, new = self._put_file(p)
                    added += [blob] if new else []
                    entries.append([p.relative_to(src).as_posix(), blob, p.stat().st_size])
            listing = msgspec.json.encode(entries)
            digest = "sha256:" + hashlib.sha256(listing).hexdigest()
            self._materialize(digest, entries)
        except BaseException:
            for blob in added:
                self.remove_blob(blob)
            raise
        return digest

    def has(self, digest: str) -> bool:
        """Whether a tree is present."""
        return self.path(digest).is_dir()

    @classmethod
    def owning(cls, folder: Path) -> tuple[ArtifactStore, str] | None:
        """The store a materialized tree belongs to and the tree's digest, or None."""
        folder = folder.resolve()
        if folder.parent.name != "trees" or not _HEX64.fullmatch(folder.name):
            return None
        store = cls(folder.parent.parent)
        return (store, f"sha256:{folder.name}") if store._blobs.is_dir() else None

    def put_bytes(self, name: str, data: bytes) -> None:
        """Write a small mutable record (a ref, not content-addressed) atomically."""
        dest = self.root / "refs" / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def get_bytes(self, name: str) -> bytes | None:
        """Read a record written by ``put_bytes``, or None."""
        try:
            return (self.root / "refs" / name).read_bytes()
        except FileNotFoundError:
            return None

    def remove_tree(self, digest: str) -> None:
        """Remove a tree and the blobs no other tree links to (a failed import's source).

        A blob's hard links are the trees that hold it, so a blob left with one link (its own
        name) belongs to no tree any more. The caller makes sure no one still needs the tree.
        """
        folder = self.path(digest)
        if not folder.is_dir():
            return
        inodes = {p.stat().st_ino for p in folder.rglob("*") if p.is_file()}
        shutil.rmtree(folder)
        for blob in self._blobs.iterdir() if inodes else ():
            with contextlib.suppress(FileNotFoundError):
                st = blob.stat()
                if st.st_ino in inodes and st.st_nlink == 1:
                    blob.unlink()

    def blob(self, hexdigest: str) -> Path:
        """Where a blob stored by ``put_file`` is (``ValueError`` unless 64 lowercase hex)."""
        if not _HEX64.fullmatch(hexdigest):
            raise ValueError(f"not a sha256 hex digest: {hexdigest[:80]!r}")
        return self._blobs / hexdigest

    def remove_blob(self, hexdigest: str) -> None:
        """Remove a blob no tree links to (a deleted file's bytes); one a tree holds stays."""
        with contextlib.suppress(FileNotFoundError):
            blob = self.blob(hexdigest)
            if blob.stat().st_nlink == 1:
                blob.unlink()

    def path(self, digest: str) -> Path:
        """The materialized folder of a tree (``ValueError`` unless ``digest`` is one)."""
        return self._trees / tree_hex(digest)

    def _materialize(self, digest: str, entries: list[list[str | int]]) -> None:
        dest = self.path(digest)
        if dest.is_dir():
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".tmp-"))
        try:
            for rel, blob, _size in entries:
                target = tmp / str(rel)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(self._blobs / str(blob), target)
        except BaseException:  # a full disk: no half-linked tree left behind
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            tmp.rename(dest)
        except OSError:  # another process materialized it first
            shutil.rmtree(tmp)
