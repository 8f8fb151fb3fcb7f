"""Content-addressed artifact store: a local directory, optionally the cache of an S3 store.

Files are stored once as ``blobs/sha256/<hex>``; a folder is a *tree*: a JSON list of
``[relative path, blob digest, size]`` whose own sha256 names it. ``path(digest)`` returns the
tree materialized as hard links, which is what workers load from.

With a remote (``open_store(root, "s3://bucket/prefix")``, ``_s3``) every blob, tree listing
and ref written here is also written there, and the local directory is a cache: ``ensure``
fetches a tree's listing and missing blobs (each checked against its digest) and materializes
it; ``evict`` drops the least recently ensured trees, and the blobs no kept tree links, while the
blobs pass ``max_bytes``. Processes sharing a cache take ``.lock`` shared to fetch and
exclusive to evict, so two workers materializing at once and a third evicting stay safe.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import msgspec

from kiln_runtimes._s3 import DigestMismatch

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kiln_runtimes._s3 import S3Remote

_CHUNK = 1 << 20
STORE_ENV = "KILN_ARTIFACT_STORE"
"""A worker's ``s3://bucket/prefix`` store, to materialize its ``--model-dir`` tree from."""
CACHE_MAX_ENV = "KILN_ARTIFACT_CACHE_MAX_BYTES"
"""A worker's cap on the blobs of its local cache (0 or unset: unbounded)."""
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


def open_store(root: Path, url: str | None = None, max_bytes: int = 0) -> ArtifactStore:
    """The store at ``root``, or, with ``url`` (``s3://bucket/prefix``), that S3 store cached at
    ``root`` within ``max_bytes`` of blobs (0: unbounded)."""
    if not url:
        return ArtifactStore(root)
    from kiln_runtimes._s3 import S3Remote

    return ArtifactStore(root, S3Remote(url), max_bytes)


Entries = list[tuple[str, str, int]]
"""A tree's listing: ``(relative path, blob hex digest, size)`` per file."""


class ArtifactStore:
    """A content-addressed store rooted at ``root`` (the cache of ``remote``, if any)."""

    def __init__(self, root: Path, remote: S3Remote | None = None, max_bytes: int = 0) -> None:
        self.root = root
        self.remote = remote
        self.max_bytes = max_bytes
        self._blobs = root / "blobs" / "sha256"
        self._trees = root / "trees"

    def put_file(self, src: Path) -> str:
        """Store one file; returns its hex sha256."""
        return self._put_file(src)[0]

    def _put_file(self, src: Path) -> tuple[str, bool]:
        """Store one file: its hex sha256, and whether the store did not have it before."""
        digest = _sha256_file(src)
        dest = self._blobs / digest
        new = not dest.exists()
        if new:
            dest.parent.mkdir(parents=True, exist_ok=True)
            _copy_into(src, dest)
        self._push(digest)
        return digest, new

    def _push(self, hexdigest: str) -> None:
        """Upload a local blob to the remote unless it has it (content-addressed: immutable)."""
        name = f"blobs/sha256/{hexdigest}"
        if self.remote is not None and not self.remote.exists(name):
            self.remote.upload(name, self.blob(hexdigest), hexdigest)

    def adopt(self, src: Path, hexdigest: str) -> None:
        """Store a file whose sha256 its writer computed on the way (``hexdigest``) by moving it
        into place: not read, hashed or copied again (copied only from another filesystem).
        ``src`` is moved, unless the store has those bytes already."""
        dest = self.blob(hexdigest)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(src, dest)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                _copy_into(src, dest)
        self._push(hexdigest)

    def put_dir(self, src: Path) -> str:
        """Store every file under ``src``; returns the tree digest ``sha256:<hex>``.

        All or nothing: if a file cannot be stored (a full disk), the blobs this call added
        and no tree holds are removed again before the error propagates."""
        entries: Entries = []
        added: list[str] = []
        try:
            for p in sorted(src.rglob("*")):
                if p.is_file():
                    blob, new = self._put_file(p)
                    added += [blob] if new else []
                    entries.append((p.relative_to(src).as_posix(), blob, p.stat().st_size))
            listing = msgspec.json.encode(entries)
            hexdigest = hashlib.sha256(listing).hexdigest()
            if self.remote is not None and not self.remote.exists(f"trees/{hexdigest}"):
                self.remote.put_bytes(f"trees/{hexdigest}", listing)  # after its blobs
            self._materialize(f"sha256:{hexdigest}", entries)
        except BaseException:
            for blob in added:
                self.remove_blob(blob)
            raise
        return f"sha256:{hexdigest}"

    def has(self, digest: str) -> bool:
        """Whether a tree is present (here, or in the remote)."""
        if self.path(digest).is_dir():
            return True
        return self.remote is not None and self.remote.exists(f"trees/{tree_hex(digest)}")

    def ensure(self, digest: str) -> Path:
        """The materialized folder of a tree, fetched from the remote first if it is not here
        (``FileNotFoundError`` if neither has it); marks the tree as just used."""
        folder = self.path(digest)
        if folder.is_dir():
            with contextlib.suppress(FileNotFoundError):
                os.utime(folder)
            return folder
        if self.remote is None:
            raise FileNotFoundError(f"tree {digest} is not in the artifact store")
        with self._lock(fcntl.LOCK_SH):
            self._materialize(digest, self._fetch(tree_hex(digest)))
        self.evict(keep=digest)
        return folder

    def _fetch(self, hexdigest: str) -> Entries:
        """A tree's listing from the remote, verified, with every blob it names fetched."""
        assert self.remote is not None
        listing = self.remote.get_bytes(f"trees/{hexdigest}")
        if listing is None:
            raise FileNotFoundError(f"tree sha256:{hexdigest} is not in {self.remote.url}")
        if hashlib.sha256(listing).hexdigest() != hexdigest:
            raise DigestMismatch(f"tree listing {hexdigest[:12]} does not match its digest")
        entries = msgspec.json.decode(listing, type=Entries)
        self._blobs.mkdir(parents=True, exist_ok=True)
        for rel, blob, _size in entries:
            path = PurePosixPath(rel)
            if path.is_absolute() or ".." in path.parts:
                raise ValueError(f"tree {hexdigest[:12]} names a path outside itself: {rel!r}")
            if not self.blob(blob).exists():
                self.remote.download(f"blobs/sha256/{blob}", self.blob(blob), blob)
        return entries

    def evict(self, keep: str | None = None) -> None:
        """Drop the least recently ensured trees (never ``keep``) and the blobs no other tree
        links until the blobs fit in ``max_bytes``; only a remote's cache is ever evicted."""
        if self.remote is None or not self.max_bytes or not self._trees.is_dir():
            return
        with self._lock(fcntl.LOCK_EX):
            used = sum(p.stat().st_size for p in self._blobs.iterdir())
            trees = [p for p in self._trees.iterdir() if _HEX64.fullmatch(p.name)]
            for folder in sorted(trees, key=lambda p: p.stat().st_mtime):
                if used <= self.max_bytes:
                    break
                if keep is None or folder.name != tree_hex(keep):
                    used -= self._drop(folder)

    @contextlib.contextmanager
    def _lock(self, kind: int) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / ".lock").open("a") as f:
            fcntl.flock(f, kind)
            yield

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
        if self.remote is not None:
            self.remote.put_bytes(f"refs/{name}", data)

    def get_bytes(self, name: str) -> bytes | None:
        """Read a record written by ``put_bytes`` (the remote's, with one), or None."""
        if self.remote is not None:
            return self.remote.get_bytes(f"refs/{name}")
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
        if folder.is_dir():
            self._drop(folder)

    def _drop(self, folder: Path) -> int:
        """Remove a materialized tree and its blobs no other tree links; the bytes freed."""
        inodes = {p.stat().st_ino for p in folder.rglob("*") if p.is_file()}
        shutil.rmtree(folder)
        freed = 0
        for blob in self._blobs.iterdir() if inodes else ():
            with contextlib.suppress(FileNotFoundError):
                st = blob.stat()
                if st.st_ino in inodes and st.st_nlink == 1:
                    blob.unlink()
                    freed += st.st_size
        return freed

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

    def _materialize(self, digest: str, entries: Entries) -> None:
        dest = self.path(digest)
        if dest.is_dir():
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".tmp-"))
        try:
            for rel, blob, _size in entries:
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(self._blobs / blob, target)
        except BaseException:  # a full disk: no half-linked tree left behind
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            tmp.rename(dest)
        except OSError:  # another process materialized it first
            shutil.rmtree(tmp)
