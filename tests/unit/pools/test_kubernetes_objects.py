"""The ``kubernetes`` backend's pure parts: the rendered Deployment validates strictly against the
cluster's Kubernetes version and puts workers where ``terraform/kubernetes/pool/worker.yaml``
does (``tests/deploy`` checks that template against the node groups: compared here, not
repeated); pods read as the backend needs them."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import SecretStr

from kiln_platform.pools import _kube_objects as objects
from kiln_platform.pools.backend import PoolSpec, worker_arguments
from kiln_platform.settings import Settings
from kiln_runtimes.worker import parse_args

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE = yaml.safe_load((ROOT / "terraform/kubernetes/pool/worker.yaml").read_text())
SPEC = PoolSpec("resnet50", "1", Path("/data/store/trees/abc"))


def _version() -> str:
    """The Kubernetes version ``tests/deploy`` validates against (its ``tf_default``)."""
    spec = importlib.util.spec_from_file_location(
        "deploy_manifests", ROOT / "tests/deploy/test_manifests.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return f"{module.tf_default('kubernetes_version')}.0"


VERSION = _version()
WORKER_SECRET = "kube-objects-test-worker-secret"


def settings(**changes: Any) -> Settings:
    base: dict[str, Any] = {
        "data_dir": Path("/data"),
        "pool_backend": "kubernetes",
        "worker_image": "kiln/w:1",
        "kubernetes_store_claim": "kiln-store",
        "worker_secret": SecretStr(WORKER_SECRET),
    }
    return Settings(**(base | changes))


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = doc["spec"]["template"]["spec"]
    return found


@pytest.mark.parametrize("target", ["cpu", "tensorrt"])
def test_rendered_deployment_validates_strictly(target: str) -> None:
    doc = objects.deployment(SPEC, settings(worker_target=target), 2)
    kubernetes_validate.validate(doc, VERSION, strict=True)
    broken = objects.deployment(SPEC, settings(worker_target=target), 2)
    pod_spec(broken)["containers"][0]["readinessprobe"] = {}  # strict: a typo fails
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)


def test_gpu_pool_is_placed_like_the_terraform_template() -> None:
    doc = objects.deployment(SPEC, settings(worker_target="tensorrt", worker_precision="fp16"), 0)
    ours, theirs = pod_spec(doc), pod_spec(TEMPLATE)
    for key in ("nodeSelector", "tolerations", "securityContext", "serviceAccountName",
                "automountServiceAccountToken", "terminationGracePeriodSeconds"):  # fmt: skip
        assert ours[key] == theirs[key], key
    mine, template = ours["containers"][0], theirs["containers"][0]
    for key in ("ports", "securityContext", "livenessProbe", "readinessProbe"):
        assert mine[key] == template[key], key
    assert mine["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert doc["metadata"]["name"] == TEMPLATE["metadata"]["name"]
    assert doc["metadata"]["namespace"] == TEMPLATE["metadata"]["namespace"]
    for key in ("kiln.dev/model", "kiln.dev/version", "app.kubernetes.io/component"):
        assert (
            doc["spec"]["template"]["metadata"]["labels"][key]
            == (TEMPLATE["spec"]["template"]["metadata"]["labels"][key])
        )
    ours_argv, theirs_argv = parse_args(mine["command"][3:]), parse_args(template["command"][3:])
    for flag in ("host", "port", "model", "version", "target", "precision"):
        assert getattr(ours_argv, flag) == getattr(theirs_argv, flag), flag


def test_cpu_pool_runs_on_the_cpu_nodes_without_a_gpu() -> None:
    pod = pod_spec(objects.deployment(SPEC, settings(worker_target="cpu"), 1))
    assert pod["nodeSelector"] == {objects.NODE_CLASS_LABEL: "cpu"}
    assert "tolerations" not in pod
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["limits"]


def test_command_is_the_local_backends_on_all_interfaces_and_the_store_is_mounted() -> None:
    s = settings(worker_threads=3, worker_adapter_slots=2)
    container = pod_spec(objects.deployment(SPEC, s, 1))["containers"][0]
    assert container["command"][:3] == ["python", "-m", "kiln_runtimes"]
    assert container["command"][3:] == [
        *worker_arguments(SPEC, s, 9000, host="0.0.0.0"), "--metrics-port", "9090"  # noqa: S104
    ]  # fmt: skip
    parsed = parse_args(container["command"][3:])
    assert (parsed.host, parsed.port, parsed.threads) == ("0.0.0.0", 9000, 3)  # noqa: S104
    # the model folder is the gateway's path, on the shared store volume
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "store"]
    assert SPEC.model_dir.is_relative_to(mount["mountPath"])
    assert mount["readOnly"]
    [volume] = [
        v for v in pod_spec(objects.deployment(SPEC, s, 1))["volumes"] if v["name"] == "store"
    ]
    assert volume["persistentVolumeClaim"]["claimName"] == "kiln-store"


def test_the_worker_secret_comes_from_a_secret_never_the_command_line() -> None:
    doc = objects.deployment(SPEC, settings(kubernetes_worker_secret="pool-auth"), 1)
    container = pod_spec(doc)["containers"][0]
    assert not any(WORKER_SECRET in part for part in json.dumps(doc).split('"'))
    assert container["env"] == [{"name": "KILN_WORKER_SECRET", "valueFrom": {
        "secretKeyRef": {"name": "pool-auth", "key": "secret"}}}]  # fmt: skip
    # the kubelet's probes use the routes that need no secret
    paths = {container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")}
    assert paths == {"/livez", "/readyz"}
    assert parse_args(container["command"][3:]).metrics_port == 9090
    template = doc["spec"]["template"]["metadata"]["annotations"]
    assert template["prometheus.io/port"] == "9090"


def test_kubernetes_backend_needs_an_image_and_a_store_claim() -> None:
    with pytest.raises(
        ValueError,
        match="KILN_WORKER_IMAGE, KILN_WORKER_SECRET, KILN_KUBERNETES_STORE_CLAIM or KILN_ARTIFACT",
    ):
        Settings(pool_backend="kubernetes")


def test_with_an_s3_store_the_worker_materializes_into_its_own_cache() -> None:
    s = settings(kubernetes_store_claim=None, artifact_store="s3://bucket/kiln",
                 artifact_cache_max_bytes=5_000)  # fmt: skip
    doc = objects.deployment(SPEC, s, 1)
    kubernetes_validate.validate(doc, VERSION, strict=True)
    container = pod_spec(doc)["containers"][0]
    assert {"name": "KILN_ARTIFACT_STORE", "value": "s3://bucket/kiln"} in container["env"]
    assert {"name": "KILN_ARTIFACT_CACHE_MAX_BYTES", "value": "5000"} in container["env"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "store"]
    assert SPEC.model_dir.is_relative_to(mount["mountPath"])
    assert not mount["readOnly"]  # the worker writes the tree it fetches
    [volume] = [v for v in pod_spec(doc)["volumes"] if v["name"] == "store"]
    assert volume == {"name": "store", "emptyDir": {}}


@pytest.mark.parametrize(
    ("model", "version"),
    [("bert.base_v2", "2024.01"), ("m" * 200, "V" * 64), ("bert-base", "1"), ("bert.base", "1")],
)
def test_any_registrable_name_gives_valid_distinct_names_and_labels(
    model: str, version: str
) -> None:
    spec = PoolSpec(model, version, Path("/data/store/trees/x"))
    doc = objects.deployment(spec, settings(), 1)
    kubernetes_validate.validate(doc, VERSION, strict=True)
    name = doc["metadata"]["name"]
    assert re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", name)
    assert len(name) <= 57
    labels = doc["spec"]["template"]["metadata"]["labels"]
    assert all(re.fullmatch(r"([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)?", v) and len(v) <= 63
               for v in labels.values())  # fmt: skip
    # the API server requires the selector to select the template (no schema checks it)
    assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()
    annotations = doc["metadata"]["annotations"]
    assert annotations.pop(objects.TEMPLATE_ANNOTATION)
    assert annotations == {"kiln.dev/model": model, "kiln.dev/version": version}


def test_names_that_clean_alike_stay_apart() -> None:
    a, b = PoolSpec("bert.base", "1", Path()), PoolSpec("bert-base", "1", Path())
    assert objects.deployment_name(a) != objects.deployment_name(b)


def _pod(name: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"podIP": "10.0.0.1", **status}}  # fmt: skip


def test_pod_state() -> None:
    ready = objects.pod_state(_pod("a", conditions=[{"type": "Ready", "status": "True"}]))
    assert (ready.ready, ready.ip, ready.crashed, ready.terminating) == (
        True,
        "10.0.0.1",
        False,
        False,
    )
    assert ready.created_at == 1767225600.0
    looping = objects.pod_state(_pod("b", containerStatuses=[
        {"restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]))  # fmt: skip
    assert (looping.ready, looping.crashed, looping.restarts) == (False, True, 4)
    assert objects.pod_state(_pod("c", phase="Failed")).crashed
    assert not objects.pod_state(_pod("d", containerStatuses=[
        {"state": {"waiting": {"reason": "ContainerCreating"}}}])).crashed  # fmt: skip
    pending = objects.pod_state({"metadata": {"name": "e", "deletionTimestamp": "x"}, "status": {}})
    assert (pending.ip, pending.terminating) == (None, True)


def test_keep_prefers_ready_then_oldest_and_drops_terminating() -> None:
    def state(name: str, ready: bool, at: float, gone: bool = False) -> objects.PodState:
        return objects.PodState(name, "10.0.0.1", ready, False, 0, at, gone)

    pods = [state("new", True, 3), state("starting", False, 1), state("old", True, 2),
            state("leaving", True, 0, gone=True)]  # fmt: skip
    assert [p.name for p in objects.keep(pods, 4)] == ["old", "new", "starting"]
    assert [p.name for p in objects.keep(pods, 2)] == ["old", "new"]
    assert objects.keep(pods, 0) == []


def test_adoption_changes_only_replicas_while_the_template_is_the_same() -> None:
    """A new leader adopting a previous one's Deployment: no rollout for a hand-over (replicas
    only, or nothing), a rolling update once the template changed (another image)."""
    found = objects.deployment(SPEC, settings(), 2)
    assert objects.adoption(found, objects.deployment(SPEC, settings(), 2)) is None
    assert objects.adoption(found, objects.deployment(SPEC, settings(), 3)) == {
        "spec": {"replicas": 3}
    }
    upgraded = objects.deployment(SPEC, settings(worker_image="kiln/w:2"), 2)
    assert objects.adoption(found, upgraded) == upgraded
    key = objects.TEMPLATE_ANNOTATION
    assert found["metadata"]["annotations"][key] != upgraded["metadata"]["annotations"][key]
    assert key not in found["spec"]["template"]["metadata"]["annotations"]  # no rollout by it


def test_orphans_are_the_deployments_no_pool_wants_once_past_the_grace() -> None:
    """A new leader, the registry read: what it wants stays whatever its age; what it does not
    want goes once old enough (younger may be a pool the previous leader just made)."""

    def made(at: str | None) -> dict[str, Any]:
        return {"metadata": {"creationTimestamp": at} if at else {}}

    now = 1_767_225_660.0  # 2026-01-01T00:01:00Z
    found = {
        "kiln-pool-wanted-1": made("2025-06-01T00:00:00Z"),
        "kiln-pool-retired-1": made("2025-06-01T00:00:00Z"),
        "kiln-pool-at-grace-1": made("2026-01-01T00:00:00Z"),
        "kiln-pool-young-1": made("2026-01-01T00:00:01Z"),
        "kiln-pool-undated-1": made(None),
    }
    assert objects.orphans({"kiln-pool-wanted-1"}, found, now, 60.0) == [
        "kiln-pool-at-grace-1",
        "kiln-pool-retired-1",
    ]
    assert objects.orphans({"kiln-pool-wanted-1"}, found, now + 1, 60.0) == [
        "kiln-pool-at-grace-1",
        "kiln-pool-retired-1",
        "kiln-pool-young-1",
    ]
    assert objects.orphans(set(found), found, now + 3600, 60.0) == []
    assert objects.orphans(set(), {}, now, 0.0) == []
