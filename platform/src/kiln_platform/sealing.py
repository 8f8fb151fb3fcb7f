"""Secrets at rest: AES-256-GCM under a key derived from the server secret, one key per purpose.

The key is HMAC-SHA256(server secret, purpose) (an HKDF extract with the purpose as salt), so a
purpose's key opens nothing of another's. The sealed value's identity (its row key) is the
associated data: a sealed value copied onto another row does not open.
"""

from __future__ import annotations

import hmac
import os
from hashlib import sha256

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

NONCE = 12


def derive(secret: bytes, purpose: bytes) -> bytes:
    """A 32-byte key for ``purpose`` from the server secret."""
    return hmac.new(secret, purpose, sha256).digest()


class Seal:
    """Seals and opens values for one purpose."""

    def __init__(self, secret: bytes, purpose: bytes) -> None:
        self._aead = AESGCM(derive(secret, purpose))

    def seal(self, plain: bytes, identity: bytes) -> bytes:
        """``nonce || ciphertext+tag``."""
        nonce = os.urandom(NONCE)
        return nonce + self._aead.encrypt(nonce, plain, identity)

    def open(self, sealed: bytes, identity: bytes) -> bytes:
        """The plain value (``cryptography.exceptions.InvalidTag`` if tampered, moved or sealed
        under another secret)."""
        return self._aead.decrypt(sealed[:NONCE], sealed[NONCE:], identity)
