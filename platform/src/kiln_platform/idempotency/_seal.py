"""Stored response bodies sealed with AES-256-GCM under a key derived from the server secret.

A stored body may carry tenant data (prompts, completions) or a secret (a new API key's), so
the database never holds it in clear; the row's identity is the associated data, so a sealed
body cannot be moved to another row.
"""

from __future__ import annotations

import hmac
from hashlib import sha256

from kiln_platform.sealing import Seal, derive


class Sealer:
    """Seals and opens bodies; also the keyed fingerprint of a request."""

    def __init__(self, secret: bytes) -> None:
        self._seal = Seal(secret, b"kiln idempotency seal v1")
        self._mac_key = derive(secret, b"kiln idempotency fingerprint v1")

    def seal(self, plain: bytes, identity: bytes) -> bytes:
        """``nonce || ciphertext+tag``."""
        return self._seal.seal(plain, identity)

    def open(self, sealed: bytes, identity: bytes) -> bytes:
        """The plain body (``cryptography.exceptions.InvalidTag`` if tampered or moved)."""
        return self._seal.open(sealed, identity)

    def fingerprinter(self) -> hmac.HMAC:
        """An incremental keyed SHA-256 for a request's query string and body."""
        return hmac.new(self._mac_key, digestmod=sha256)
