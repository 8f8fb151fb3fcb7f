"""Model upload validation and compile jobs against a real PostgreSQL and a real store."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, select

from kiln_platform.admin.authz import Actor, Role
from kiln_platform.compiler import services as jobs
from kiln_platform.compiler.runner import CompileRunner
from kiln_platform.db.database import Database, open_database
from kiln_platform.db.tables import CompileJob, Model, ModelVersion
from kiln_platform.errors import BadRequest, Conflict, NotFound
from kiln_platform.registry.imports import ImportOptions, Staged, start_import
from kiln_platform.registry.upload import Uploaded, upload_version
from kiln_platform.settings import Settings
from kiln_runtimes.store import ArtifactStore

LIMIT = 1 << 20
CLI = Actor("cli:test", Role.PLATFORM_ADMIN, None)


@pytest.fixture(scope="module")
def settings(database_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        max_upload_bytes=LIMIT, worker_threads=1,
    )  # fmt: skip


@pytest.fixture(scope="module")
async def db(settings: Settings) -> AsyncIterator[Database]:
    async with open_database(settings) as database:
        yield database


async def counts(db: Database, settings: Settings) -> tuple[int, int, int]:
    async with db.sessions() as session:
        models = await session.scalar(select(func.count()).select_from(Model))
        versions = await session.scalar(select(func.count()).select_from(ModelVersion))
    blobs = settings.store_dir / "blobs"
    files = sum(1 for p in blobs.rglob("*") if p.is_file()) if blobs.exists() else 0
    return int(models or 0), int(versions or 0), files


async def upload(
    db: Database, settings: Settings, name: str, path: Path, version: str | None = None
) -> Uploaded:
    store = ArtifactStore(settings.store_dir)
    return await upload_version(
        db.sessions, store, settings, name, path, actor=CLI, version=version
    )


async def test_upload_records_specs_and_numbers_versions(
    db: Database, settings: Settings, tensor_models: dict[str, Path]
) -> None:
    first = await upload(db, settings, "mlp", tensor_models["mlp"])
    second = await upload(db, settings, "mlp", tensor_models["mlp"])
    assert (first.version, second.version) == ("1", "2")
    assert first.artifact_digest == second.artifact_digest  # content-addressed
    manifest = first.manifest
    assert manifest.task == "tensor"
    assert manifest.batching
    assert [(s.name, s.datatype, s.shape) for s in manifest.inputs] == [
        ("x", "FP32", [-1, 16]), ("scale", "FP32", [-1, 1]),
    ]  # fmt: skip
    assert manifest.inputs[0].dim_names == ["batch", None]
    with pytest.raises(Conflict):
        await upload(db, settings, "mlp", tensor_models["mlp"], version="2")


async def test_concurrent_uploads_each_get_a_version_and_one_wins_a_named_one(
    db: Database, settings: Settings, tensor_models: dict[str, Path]
) -> None:
    """Version numbers are picked under the model name's lock: four uploads at once without a
    version get four numbers (three were 409s); four naming one version, one 201."""
    made = await asyncio.gather(
        *[upload(db, settings, "racer", tensor_models["mlp"]) for _ in "abcd"]
    )
    assert sorted(u.version for u in made) == ["1", "2", "3", "4"]
    named = await asyncio.gather(
        *[upload(db, settings, "racer", tensor_models["mlp"], version="v9") for _ in "abcd"],
        return_exceptions=True,
    )  # fmt: skip
    assert sum(isinstance(u, Uploaded) for u in named) == 1
    assert sum(isinstance(u, Conflict) for u in named) == 3


@pytest.mark.parametrize("kind", ["external", "external-tar", "external-zip"])
async def test_external_data_inside_the_artifact_is_accepted(
    db: Database, settings: Settings, tensor_models: dict[str, Path], kind: str
) -> None:
    done = await upload(db, settings, f"ext-{kind}", tensor_models[kind])
    folder = ArtifactStore(settings.store_dir).path(done.artifact_digest)
    assert (folder / "weights.bin").is_file()
    assert (folder / "model.onnx").is_file()


@pytest.mark.parametrize(
    "expected",
    [
        ("corrupt", "not a valid ONNX model"),
        ("not-onnx", "not a valid ONNX model"),
        ("outside", "outside the model folder"),
        ("traversal", "unsafe path"),
        ("oversized", "limit"),
    ],
)
async def test_bad_uploads_leave_no_rows_and_no_blobs(
    db: Database, settings: Settings, tensor_models: dict[str, Path], tmp_path: Path,
    expected: tuple[str, str],
) -> None:  # fmt: skip
    case, message = expected
    if case == "oversized":
        path = tmp_path / "big.onnx"
        path.write_bytes(tensor_models["mlp"].read_bytes() + b"\0" * LIMIT)
    else:
        path = tensor_models[case]
    before = await counts(db, settings)
    with pytest.raises(BadRequest, match=message):
        await upload(db, settings, f"bad-{case}", path)
    assert await counts(db, settings) == before
    assert not any((settings.data_dir / "tmp").iterdir())


async def test_opset_outside_the_range_is_rejected(
    db: Database, settings: Settings, tensor_models: dict[str, Path]
) -> None:
    narrow = settings.model_copy(update={"max_opset": 13})
    with pytest.raises(BadRequest, match=r"opset 17 is outside the supported range 7\.\.13"):
        await upload(db, narrow, "old-runtime", tensor_models["mlp"])


async def test_compile_jobs_are_unique_claimed_once_and_report(
    db: Database, settings: Settings, tensor_models: dict[str, Path]
) -> None:
    await upload(db, settings, "compiled", tensor_models["mlp"], version="1")
    async with db.sessions.begin() as session:
        job = await jobs.enqueue(session, CLI, "compiled", "1", "cpu", "int8")
    async with db.sessions.begin() as session:
        again = await jobs.enqueue(session, CLI, "compiled", "1", "cpu", "int8")
    assert again.id == job.id
    async with db.sessions() as session:
        rows = await session.scalar(select(func.count()).select_from(CompileJob))
    assert rows == 1

    # Two claimers at once: SKIP LOCKED hands the job to exactly one of them.
    async def claim() -> jobs.ClaimedJob | None:
        async with db.sessions.begin() as session:
            return await jobs.claim(session, job.id)

    claimed = await asyncio.gather(claim(), claim())
    assert sum(c is not None for c in claimed) == 1
    async with db.sessions.begin() as session:
        await jobs.requeue(session, job.id)

    assert await CompileRunner(db, settings).run_once(job.id)
    async with db.sessions() as session:
        view = await jobs.view(session, CLI, job.id)
    assert view.status == "done", view.reason
    assert view.report is not None
    assert view.report["precision"] == "int8"
    assert 0.99 < view.report["cosine"] <= 1.0 + 1e-9
    assert view.report["max_abs_diff"] < 1.0
    assert ArtifactStore(settings.store_dir).has(str(view.engine_digest))


async def test_compile_of_an_unavailable_target_fails_with_the_reason(
    db: Database, settings: Settings, tensor_models: dict[str, Path]
) -> None:
    import onnxruntime as ort

    if "TensorrtExecutionProvider" in ort.get_available_providers():
        pytest.skip("TensorRT is available here")
    await upload(db, settings, "gpu-wanted", tensor_models["mlp"], version="1")
    async with db.sessions.begin() as session:
        job = await jobs.enqueue(session, CLI, "gpu-wanted", "1", "tensorrt", "fp16")
    assert await CompileRunner(db, settings).run_once(job.id)
    async with db.sessions() as session:
        view = await jobs.view(session, CLI, job.id)
    assert view.status == "failed"
    assert "TensorrtExecutionProvider" in (view.reason or "")


async def test_compile_requests_are_checked(db: Database, settings: Settings) -> None:
    async with db.sessions.begin() as session:
        with pytest.raises(NotFound):
            await jobs.enqueue(session, CLI, "nope", "1", "cpu", "fp32")
        with pytest.raises(BadRequest, match="precision"):
            await jobs.enqueue(session, CLI, "compiled", "1", "cpu", "fp16")


async def test_a_job_left_running_by_a_dead_runner_is_requeued(
    db: Database, settings: Settings, tensor_models: dict[str, Path]
) -> None:
    await upload(db, settings, "orphaned", tensor_models["mlp"], version="1")
    async with db.sessions.begin() as session:
        dead = await jobs.enqueue(session, CLI, "orphaned", "1", "cpu", "fp32")
        live = await jobs.enqueue(session, CLI, "orphaned", "1", "cpu", "int8")
    # A runner that died: its job is running, but no connection holds the job's lock.
    async with db.sessions.begin() as session:
        assert await jobs.claim(session, dead.id) is not None
    # A live runner: the claim's connection holds the lock while it "compiles".
    async with db.engine.connect() as holder:
        async with holder.begin():
            assert await jobs.claim(holder, live.id, hold=True) is not None
        runner = CompileRunner(db, settings)
        await runner.recover()
        async with db.sessions() as session:
            assert (await jobs.view(session, CLI, dead.id)).status == "queued"
            assert (await jobs.view(session, CLI, live.id)).status == "running"
        await holder.invalidate()  # the live runner dies too: its connection closes
    await runner.recover()
    async with db.sessions() as session:
        assert (await jobs.view(session, CLI, live.id)).status == "queued"
    assert await runner.run_once(dead.id)
    async with db.sessions() as session:
        assert (await jobs.view(session, CLI, dead.id)).status == "done"


async def test_the_compile_subprocess_gets_no_gateway_secret(
    db: Database,
    settings: Settings,
    tensor_models: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The compiler reports its own environment (a ``sitecustomize`` on its PYTHONPATH, which
    it keeps): the server secret and the database URL are not in it."""
    dump = tmp_path / "environ.json"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        f"import json, os\nopen({str(dump)!r}, 'w').write(json.dumps(dict(os.environ)))\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(hook))
    monkeypatch.setenv("KILN_SECRET_KEY", "server-secret-not-for-compilers")
    monkeypatch.setenv("KILN_DATABASE_URL", settings.database_url or "postgresql://x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-compilers")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    await upload(db, settings, "env-checked", tensor_models["mlp"], version="1")
    async with db.sessions.begin() as session:
        job = await jobs.enqueue(session, CLI, "env-checked", "1", "cpu", "fp32")
    assert await CompileRunner(db, settings).run_once(job.id)
    async with db.sessions() as session:
        assert (await jobs.view(session, CLI, job.id)).status == "done"
    seen = json.loads(dump.read_text())
    assert not [k for k in seen if k.startswith("KILN_") or k.startswith("AWS_")]
    assert not [k for k, v in seen.items() if "not-for-compilers" in v]
    assert (seen["PYTHONPATH"], seen["OMP_NUM_THREADS"]) == (str(hook), "1")


async def test_concurrent_imports_each_queue_their_own_version(
    db: Database, settings: Settings, tiny_models: Any, tmp_path: Path
) -> None:
    """Builds take their version when queued, under the name's lock (``numbering``): three
    imports at once without a version queue three numbers, and naming a version a queued build
    holds is a 409 before any build. (Their detection subprocesses end apart, so this rarely
    raced before; the upload test above races the same lock every time.)"""
    folder = tiny_models.causal(tmp_path / "llama", "llama", seed=1)
    store, env = ArtifactStore(settings.store_dir), dict(os.environ)

    def start(version: str | None = None) -> Any:
        return start_import(db.sessions, store, "importer", Staged(folder, "build"),
                            ImportOptions(version=version), actor=CLI, env=env)  # fmt: skip

    ids = await asyncio.gather(start(), start(), start())
    try:
        async with db.sessions() as session:
            queued = await session.scalars(
                select(CompileJob.version_name).where(CompileJob.id.in_(ids))
            )
            assert sorted(v or "" for v in queued) == ["1", "2", "3"]
        with pytest.raises(Conflict, match="being built"):
            await start("2")
    finally:  # no runner here builds them; none is left for another test to claim
        async with db.sessions.begin() as session:
            await session.execute(delete(CompileJob).where(CompileJob.id.in_(ids)))
