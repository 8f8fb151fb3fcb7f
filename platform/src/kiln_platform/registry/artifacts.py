"""A version's files on this host: the artifact store's tree, fetched on first use when the
store is shared (``KILN_ARTIFACT_STORE=s3://...``) and the tree was written by another gateway."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from kiln_runtimes.store import ArtifactStore


async def local_tree(store: ArtifactStore, digest: str) -> Path:
    """The tree's folder; fetched (off the event loop) only when it is not here yet."""
    folder = store.path(digest)
    if folder.is_dir():
        return folder
    return await asyncio.to_thread(store.ensure, digest)
