"""Tensor models end to end: upload through the admin API, then ``tritonclient.http`` on `/v2`
and ``tritonclient.grpc`` on the gRPC port (``KILN_GRPC_PORT``)."""

from __future__ import annotations

import queue
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from .conftest import free_port
from .pgdata import copy_migrated_pg

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.e2e.conftest import KilnProcess

UPLOAD_LIMIT = 2 << 20

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tensor_up(
    tensor_models: dict[str, Path], start_kiln: Callable[[Path, list[Path]], KilnProcess]
) -> Iterator[KilnProcess]:
    """``kiln up`` with no model; a tenant, a platform-admin key (inference too: it calls `/v2`),
    and the MLP uploaded (model writes are platform-admin only)."""
    path = Path(tempfile.mkdtemp(prefix="kiln-e2e-"))
    copy_migrated_pg(path / "pg")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KILN_MAX_UPLOAD_BYTES", str(UPLOAD_LIMIT))
        env.setenv("KILN_GRPC_PORT", str(free_port()))
        kiln = start_kiln(path, [])
    try:
        kiln.cli("tenants", "create", "acme")
        out = kiln.cli(
            "keys", "create", "--tenant", "acme", "--role", "platform-admin",
            "--scope", "inference", "--scope", "admin:write",
        )  # fmt: skip
        kiln.env["TEST_KEY"] = out.strip().splitlines()[-1]
        _wait_http(kiln)
        r = _upload(kiln, "mlp", tensor_models["mlp"].read_bytes())
        assert r.status_code == 201, r.text
        _wait_model(kiln, "mlp")
        yield kiln
    finally:
        if kiln.proc.poll() is None:
            kiln.stop()
        shutil.rmtree(path, ignore_errors=True)


def _auth(kiln: KilnProcess) -> dict[str, str]:
    return {"authorization": f"Bearer {kiln.key}"}


def _upload(kiln: KilnProcess, name: str, body: bytes, **params: str) -> httpx.Response:
    return httpx.post(
        f"{kiln.base_url}/admin/v1/models/{name}/versions",
        content=body, params=params, headers=_auth(kiln), timeout=60,
    )  # fmt: skip


def _wait_http(kiln: KilnProcess, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{kiln.base_url}/v2/health/live", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError("kiln up did not answer")


def _client(kiln: KilnProcess) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(kiln.base_url.removeprefix("http://"))


def _grpc(kiln: KilnProcess) -> triton_grpc.InferenceServerClient:
    return triton_grpc.InferenceServerClient(f"127.0.0.1:{kiln.env['KILN_GRPC_PORT']}")


def _wait_model(kiln: KilnProcess, name: str, timeout: float = 120) -> None:
    client, deadline = _client(kiln), time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.is_model_ready(name, headers=_auth(kiln)):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{name} not ready")


def _inputs(n: int, *, binary: bool) -> tuple[list[triton.InferInput], dict[str, np.ndarray]]:
    rng = np.random.default_rng(n)
    feeds = {
        "x": rng.standard_normal((n, 16)).astype(np.float32),
        "scale": rng.standard_normal((n, 1)).astype(np.float32),
    }
    inputs = []
    for name, array in feeds.items():
        tensor = triton.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    return inputs, feeds


def test_server_health_and_metadata(tensor_up: KilnProcess) -> None:
    client = _client(tensor_up)
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata(headers=_auth(tensor_up))
    assert meta["name"] == "kiln"
    assert "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("mlp", headers=_auth(tensor_up))
    assert model["versions"] == ["1"]
    assert model["inputs"] == [
        {"name": "x", "datatype": "FP32", "shape": [-1, 16]},
        {"name": "scale", "datatype": "FP32", "shape": [-1, 1]},
    ]
    assert [o["name"] for o in model["outputs"]] == ["y", "norm"]
    assert client.get_model_metadata("mlp", "1", headers=_auth(tensor_up))["name"] == "mlp"


def test_model_config_in_tritons_shape_states_the_batch_it_takes(tensor_up: KilnProcess) -> None:
    """Triton's model configuration extension: dims without the batch dimension, and a
    ``max_batch_size`` that is the most rows a request may carry (one more is refused)."""
    client = _client(tensor_up)
    assert (
        "model_configuration" in client.get_server_metadata(headers=_auth(tensor_up))["extensions"]
    )
    config = client.get_model_config("mlp", headers=_auth(tensor_up))
    assert (config["name"], config["platform"]) == ("mlp", "onnxruntime_onnx")
    assert config["input"] == [
        {"name": "x", "data_type": "TYPE_FP32", "dims": [16]},
        {"name": "scale", "data_type": "TYPE_FP32", "dims": [1]},
    ]
    assert [(o["name"], o["data_type"]) for o in config["output"]] == [
        ("y", "TYPE_FP32"), ("norm", "TYPE_FP32"),
    ]  # fmt: skip
    assert config["dynamic_batching"]["preferred_batch_size"][0] >= 1
    assert client.get_model_config("mlp", "1", headers=_auth(tensor_up)) == config
    most = config["max_batch_size"]
    inputs, _ = _inputs(most, binary=True)
    assert client.infer("mlp", inputs, headers=_auth(tensor_up)).as_numpy("y").shape[0] == most
    inputs, _ = _inputs(most + 1, binary=True)
    with pytest.raises(InferenceServerException, match="batch dimension"):
        client.infer("mlp", inputs, headers=_auth(tensor_up))


def test_the_repository_index_lists_the_tensor_models_and_their_state(
    tensor_up: KilnProcess, tensor_models: dict[str, Path]
) -> None:
    """A model no request has called yet has no worker: ``UNAVAILABLE``, saying why."""
    assert _upload(tensor_up, "idle-mlp", tensor_models["mlp"].read_bytes()).status_code == 201
    client = _client(tensor_up)
    index = client.get_model_repository_index(headers=_auth(tensor_up))
    assert {"name": "mlp", "version": "1", "state": "READY", "reason": ""} in index
    (idle,) = [m for m in index if m["name"] == "idle-mlp"]
    assert idle["state"] == "UNAVAILABLE"
    assert "scaled to zero" in idle["reason"]
    url = f"{tensor_up.base_url}/v2/repository/index"
    ready = httpx.post(url, json={"ready": True}, headers=_auth(tensor_up), timeout=10)
    assert ready.status_code == 200
    assert "mlp" in [m["name"] for m in ready.json()]
    assert "idle-mlp" not in [m["name"] for m in ready.json()]
    bad = httpx.post(url, json={"ready": "yes"}, headers=_auth(tensor_up), timeout=10)
    assert bad.status_code == 400
    assert "ready" in bad.json()["error"]


def test_statistics_count_the_tenants_own_requests_of_today(tensor_up: KilnProcess) -> None:
    """Triton's statistics extension from the ledger: this tenant's successes, rows and time per
    version; another tenant calling the same model sees only its own (none)."""
    client, auth = _client(tensor_up), _auth(tensor_up)
    assert "statistics" in client.get_server_metadata(headers=auth)["extensions"]

    def version_1(stats: Any) -> Any:
        (stat,) = [s for s in stats["model_stats"] if (s["name"], s["version"]) == ("mlp", "1")]
        return stat

    before = version_1(client.get_inference_statistics("mlp", headers=auth))
    for n in (1, 3, 4):
        client.infer("mlp", _inputs(n, binary=True)[0], headers=auth)
    after = version_1(client.get_inference_statistics("mlp", headers=auth))
    done, was = after["inference_stats"], before["inference_stats"]
    assert done["success"]["count"] - was["success"]["count"] == 3
    assert after["inference_count"] - before["inference_count"] == 8
    assert after["execution_count"] == done["success"]["count"]
    assert done["compute_infer"]["ns"] > was["compute_infer"]["ns"]
    assert done["success"]["ns"] == done["queue"]["ns"] + done["compute_infer"]["ns"]
    assert abs(after["last_inference"] / 1000 - time.time()) < 60
    assert client.get_inference_statistics("mlp", "1", headers=auth)["model_stats"] == [after]
    too_many = client.get_model_config("mlp", headers=auth)["max_batch_size"] + 1
    with pytest.raises(InferenceServerException, match="batch dimension"):
        client.infer("mlp", _inputs(too_many, binary=True)[0], headers=auth)
    deadline = time.monotonic() + 10  # a failure's row is written without waiting
    while (failed := version_1(client.get_inference_statistics("mlp", headers=auth))) == after:
        assert time.monotonic() < deadline, "the failure was not counted"
        time.sleep(0.1)
    assert failed["inference_stats"]["fail"]["count"] == was["fail"]["count"] + 1
    assert failed["inference_stats"]["success"] == done["success"]
    after = failed
    assert version_1(client.get_inference_statistics(headers=auth)) == after

    tensor_up.cli("tenants", "create", "globex")
    their_key = tensor_up.cli("keys", "create", "--tenant", "globex").strip().splitlines()[-1]
    theirs = {"authorization": f"Bearer {their_key}"}
    client.infer("mlp", _inputs(2, binary=True)[0], headers=theirs)
    their_stat = version_1(client.get_inference_statistics("mlp", headers=theirs))
    assert their_stat["inference_stats"]["success"]["count"] == 1
    assert their_stat["inference_count"] == 2
    mine = version_1(client.get_inference_statistics("mlp", headers=auth))
    assert mine["inference_stats"]["success"]["count"] == done["success"]["count"]
    with pytest.raises(InferenceServerException, match="does not exist"):
        client.get_inference_statistics("nope", headers=auth)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_matches_onnxruntime(
    tensor_up: KilnProcess, tensor_models: dict[str, Path], binary: bool
) -> None:
    session = ort.InferenceSession(str(tensor_models["mlp"]), providers=["CPUExecutionProvider"])
    client = _client(tensor_up)
    for n in (1, 5):
        inputs, feeds = _inputs(n, binary=binary)
        outputs = [triton.InferRequestedOutput(o, binary_data=binary) for o in ("y", "norm")]
        result = client.infer("mlp", inputs, outputs=outputs, headers=_auth(tensor_up))
        expected = session.run(["y", "norm"], feeds)
        for name, want in zip(("y", "norm"), expected, strict=True):
            got = result.as_numpy(name)
            assert got.shape == want.shape
            assert float(np.max(np.abs(got - want))) <= 1e-5


def test_big_requests_at_concurrency_32_wait_in_the_pool_not_429(
    tensor_up: KilnProcess, tensor_models: dict[str, Path]
) -> None:
    """Requests of 1000 rows: three in flight overflow the worker's 2048-item queue, so the pool's
    queue holds the rest until the worker has room and every one is answered."""
    session = ort.InferenceSession(str(tensor_models["mlp"]), providers=["CPUExecutionProvider"])
    client = triton.InferenceServerClient(
        tensor_up.base_url.removeprefix("http://"), concurrency=32
    )
    sent = [_inputs(1000, binary=True) for _ in range(32)]
    pending = [client.async_infer("mlp", inputs, headers=_auth(tensor_up)) for inputs, _ in sent]
    for call, (_, feeds) in zip(pending, sent, strict=True):
        got = call.get_result(timeout=60).as_numpy("y")
        assert float(np.max(np.abs(got - session.run(["y"], feeds)[0]))) <= 1e-5


def test_infer_without_outputs_returns_all_as_binary(tensor_up: KilnProcess) -> None:
    inputs, _ = _inputs(2, binary=True)
    result = _client(tensor_up).infer("mlp", inputs, headers=_auth(tensor_up))
    assert result.as_numpy("y").shape == (2, 4)
    assert result.as_numpy("norm").shape == (2, 1)


def test_oip_errors(tensor_up: KilnProcess) -> None:
    client = _client(tensor_up)
    inputs, _ = _inputs(1, binary=False)
    with pytest.raises(InferenceServerException, match="API key"):
        client.infer("mlp", inputs)
    with pytest.raises(InferenceServerException, match="does not exist"):
        client.infer("nope", inputs, headers=_auth(tensor_up))
    r = httpx.post(
        f"{tensor_up.base_url}/v2/models/mlp/infer",
        json={"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [0, 0, 0]}]},
        headers=_auth(tensor_up),
    )
    assert r.status_code == 400
    assert set(r.json()) == {"error"}
    assert r.headers["x-request-id"]


def _store_files(kiln: KilnProcess) -> set[str]:
    """The store's files, less refs and the scratch folders of engine compiles that may be
    running meanwhile (``kiln-engine-*``, the compile job of an earlier test's upload)."""
    root = Path(kiln.env["KILN_DATA_DIR"]) / "store"
    return {
        str(p.relative_to(root)) for p in root.rglob("*")
        if "refs" not in p.parts and not p.relative_to(root).parts[0].startswith("kiln-engine-")
    }  # fmt: skip


def _left(kiln: KilnProcess, before: set[str], name: str) -> set[str]:
    """What the store gained that is not another model's: a worker or compile job caching an
    engine of a served model meanwhile adds a tree (its files linked to new blobs)."""
    root = Path(kiln.env["KILN_DATA_DIR"]) / "store"
    gained = _store_files(kiln) - before
    others = {
        tree.parent.name for tree in (root / "trees").glob("*/kiln.json")
        if f"trees/{tree.parent.name}" in gained and name not in tree.read_text()
    }  # fmt: skip
    return {
        path for path in gained
        if not (path.split("/")[0] == "trees" and path.split("/")[1] in others)
        and not (path.startswith("blobs/") and (root / path).is_file()
                 and (root / path).stat().st_nlink > 1)
    }  # fmt: skip


@pytest.mark.parametrize("case", ["corrupt", "not-onnx", "outside", "oversized"])
def test_bad_uploads_are_rejected_with_nothing_left(
    tensor_up: KilnProcess, tensor_models: dict[str, Path], case: str
) -> None:
    before_files, before_models = _store_files(tensor_up), tensor_up.cli("models", "list")
    if case == "oversized":  # a valid model padded past the limit this server runs with
        body = tensor_models["mlp"].read_bytes() + b"\0" * UPLOAD_LIMIT
    else:
        body = tensor_models[case].read_bytes()
    r = _upload(tensor_up, f"bad-{case}", body)
    assert r.status_code == (413 if case == "oversized" else 400), r.text
    assert r.json()["detail"]
    assert _left(tensor_up, before_files, f"bad-{case}") == set()
    assert tensor_up.cli("models", "list") == before_models


def test_compile_job_through_the_admin_api(tensor_up: KilnProcess) -> None:
    url = f"{tensor_up.base_url}/admin/v1"
    r = httpx.post(
        f"{url}/models/mlp/versions/1/compile", json={"target": "cpu", "precision": "int8"},
        headers=_auth(tensor_up),
    )  # fmt: skip
    assert r.status_code == 202, r.text
    job = r.json()
    again = httpx.post(
        f"{url}/models/mlp/versions/1/compile", json={"target": "cpu", "precision": "int8"},
        headers=_auth(tensor_up),
    )  # fmt: skip
    assert again.json()["id"] == job["id"]  # the same compile is one job
    deadline = time.monotonic() + 60
    while job["status"] in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(0.3)
        job = httpx.get(f"{url}/compile-jobs/{job['id']}", headers=_auth(tensor_up)).json()
    assert job["status"] == "done", job
    assert job["report"]["cosine"] > 0.99
    assert job["id"] in tensor_up.cli("models", "jobs")


def test_a_blank_version_is_the_next_number(
    tensor_up: KilnProcess, tensor_models: dict[str, Path]
) -> None:
    """``version=`` left blank (a form's empty field) asks for the next number, as none."""
    r = _upload(tensor_up, "blank-version", tensor_models["mlp"].read_bytes(), version="")
    assert (r.status_code, r.json()["version"]) == (201, "1"), r.text


def test_strings_in_and_out_as_bytes_tensors(
    tensor_up: KilnProcess, tensor_models: dict[str, Path]
) -> None:
    """A graph of strings (scikit-learn's label encoders and classifiers are) takes and gives
    OIP ``BYTES``, JSON strings or Triton's length-prefixed binary, as ONNX Runtime answers;
    text that is not UTF-8 is a 400 naming the input."""
    r = _upload(tensor_up, "labels", tensor_models["labels"].read_bytes())
    assert r.status_code == 201, r.text
    _wait_model(tensor_up, "labels")
    client, auth = _client(tensor_up), _auth(tensor_up)
    meta = client.get_model_metadata("labels", headers=auth)
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [("text", "BYTES")]
    texts = np.array(["spam", "ünïcode", "nope", "ham", ""], dtype=object)
    session = ort.InferenceSession(str(tensor_models["labels"]), providers=["CPUExecutionProvider"])
    want_ids, want_names = session.run(["id", "name"], {"text": texts})
    assert want_ids.tolist() == [1, 2, -1, 0, -1]
    for binary in (False, True):
        tensor = triton.InferInput("text", [len(texts)], "BYTES")
        tensor.set_data_from_numpy(texts, binary_data=binary)
        outputs = [triton.InferRequestedOutput(o, binary_data=binary) for o in ("id", "name")]
        result = client.infer("labels", [tensor], outputs=outputs, headers=auth)
        assert result.as_numpy("id").tolist() == want_ids.tolist()
        names = [n.decode() if isinstance(n, bytes) else n for n in result.as_numpy("name")]
        assert names == want_names.tolist() == ["spam", "ünïcode", "?", "ham", "?"]
    grpc_text = triton_grpc.InferInput("text", [len(texts)], "BYTES")
    grpc_text.set_data_from_numpy(texts)
    answer = _grpc(tensor_up).infer("labels", [grpc_text], headers=_auth(tensor_up))
    assert answer.as_numpy("id").tolist() == want_ids.tolist()
    assert [n.decode() for n in answer.as_numpy("name")] == want_names.tolist()
    raw = triton.InferInput("text", [1], "BYTES")
    raw.set_data_from_numpy(np.array([b"\xff\xfe"], dtype=object), binary_data=True)
    with pytest.raises(InferenceServerException, match=r"'text'.*UTF-8"):
        client.infer("labels", [raw], headers=auth)
    assert client.is_model_ready("labels", headers=auth)


def test_grpc_serves_what_v2_serves(tensor_up: KilnProcess, tensor_models: dict[str, Path]) -> None:
    """``tritonclient.grpc`` on the gRPC port: health without a key; with one, the server's and
    the model's metadata, Triton's model configuration, repository index and statistics as
    `/v2` gives them, readiness, and inference equal to ONNX Runtime's (all outputs, or those
    asked for; streamed too), the request's id echoed and the usage billed."""
    client, auth = _grpc(tensor_up), _auth(tensor_up)
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.get_server_metadata(headers=auth).name == "kiln"
    meta = client.get_model_metadata("mlp", headers=auth, as_json=True)
    rest = _client(tensor_up).get_model_metadata("mlp", headers=auth)
    shapes = [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]]
    assert shapes == [(t["name"], t["datatype"], t["shape"]) for t in rest["inputs"]]
    assert (meta["versions"], meta["platform"]) == (["1"], rest["platform"])
    assert client.is_model_ready("mlp", headers=auth)
    config = client.get_model_config("mlp", headers=auth).config  # Triton's own message
    rest_config = _client(tensor_up).get_model_config("mlp", headers=auth)
    assert (config.name, config.platform, config.backend, config.max_batch_size) == tuple(
        rest_config[k] for k in ("name", "platform", "backend", "max_batch_size")
    )
    for tensors, rest_tensors in ((config.input, rest_config["input"]),
                                  (config.output, rest_config["output"])):  # fmt: skip
        assert [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims))
                for t in tensors] == [(t["name"], t["data_type"], t["dims"])
                                      for t in rest_tensors]  # fmt: skip
    assert (
        list(config.dynamic_batching.preferred_batch_size)
        == (rest_config["dynamic_batching"]["preferred_batch_size"])
    )
    index = client.get_model_repository_index(headers=auth, as_json=True)["models"]
    rest_index = _client(tensor_up).get_model_repository_index(headers=auth)
    assert sorted(m["name"] for m in index) == sorted(m["name"] for m in rest_index)
    session = ort.InferenceSession(str(tensor_models["mlp"]), providers=["CPUExecutionProvider"])
    for n, asked in ((1, None), (7, ["norm"])):
        feeds = {"x": np.random.default_rng(n).standard_normal((n, 16)).astype(np.float32),
                 "scale": np.full((n, 1), 2.0, np.float32)}  # fmt: skip
        inputs = []
        for name, array in feeds.items():
            inputs.append(triton_grpc.InferInput(name, list(array.shape), "FP32"))
            inputs[-1].set_data_from_numpy(array)
        outputs = asked and [triton_grpc.InferRequestedOutput(o) for o in asked]
        result = client.infer("mlp", inputs, outputs=outputs, request_id=f"r{n}", headers=auth)
        names = asked or ["y", "norm"]
        assert [o.name for o in result.get_response().outputs] == names
        assert result.get_response().id == f"r{n}"
        for name, want in zip(names, session.run(names, feeds), strict=True):
            assert float(np.max(np.abs(result.as_numpy(name) - want))) <= 1e-5
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()  # a stream: one final response each
    client.start_stream(callback=lambda result, error: got.put((result, error)), headers=auth)
    client.async_stream_infer("mlp", inputs, request_id="s1")
    client.async_stream_infer("nope", inputs, request_id="s2")
    client.stop_stream()
    (result, _), (_, error) = sorted([got.get(), got.get()], key=lambda r: r[1] is not None)
    response = result.get_response()
    assert (response.id, response.parameters["triton_final_response"].bool_param) == ("s1", True)
    assert float(np.max(np.abs(result.as_numpy("y") - session.run(["y"], feeds)[0]))) <= 1e-5
    assert "nope" in str(error)
    stats = _client(tensor_up).get_inference_statistics("mlp", headers=auth)
    assert stats["model_stats"][0]["inference_count"] >= 15  # the gRPC rows billed too
    grpc_stats = client.get_inference_statistics("mlp", headers=auth, as_json=True)
    (first,) = [m for m in grpc_stats["model_stats"] if m["version"] == "1"]
    (rest_first,) = [m for m in stats["model_stats"] if m["version"] == "1"]
    assert int(first["inference_count"]) == rest_first["inference_count"]
    success = first["inference_stats"]["success"]
    assert int(success["count"]) == rest_first["inference_stats"]["success"]["count"]
    everything = client.get_inference_statistics(headers=auth, as_json=True)["model_stats"]
    assert "mlp" in {m["name"] for m in everything}


def test_grpc_errors_are_status_codes_with_rests_messages(tensor_up: KilnProcess) -> None:
    """A missing key, an unknown model and a bad tensor answer the REST route's message under
    the gRPC code of its status; typed ``contents`` (Triton's own stub sends them) are read as
    raw data is, their count checked."""
    import grpc

    client, auth = _grpc(tensor_up), _auth(tensor_up)
    x = triton_grpc.InferInput("x", [1, 3], "FP32")
    x.set_data_from_numpy(np.zeros((1, 3), np.float32))
    refusals = [("mlp", {}, "UNAUTHENTICATED", "API key"),
                ("nope", auth, "NOT_FOUND", "does not exist"),
                ("mlp", auth, "INVALID_ARGUMENT", "'x'")]  # fmt: skip
    for model, headers, code, said in refusals:
        with pytest.raises(InferenceServerException, match=said) as refused:
            client.infer(model, [x], headers=headers)
        assert refused.value.status() == f"StatusCode.{code}"
    stub = service_pb2_grpc.GRPCInferenceServiceStub(
        grpc.insecure_channel(f"127.0.0.1:{tensor_up.env['KILN_GRPC_PORT']}")
    )
    tensor = service_pb2.ModelInferRequest.InferInputTensor

    def typed(scale: list[float]) -> service_pb2.ModelInferRequest:
        return service_pb2.ModelInferRequest(model_name="mlp", inputs=[
            tensor(name="x", datatype="FP32", shape=[1, 16],
                   contents=service_pb2.InferTensorContents(fp32_contents=[0.5] * 16)),
            tensor(name="scale", datatype="FP32", shape=[1, 1],
                   contents=service_pb2.InferTensorContents(fp32_contents=scale)),
        ])  # fmt: skip

    metadata = tuple(auth.items())
    reply, call = stub.ModelInfer.with_call(typed([1.0]), metadata=metadata)
    assert [o.name for o in reply.outputs] == ["y", "norm"]
    assert len(reply.raw_output_contents[0]) == 4 * 4  # y: 1 x 4 FP32
    assert dict(call.trailing_metadata())["x-request-id"].startswith("req_")
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(typed([1.0, 2.0]), metadata=metadata)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "contents.fp32_contents" in (refused.value.details() or "")
    with pytest.raises(grpc.RpcError) as refused:  # a stream without a key ends at once
        list(stub.ModelStreamInfer(iter([typed([1.0])])))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    (streamed,) = stub.ModelStreamInfer(iter([typed([1.0])]), metadata=metadata)
    assert ([o.name for o in streamed.infer_response.outputs], streamed.error_message) == (
        ["y", "norm"], "")  # fmt: skip
