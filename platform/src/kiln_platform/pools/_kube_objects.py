"""The ``kubernetes`` backend's pure parts: a pool's Deployment rendered from its ``PoolSpec``
and the settings, and pods (the API server's JSON) turned into what the backend tracks.

The Deployment matches ``terraform/kubernetes/pool/worker.yaml`` (labels, node group, GPU taint,
probes, security context), with the worker command line the ``local`` backend runs
(``backend.worker_arguments``), listening on ``0.0.0.0:9000`` (the gateway's calls, which carry
the worker secret: ``KILN_WORKER_SECRET`` from a Secret, never a flag) and ``:9090`` (``GET
/metrics`` alone, for the monitoring namespace; ``terraform/kubernetes/networkpolicy.yaml``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kiln_platform.pools.backend import worker_arguments
from kiln_runtimes.protocol import WORKER_SECRET_ENV
from kiln_runtimes.store import CACHE_MAX_ENV, STORE_ENV

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping

    from kiln_platform.pools.backend import PoolSpec
    from kiln_platform.settings import Settings

WORKER_PORT = 9000
"""The port every worker pod listens on (the pod IP tells workers apart)."""
METRICS_PORT = 9090
"""Where a worker pod serves ``GET /metrics`` alone (no tenant labels, no secret)."""
MANAGED_BY = "kiln-pool-manager"
POOL_LABEL = "kiln.dev/pool"
TEMPLATE_ANNOTATION = "kiln.dev/template"
"""The digest of the pod template a Deployment was made or last updated with (``adoption``)."""
ORPHAN_GRACE_S = 60.0
"""A Deployment no pool wants is deleted only once at least this old (``orphans``)."""
NODE_CLASS_LABEL = "kiln.dev/node-class"
"""The node groups' label (``terraform/modules/eks/nodes.tf``): ``cpu`` or ``gpu``."""
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true",
                  "effect": "NoSchedule"}  # fmt: skip
"""Tolerates the GPU node group's taint (only pool workers do)."""
GPU_TARGETS = frozenset({"cuda", "tensorrt"})
WORKER_SELECTOR = {
    "app.kubernetes.io/component": "worker",
    "app.kubernetes.io/managed-by": MANAGED_BY,
}
"""Every pod of every pool this backend made (one list call covers all pools)."""
_CRASHING = frozenset({"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull",
                       "CreateContainerConfigError", "RunContainerError"})  # fmt: skip
"""Container waiting reasons that a pod does not leave by itself."""
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")


def _safe(text: str, limit: int, pattern: re.Pattern[str], lower: bool) -> str:
    """``text`` if it is valid and short enough, else a cleaned prefix and a digest suffix (so
    two names never clean to the same value)."""
    if len(text) <= limit and pattern.match(text) and (not lower or text == text.lower()):
        return text
    cleaned = re.sub(
        r"[^a-z0-9-]" if lower else r"[^A-Za-z0-9._-]", "-", text.lower() if lower else text
    )
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{cleaned[: limit - 9].strip('-._')}-{digest}".strip("-")


def label_value(text: str) -> str:
    """``text`` as a label value (63 characters, alphanumerics and ``-_.``)."""
    return _safe(text, 63, _LABEL_VALUE, lower=False)


def deployment_name(spec: PoolSpec) -> str:
    """``kiln-pool-<model>-<version>``: a DNS label short enough for pod names to derive from."""
    dns = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
    return "kiln-pool-" + _safe(f"{spec.model}-{spec.version}", 47, dns, lower=True)


def selector(spec: PoolSpec) -> dict[str, str]:
    """The labels that select this pool's pods."""
    return {**WORKER_SELECTOR, POOL_LABEL: deployment_name(spec)}


def pod_labels(spec: PoolSpec) -> dict[str, str]:
    """Labels of the pool's Deployment and pods (the exact names are annotations)."""
    return {"app.kubernetes.io/name": "kiln", "app.kubernetes.io/part-of": "kiln",
            **selector(spec), "kiln.dev/model": label_value(spec.model),
            "kiln.dev/version": label_value(spec.version)}  # fmt: skip


def deployment(spec: PoolSpec, settings: Settings, replicas: int) -> dict[str, Any]:
    """The pool's Deployment: ``replicas`` workers of ``spec`` on the node group of its target."""
    gpu = settings.worker_target in GPU_TARGETS
    annotations = {"kiln.dev/model": spec.model, "kiln.dev/version": spec.version}
    metadata = {"name": deployment_name(spec), "namespace": settings.kubernetes_namespace,
                "labels": pod_labels(spec), "annotations": annotations}  # fmt: skip
    pod: dict[str, Any] = {
        "serviceAccountName": settings.kubernetes_service_account,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 60,  # a worker drains admitted work on SIGTERM
        "nodeSelector": {NODE_CLASS_LABEL: "gpu" if gpu else "cpu"},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                            "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(spec, settings, gpu)],
        "volumes": [_store_volume(settings), {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}}],
    }  # fmt: skip
    if gpu:
        pod["tolerations"] = [dict(GPU_TOLERATION)]
    prometheus = {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
                  "prometheus.io/path": "/metrics"}  # fmt: skip
    template = {"metadata": {"labels": pod_labels(spec), "annotations": annotations | prometheus},
                "spec": pod}  # fmt: skip
    metadata["annotations"] = annotations | {TEMPLATE_ANNOTATION: _digest(template)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": selector(spec)},
            "template": template,
        },
    }


def _digest(template: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]


def adoption(found: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that makes ``found``, a pool's Deployment a previous leader made, the one
    ``body`` describes: its replicas only while the pod template is the same (no rollout: the
    pods keep serving through a hand-over), the whole of ``body`` once the template changed (new
    settings or image: a rolling update); None when there is nothing to change."""
    meta = found.get("metadata") or {}
    same = (meta.get("annotations") or {}).get(TEMPLATE_ANNOTATION) == (
        body["metadata"]["annotations"][TEMPLATE_ANNOTATION]
    )
    if not same:
        return dict(body)
    replicas = body["spec"]["replicas"]
    if (found.get("spec") or {}).get("replicas") == replicas:
        return None
    return {"spec": {"replicas": replicas}}


def orphans(
    desired: Collection[str], found: Mapping[str, Mapping[str, Any]], now: float, grace_s: float
) -> list[str]:
    """The Deployments to delete: of Kiln's ``found`` (by name, as the API server lists them),
    those no pool wants (not in ``desired``, the Deployment names of every pool the registry
    serves) that were made at least ``grace_s`` seconds before ``now`` (epoch seconds). A younger
    one may be a pool the previous leader made after this leader read the registry: the next
    reconcile wants it, or a later call deletes it. One without a creation time is kept."""
    doomed = []
    for name, deployment in found.items():
        created = (deployment.get("metadata") or {}).get("creationTimestamp")
        if name not in desired and created and now - _epoch(created) >= grace_s:
            doomed.append(name)
    return sorted(doomed)


def _store_volume(settings: Settings) -> dict[str, Any]:
    """The shared store's claim, read-only; or, with an ``s3://`` store, the pod's own cache."""
    if settings.artifact_store:
        return {"name": "store", "emptyDir": {}}
    claim = {"claimName": settings.kubernetes_store_claim, "readOnly": True}
    return {"name": "store", "persistentVolumeClaim": claim}


def _store_env(settings: Settings) -> list[dict[str, Any]]:
    """An ``s3://`` store for the worker to materialize its tree from (credentials: IRSA)."""
    if not settings.artifact_store:
        return []
    return [{"name": STORE_ENV, "value": settings.artifact_store},
            {"name": CACHE_MAX_ENV, "value": str(settings.artifact_cache_max_bytes)}]  # fmt: skip


def _container(spec: PoolSpec, settings: Settings, gpu: bool) -> dict[str, Any]:
    argv = worker_arguments(spec, settings, WORKER_PORT, host="0.0.0.0")  # noqa: S104
    argv += ["--metrics-port", str(METRICS_PORT)]
    # the kubelet cannot send the secret: its probes use the two routes that need none
    ready = {"httpGet": {"path": "/readyz", "port": "http"}}
    live = {"httpGet": {"path": "/livez", "port": "http"}}
    secret = {"secretKeyRef": {"name": settings.kubernetes_worker_secret, "key": "secret"}}
    starting = math.ceil(settings.worker_start_timeout_s / 10)
    requests: dict[str, Any] = {"cpu": "2", "memory": "8Gi"}
    limits: dict[str, Any] = {"cpu": "4", "memory": "16Gi"}
    if gpu:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = 1
    return {
        "name": "worker",
        "image": settings.worker_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", "kiln_runtimes", *argv],
        "env": [{"name": WORKER_SECRET_ENV, "valueFrom": secret}, *_store_env(settings)],
        "ports": [{"name": "http", "containerPort": WORKER_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        # loading (and, on a cold engine cache, compiling) may take the whole start timeout
        "startupProbe": ready | {"periodSeconds": 10, "failureThreshold": starting},
        "livenessProbe": live | {"periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 3},
        "readinessProbe": ready | {"periodSeconds": 2, "timeoutSeconds": 2, "failureThreshold": 1},
        "resources": {"requests": requests, "limits": limits},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [
            {"name": "store", "mountPath": str(settings.store_dir),
             "readOnly": not settings.artifact_store},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108
        ],
    }  # fmt: skip


@dataclass(frozen=True, slots=True)
class PodState:
    """What the backend needs of one worker pod."""

    name: str
    ip: str | None
    ready: bool
    """The pod's Ready condition is true (the kubelet's readiness probe passes)."""
    crashed: bool
    """A container is crash-looping or cannot start, or the pod failed."""
    restarts: int
    created_at: float
    """Creation time, seconds since the epoch."""
    terminating: bool


def pod_state(pod: Mapping[str, Any]) -> PodState:
    """One pod (as the API server returns it) as a ``PodState``."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    containers = status.get("containerStatuses") or []
    waiting = {(c.get("state") or {}).get("waiting", {}).get("reason") for c in containers}
    created = meta.get("creationTimestamp")
    return PodState(
        name=meta.get("name", ""),
        ip=status.get("podIP") or None,
        ready=ready,
        crashed=status.get("phase") == "Failed" or bool(waiting & _CRASHING),
        restarts=sum(int(c.get("restartCount", 0)) for c in containers),
        created_at=_epoch(created) if created else 0.0,
        terminating=meta.get("deletionTimestamp") is not None,
    )


def _epoch(timestamp: str | datetime) -> float:
    if isinstance(timestamp, datetime):
        return timestamp.timestamp()
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def keep(pods: Iterable[PodState], replicas: int) -> list[PodState]:
    """The pods that are the pool's ``replicas`` workers: not terminating, ready ones first,
    then the oldest (so a scale-down leaves rotation with starting pods first, then the newest,
    like the ``local`` backend)."""
    live = sorted((p for p in pods if not p.terminating), key=lambda p: (not p.ready, p.created_at))
    return live[:replicas]
