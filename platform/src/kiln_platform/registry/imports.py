"""Bring your own model: tell a source to build from a tensor model, store it, queue its build.

An upload (or a CLI path) is a Hugging Face folder, a prebuilt ONNX Runtime GenAI folder (both
as .zip/.tar, or a folder from the CLI), a single .gguf file, or an ONNX tensor model. Tensor
models keep the upload path (``registry.upload``: validated, registered at once). Anything else
is detected by ``python -m kiln_runtimes.build --detect`` (a subprocess: the build library stays
out of the control plane), stored content-addressed as the version's *source*, and built by a
build job (``compiler.builds``) that registers the version when it succeeds. A source the
detection refuses is a 400 naming the file and field, before anything is stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sys
import tarfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec
from sqlalchemy import func, select

from kiln_platform.admin.authz import require
from kiln_platform.audit.services import record
from kiln_platform.db.tables import CompileJob, ModelVersion
from kiln_platform.errors import BadRequest
from kiln_platform.registry import validation
from kiln_platform.registry.engine import EngineSettings
from kiln_platform.registry.numbering import UNFINISHED, claim_name, free_version
from kiln_platform.registry.upload import check_names
from kiln_runtimes.protocol import GENERATE_PRECISION, BuildFailure

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from kiln_platform.admin.authz import Actor
    from kiln_runtimes.store import ArtifactStore

GGUF_MAGIC = b"GGUF"
SOURCE_FILE = "model.gguf"
"""A single-file GGUF source is stored as a tree holding this one file."""
BUILD_TARGETS = ("cpu", "cuda")
BUILD_PRECISIONS = ("int4", "int8", "fp16", "fp32")


class Detected(msgspec.Struct, frozen=True, kw_only=True):
    """What ``--detect`` printed (``kiln_runtimes.build.Source``)."""

    kind: Literal["hf", "gguf", "genai", "tensor"]
    path: str
    task: Literal["generate", "embeddings", "tensor"]
    architecture: str | None = None


@dataclass(frozen=True, slots=True)
class ImportOptions:
    """What an import asks for; unset fields are the build's defaults."""

    task: str | None = None
    precision: str | None = None
    target: str | None = None
    version: str | None = None
    engine: EngineSettings = field(default_factory=EngineSettings)
    """Serving settings of the version (max batch size, max context, adapter slots)."""


@dataclass(frozen=True, slots=True)
class Staged:
    """An upload made ready: the folder (or file) to treat as the model, and which path it takes."""

    root: Path
    kind: Literal["tensor", "build"]


def stage(source: Path, scratch: Path, max_bytes: int, task: str | None) -> Staged:
    """Unpack an archive, wrap a .gguf, and say whether ``source`` is a tensor model (blocking)."""
    if task == "tensor":
        return Staged(source, "tensor")
    root = source
    if source.is_file():
        with source.open("rb") as f:
            head = f.read(4)
        if head == GGUF_MAGIC:
            folder = scratch / "source"
            folder.mkdir(parents=True)
            _link_or_copy(source, folder / SOURCE_FILE)
            return Staged(folder, "build")
        if head != b"PK\x03\x04" and not tarfile.is_tarfile(source):
            return Staged(source, "tensor")  # a bare .onnx file
        validation.unpack(source, scratch / "source", max_bytes)
        root = _single_folder(scratch / "source")
    if is_build_source(root):
        return Staged(root, "build")
    return Staged(root, "tensor")


def is_build_source(folder: Path) -> bool:
    """A Hugging Face or GenAI folder, or a folder holding one .gguf file."""
    if (folder / "config.json").is_file() or (folder / "genai_config.json").is_file():
        return True
    return len(list(folder.glob("*.gguf"))) == 1 and not any(folder.glob("*.onnx"))


def build_input(tree: Path) -> Path:
    """What a stored source hands the build: its folder, or the one .gguf in it."""
    if (tree / "config.json").is_file() or (tree / "genai_config.json").is_file():
        return tree
    ggufs = sorted(tree.glob("*.gguf"))
    return ggufs[0] if len(ggufs) == 1 else tree


def _single_folder(folder: Path) -> Path:
    """An archive of ``model/...`` (tar of a folder) is that folder."""
    entries = list(folder.iterdir())
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return folder


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


async def detect(source: Path, task: str | None, env: dict[str, str]) -> Detected:
    """``python -m kiln_runtimes.build SOURCE --detect``; ``BadRequest`` naming file and field."""
    cmd = [sys.executable, "-m", "kiln_runtimes.build", str(source), "--detect"]
    cmd += ["--task", task] if task else []
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    out, err = await proc.communicate()
    lines = out.decode(errors="replace").strip().splitlines()
    if proc.returncode == 0 and lines:
        return msgspec.json.decode(lines[-1], type=Detected)
    if lines:
        with_failure = msgspec.json.decode(lines[-1], type=BuildFailure)
        raise bad_source(with_failure)
    raise BadRequest(f"cannot read the source: {err.decode(errors='replace')[-500:]}")


def bad_source(failure: BuildFailure) -> BadRequest:
    """A 400 that names the file and the field at fault."""
    where = ", ".join(
        f"{k} {v}" for k, v in (("file", failure.file), ("field", failure.field)) if v
    )
    message = f"{failure.error} ({where})" if where else failure.error
    return BadRequest(message, param=failure.field or failure.file)


def check_options(options: ImportOptions) -> None:
    """Refuse what no build makes, before anything is stored."""
    if options.task not in (None, "generate", "embeddings"):
        raise BadRequest(
            f"task must be generate or embeddings for a source to build, not {options.task!r} "
            "(an ONNX tensor model is uploaded as it is)",
            param="task",
        )
    if options.precision not in (None, *BUILD_PRECISIONS):
        raise BadRequest(
            f"precision must be one of {', '.join(BUILD_PRECISIONS)}", param="precision"
        )
    if options.target not in (None, *BUILD_TARGETS):
        raise BadRequest(
            f"builds target {' or '.join(BUILD_TARGETS)} (tensorrt engines are for tensor models)",
            param="target",
        )


def check_scoring(options: ImportOptions, task: str) -> None:
    """``score_prompts`` is a generation build's: a 400 naming it for any other model."""
    if options.engine.score_prompts and task != "generate":
        raise BadRequest(f"score_prompts is for generation models; this one is {task}",
                         param="score_prompts")  # fmt: skip


async def start_import(
    sessions: async_sessionmaker[AsyncSession],
    store: ArtifactStore,
    name: str,
    staged: Staged,
    options: ImportOptions,
    *,
    actor: Actor,
    env: dict[str, str],
) -> uuid.UUID:
    """Detect, store the source and queue its build job (platform-admin; audited as
    ``model.import``); returns the job's id. Nothing is stored when this raises."""
    require(actor, "models", write=True)
    check_names(name, options.version)
    check_options(options)
    found = await detect(build_input(staged.root), options.task, env)
    check_scoring(options, found.task)
    if found.task == "tensor":
        raise BadRequest("an ONNX tensor model needs no build: upload it as it is", param="task")
    async with sessions() as session:  # a taken version fails before the source is stored
        await free_version(session, name, found.task, options.version)
    source_digest = await asyncio.to_thread(store.put_dir, staged.root)
    precision = options.precision or (GENERATE_PRECISION if found.task == "generate" else "fp32")
    target = options.target or "cpu"
    engine = msgspec.structs.replace(options.engine, target=target, precision=precision)
    job_id = uuid.uuid4()
    try:
        await _queue(sessions, actor, job_id, name, options.version, found, source_digest, engine)
    except BaseException:
        async with sessions() as session:
            if not await source_in_use(session, source_digest, job_id):
                await asyncio.to_thread(store.remove_tree, source_digest)
        raise
    return job_id


async def _queue(  # noqa: PLR0917 (the job's row)
    sessions: async_sessionmaker[AsyncSession], actor: Actor, job_id: uuid.UUID, name: str,
    asked: str | None, found: Detected, source_digest: str, engine: EngineSettings,
) -> None:  # fmt: skip
    target, precision = engine.target or "cpu", engine.precision or "fp32"
    async with sessions.begin() as session:
        await claim_name(session, name)  # checked again, now that no one else may claim it
        version = await free_version(session, name, found.task, asked)
        session.add(
            CompileJob(
                id=job_id, kind="build", model_version_id=None,
                cache_key="sha256:" + hashlib.sha256(f"build:{job_id}".encode()).hexdigest(),
                target=target, precision=precision, hardware="", status="queued",
                model_name=name, version_name=version, task=found.task,
                source_digest=source_digest, engine_settings=msgspec.to_builtins(engine),
                phase="received", percent=0,
            )
        )  # fmt: skip
        await session.flush()
        await record(session, actor, "model.import", "compile-job", job_id, None,
                     after={"model": name, "version": version, "task": found.task,
                            "source_kind": found.kind, "source_digest": source_digest,
                            "target": target, "precision": precision})  # fmt: skip


async def source_in_use(session: AsyncSession, digest: str, besides: uuid.UUID) -> bool:
    """Whether a version or another unfinished build still needs the source tree ``digest``."""
    versions = await session.scalar(
        select(func.count()).select_from(ModelVersion).where(ModelVersion.source_digest == digest)
    )
    jobs = await session.scalar(
        select(func.count())
        .select_from(CompileJob)
        .where(
            CompileJob.source_digest == digest,
            CompileJob.id != besides,
            CompileJob.status.in_(UNFINISHED),
        )
    )
    return bool(versions or jobs)
