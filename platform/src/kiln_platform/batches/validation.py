"""A batch's lines checked before any runs: its endpoint, one model the tenant can use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln_platform.adapters.directory import split
from kiln_platform.batches.jsonl import check_line, refuse
from kiln_platform.batches.schemas import BatchError
from kiln_platform.errors import KilnError, ModelNotFound

if TYPE_CHECKING:
    import uuid
    from collections.abc import Iterator
    from pathlib import Path

    from kiln_platform.context import Kiln

MAX_ERRORS = 100
TASKS = {"/v1/embeddings": "embeddings", "/v1/chat/completions": "generate",
         "/v1/completions": "generate", "/v1/responses": "generate",
         "/v1/messages": "generate"}  # fmt: skip


def read_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The file's non-blank lines with their 1-based numbers (one line in memory at a time)."""
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if raw.strip():
                yield n, raw


async def _usable(kiln: Kiln, tenant_id: uuid.UUID, model: str, endpoint: str, n: int) -> None:
    """Refuse line ``n`` unless ``model`` serves the tenant on ``endpoint``."""
    base, adapter = split(model)
    try:
        version = await kiln.resolver.resolve(base, str(tenant_id))
        if adapter is not None and await kiln.adapters.digest(tenant_id, version.model,
                                                              adapter) is None:  # fmt: skip
            raise ModelNotFound(f"The model `{model}` does not exist.")
    except KilnError as exc:
        raise refuse(n, exc.message, "body.model") from None
    if version.manifest.task != TASKS[endpoint]:
        raise refuse(n, f"the model `{model}` does not serve {endpoint}.", "body.model")


async def check_batch(
    kiln: Kiln, tenant_id: uuid.UUID, endpoint: str, path: Path
) -> list[BatchError]:
    """What is wrong with the batch's lines (each error names its line); empty if nothing."""
    errors: list[BatchError] = []
    model: str | None = None
    for n, raw in read_lines(path):
        try:
            item = check_line(n, raw)
            if item.url != endpoint:
                raise refuse(n, f"'url' is {item.url!r}; this batch runs {endpoint}.", "url")
            name = item.body["model"]
            if model is None:
                await _usable(kiln, tenant_id, name, endpoint, n)
                model = name
            elif name != model:
                raise refuse(n, f"'body.model' is {name!r}; every line of a batch names the "
                                f"same model ({model!r}).", "body.model")  # fmt: skip
        except KilnError as exc:
            errors.append(BatchError(code=exc.code, message=exc.message, param=exc.param, line=n))
            if len(errors) >= MAX_ERRORS:
                break
    return errors
