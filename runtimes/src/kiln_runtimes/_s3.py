"""The S3 side of the artifact store (``KILN_ARTIFACT_STORE=s3://bucket/prefix``), over boto3.

Keys mirror the local layout: ``<prefix>/blobs/sha256/<hex>`` (a file's bytes),
``<prefix>/trees/<hex>`` (a tree's JSON listing, whose sha256 is ``<hex>``) and
``<prefix>/refs/<name>`` (small mutable records). Endpoint and credentials come from the standard
AWS settings (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, profiles, IRSA's web identity).

Uploads stream: s3transfer reads a non-seekable reader in order (multipart above 8 MiB), and the
reader hashes what it hands over; a mismatch raises before the upload completes, so S3 aborts it
and nothing appears under the key. A multipart upload becomes visible only once completed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit


class DigestMismatch(ValueError):
    """Bytes read or written do not have the sha256 that names them."""


_MULTIPART = 8 << 20
_CHUNK = 1 << 20


class _HashingReader:
    """A forward-only reader that refuses, at its end, bytes that are not ``expected``."""

    def __init__(self, f: IO[bytes], expected: str) -> None:
        self._f, self._expected, self._h = f, expected, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        self._h.update(data)
        at_end = size < 0 or len(data) < size  # a buffered file reads short only at its end
        if at_end and self._h.hexdigest() != self._expected:
            raise DigestMismatch(f"upload of {self._expected[:12]}: the file changed on the way")
        return data

    def seekable(self) -> bool:
        return False


class S3Remote:
    """Content-addressed objects under ``s3://bucket/prefix``."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"not an s3://bucket/prefix URL: {url!r}")
        import boto3
        from boto3.s3.transfer import TransferConfig

        self.url, self.bucket = url, parts.netloc
        self._prefix = parts.path.strip("/")
        self._client: Any = boto3.session.Session().client("s3")
        self._transfer = TransferConfig(
            multipart_threshold=_MULTIPART, multipart_chunksize=_MULTIPART
        )

    def key(self, name: str) -> str:
        """The object key of ``name`` (``blobs/sha256/<hex>``, ``trees/<hex>``, ``refs/...``)."""
        return f"{self._prefix}/{name}" if self._prefix else name

    def exists(self, name: str) -> bool:
        """Whether the object is there."""
        from botocore.exceptions import ClientError

        try:
            self._client.head_object(Bucket=self.bucket, Key=self.key(name))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                return False
            raise
        return True

    def upload(self, name: str, src: Path, hexdigest: str) -> None:
        """Stream ``src`` to ``name``; refused (none written) unless its sha256 is ``hexdigest``."""
        with src.open("rb") as f:
            self._client.upload_fileobj(
                _HashingReader(f, hexdigest), self.bucket, self.key(name), Config=self._transfer
            )

    def download(self, name: str, dest: Path, hexdigest: str) -> None:
        """Stream ``name`` into ``dest`` (a temporary file beside it, then a link: never a partial
        file under ``dest``); ``DigestMismatch`` unless its sha256 is ``hexdigest``."""
        body = self._client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"]
        h = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in body.iter_chunks(_CHUNK):
                    h.update(chunk)
                    f.write(chunk)
            if h.hexdigest() != hexdigest:
                raise DigestMismatch(f"{self.key(name)} does not have sha256 {hexdigest[:12]}")
            with contextlib.suppress(FileExistsError):  # another process fetched it first
                os.link(tmp, dest)
        finally:
            os.unlink(tmp)

    def put_bytes(self, name: str, data: bytes) -> None:
        """Write a small object (one PUT: atomic)."""
        self._client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data)

    def get_bytes(self, name: str) -> bytes | None:
        """Read a small object, or None."""
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"]
        except self._client.exceptions.NoSuchKey:
            return None
        data: bytes = body.read()
        return data
