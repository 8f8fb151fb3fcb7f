"""Importing an uploaded file: the one path of the admin API's and the console's model imports
(``registry.imports`` stages and queues; this adds the running services around it)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from kiln_platform.registry.imports import check_scoring, stage, start_import
from kiln_platform.registry.upload import upload_version

if TYPE_CHECKING:
    import uuid
    from pathlib import Path

    from kiln_platform.admin.authz import Actor
    from kiln_platform.context import Kiln
    from kiln_platform.registry.imports import ImportOptions
    from kiln_platform.registry.upload import Uploaded


async def import_file(
    kiln: Kiln, actor: Actor, name: str, body: Path, options: ImportOptions
) -> uuid.UUID | Uploaded:
    """An uploaded file at ``body`` (an archive of a folder, a .gguf or a .onnx, alone in a
    scratch folder): a build source's job id (the compiler poked), or a tensor model's version,
    registered at once. The admin API and the console's Models page both import through here."""
    settings = kiln.settings
    staged = await asyncio.to_thread(
        stage, body, body.parent, settings.max_upload_bytes, options.task
    )
    if staged.kind == "tensor":
        check_scoring(options, "tensor")
        return await upload_version(
            kiln.db.sessions, kiln.store, settings, name, staged.root,
            actor=actor, version=options.version, refresh=kiln.resolver.refresh,
        )  # fmt: skip
    job_id = await start_import(
        kiln.db.sessions, kiln.store, name, staged, options, actor=actor, env=kiln.compiler.env
    )
    kiln.compiler.poke()
    return job_id
