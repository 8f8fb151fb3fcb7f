"""A runtime pool's KEDA ScaledObject: a CRD kubernetes-validate has no schema for, so its
structure is checked here, and its Prometheus query must select the replicas metric the control
plane exports (``kiln_platform.pools.metrics``): a renamed metric or label fails this test."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kiln_platform.pools.backend import PoolSize, PoolSpec
from kiln_platform.pools.metrics import SchedulerCollector

TERRAFORM = Path(__file__).resolve().parents[2] / "terraform"
POOL = "kiln-pool-resnet50-1"
QUERY = re.compile(r"^max\((?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\}\)$")


def _query_of(scaled: dict[str, Any]) -> tuple[str, dict[str, str]]:
    [trigger] = scaled["spec"]["triggers"]
    match = QUERY.match(trigger["metadata"]["query"])
    assert match, trigger["metadata"]["query"]
    labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
    return match["name"], labels


def test_scaled_object_structure(resources: dict[Any, Any]) -> None:
    scaled = resources["ScaledObject", POOL]
    deployment = resources["Deployment", POOL]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": POOL}
    assert spec["minReplicaCount"] == 0  # pools scale to zero
    gateway = resources["ConfigMap", "kiln-gateway"]["data"]
    assert spec["maxReplicaCount"] >= int(gateway["KILN_POOL_MAX_REPLICAS"])
    assert int(gateway["KILN_POOL_MIN_REPLICAS"]) == spec["minReplicaCount"]
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus"
    # AverageValue with threshold 1: replicas = the metric's value (Value would multiply it).
    assert trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert meta["serverAddress"].startswith("http")
    assert (meta["threshold"], meta["activationThreshold"]) == ("1", "0")
    assert set(meta) <= {"serverAddress", "query", "threshold", "activationThreshold"}


def test_query_selects_the_desired_replicas_the_platform_exports(
    resources: dict[Any, Any],
) -> None:
    name, labels = _query_of(resources["ScaledObject", POOL])
    size = PoolSize(PoolSpec(labels["model"], labels["version"], Path()), 3, 1, 1)
    pools = SimpleNamespace(runners={}, backend=None, sizes=lambda: {"pool": size})
    families = {m.name: m for m in SchedulerCollector(pools).collect()}
    assert name in families, f"the platform exports no {name}: {sorted(families)}"
    samples = families[name].samples
    exported = {frozenset(s.labels) for s in samples}
    assert exported == {frozenset(labels)}, f"query labels {sorted(labels)}, exported {exported}"
    [selected] = [s for s in samples if s.labels == labels]
    assert selected.value == size.desired


def test_pool_deployment_serves_the_queried_version(resources: dict[Any, Any]) -> None:
    _, labels = _query_of(resources["ScaledObject", POOL])
    pod = resources["Deployment", POOL]["spec"]["template"]
    command = pod["spec"]["containers"][0]["command"]
    assert f"--model={labels['model']}" in command
    assert f"--version={labels['version']}" in command
    assert pod["metadata"]["labels"]["kiln.dev/model"] == labels["model"]
    assert pod["metadata"]["labels"]["kiln.dev/version"] == labels["version"]


def test_pool_workers_get_a_gpu_on_the_tainted_gpu_nodes(resources: dict[Any, Any]) -> None:
    nodes = (TERRAFORM / "modules" / "eks" / "nodes.tf").read_text()
    taint = re.search(r'key = "([^"]+)", value = "([^"]+)", effect = "NO_SCHEDULE"', nodes)
    label = re.search(r'gpu = \{.*?labels\s*=\s*\{ "([^"]+)" = "gpu"', nodes, re.S)
    assert taint, "no NO_SCHEDULE taint in terraform/modules/eks/nodes.tf"
    assert label, "no gpu node label in terraform/modules/eks/nodes.tf"
    pod = resources["Deployment", POOL]["spec"]["template"]["spec"]
    toleration = {"key": taint[1], "operator": "Equal", "value": taint[2], "effect": "NoSchedule"}
    assert toleration in pod["tolerations"]
    assert pod["nodeSelector"] == {label[1]: "gpu"}
    resources_ = pod["containers"][0]["resources"]
    assert resources_["limits"]["nvidia.com/gpu"] == 1
