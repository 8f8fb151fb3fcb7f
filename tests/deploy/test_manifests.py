"""``terraform/kubernetes`` validates, strictly, against the schemas of the cluster's Kubernetes
version (kubernetes-validate bundles them: no cluster, no network), and it configures only what
Kiln reads: real ``KILN_`` settings, real worker flags, real health routes."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
from pydantic import SecretStr

from kiln_console.compose import create_app
from kiln_platform.db.engine import APP_ROLE
from kiln_platform.settings import Settings
from kiln_runtimes import _app as worker_app
from kiln_runtimes.protocol import WORKER_SECRET_ENV
from kiln_runtimes.worker import parse_args

REPO = Path(__file__).resolve().parents[2]
TERRAFORM = REPO / "terraform"
# A CRD: kubernetes-validate has no schema for it; test_pool_scaling.py checks its structure.
NO_SCHEMA = {("keda.sh/v1alpha1", "ScaledObject")}


def tf_default(name: str) -> str:
    """A root-module variable's string default, as written in ``variables.tf``."""
    text = (TERRAFORM / "variables.tf").read_text()
    block = re.search(rf'variable "{name}" \{{(.*?)\n\}}', text, re.S)
    default = block and re.search(r'^\s*default\s*=\s*"([^"]*)"', block.group(1), re.M)
    assert default, f"variable {name} has no string default in terraform/variables.tf"
    return default.group(1)


def _validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, f"{tf_default('kubernetes_version')}.0", strict=True)


def test_every_manifest_validates(documents: list[tuple[Path, dict[str, Any]]]) -> None:
    errors, unchecked = [], set()
    for path, doc in documents:
        try:
            _validate(doc)
        except kubernetes_validate.SchemaNotFoundError:
            unchecked.add((doc["apiVersion"], doc["kind"]))
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{path.name} {doc['kind']}/{doc['metadata']['name']}: {exc.message}")
    assert not errors, "\n".join(errors)
    assert unchecked <= NO_SCHEMA, f"no schema and no structural test for {unchecked - NO_SCHEMA}"


def test_strict_validation_rejects_an_unknown_field(resources: dict[Any, Any]) -> None:
    gateway = copy.deepcopy(resources["Deployment", "kiln-gateway"])
    gateway["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(gateway)


def _container(resources: dict[Any, Any], name: str) -> dict[str, Any]:
    container: dict[str, Any] = resources["Deployment", name]["spec"]["template"]["spec"][
        "containers"
    ][0]
    return container


def test_gateway_sets_only_kiln_settings_that_parse(
    resources: dict[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = dict(resources["ConfigMap", "kiln-gateway"]["data"])
    secrets = _container(resources, "kiln-gateway")["env"]  # from Secrets: any string parses
    env |= {e["name"]: "postgresql://kiln@db:5432/kiln" for e in secrets}
    unknown = [k for k in env if k.removeprefix("KILN_").lower() not in Settings.model_fields]
    assert not unknown, f"not Kiln settings: {unknown}"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()  # a value of the wrong type fails here
    assert str(settings.data_dir) == env["KILN_DATA_DIR"]
    assert settings.port == 8000


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Litestar's, about route handlers
def test_gateway_probes_are_kiln_routes(resources: dict[Any, Any], tmp_path: Path) -> None:
    gateway = _container(resources, "kiln-gateway")
    probes = ("startupProbe", "livenessProbe", "readinessProbe")
    paths = {gateway[probe]["httpGet"]["path"] for probe in probes}
    app = create_app(Settings(data_dir=tmp_path, secret_key=SecretStr("probe-test")))
    assert paths <= {route.path for route in app.routes}
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"  # database reachable


def test_worker_flags_and_probes_are_the_workers(resources: dict[Any, Any]) -> None:
    worker = _container(resources, "kiln-pool-resnet50-1")
    assert worker["command"][:3] == ["python", "-m", "kiln_runtimes"]
    settings = parse_args(worker["command"][3:])  # argparse exits on an unknown flag
    assert settings.port == worker["ports"][0]["containerPort"]
    stub = SimpleNamespace(
        settings=SimpleNamespace(max_queue=1, secret="probe-test"),
        manifest=SimpleNamespace(context_length=1, task="tensor"),
    )
    app = worker_app.create_app(stub)  # type: ignore[arg-type]
    routes = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        # the kubelet sends no worker secret: only the routes that need none will do
        assert worker[probe]["httpGet"]["path"] in routes & worker_app.PROBES


def _labels_match(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return bool(selector.get("matchLabels", {}).items() <= labels.items())


def test_worker_inference_port_admits_only_gateway_pods(resources: dict[Any, Any]) -> None:
    """Port 9000 (the gateway's calls) from pods labelled as the gateway, nothing else; the
    monitoring namespace reaches the metrics-only port; the secret comes from a Secret."""
    policy = resources["NetworkPolicy", "kiln-worker"]["spec"]
    pool = resources["Deployment", "kiln-pool-resnet50-1"]["spec"]["template"]
    gateway = resources["Deployment", "kiln-gateway"]["spec"]["template"]["metadata"]["labels"]
    assert _labels_match(policy["podSelector"], pool["metadata"]["labels"])
    assert "Ingress" in policy["policyTypes"]
    worker = pool["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    settings = parse_args(worker["command"][3:])
    assert (settings.port, settings.metrics_port) == (ports["http"], ports["metrics"])
    by_port: dict[int, list[dict[str, Any]]] = {}
    for rule in policy["ingress"]:
        assert rule.get("from"), "an ingress rule without 'from' admits every source"
        for port in rule["ports"]:
            by_port.setdefault(port["port"], []).extend(rule["from"])
    assert set(by_port) == {ports["http"], ports["metrics"]}
    [inference] = by_port[ports["http"]]
    assert set(inference) == {"podSelector"}  # this namespace's pods, no namespaceSelector
    assert _labels_match(inference["podSelector"], gateway)
    assert inference["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gateway"
    [scrapers] = by_port[ports["metrics"]]
    assert scrapers["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }
    annotations = pool["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(ports["metrics"])
    [secret] = [e for e in worker["env"] if e["name"] == WORKER_SECRET_ENV]
    assert secret["valueFrom"]["secretKeyRef"] == {"name": "kiln-worker-secret", "key": "secret"}
    gateway_env = _container(resources, "kiln-gateway")["env"]
    [same] = [e for e in gateway_env if e["name"] == WORKER_SECRET_ENV]
    assert same["valueFrom"] == secret["valueFrom"]  # one value on both ends


def test_network_policy_reaches_the_database_in_the_vpc(resources: dict[Any, Any]) -> None:
    egress = resources["NetworkPolicy", "kiln-gateway"]["spec"]["egress"]
    postgres = [rule for rule in egress if rule.get("ports", [{}])[0].get("port") == 5432]
    assert postgres[0]["to"] == [{"ipBlock": {"cidr": tf_default("vpc_cidr")}}]


def test_service_account_is_the_irsa_subject(resources: dict[Any, Any]) -> None:
    account = resources["ServiceAccount", tf_default("kiln_service_account")]
    assert account["metadata"]["namespace"] == tf_default("kiln_namespace")
    assert "eks.amazonaws.com/role-arn" in account["metadata"]["annotations"]
    for name in ("kiln-gateway", "kiln-pool-resnet50-1"):
        pod = resources["Deployment", name]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == account["metadata"]["name"]


def _image(reference: str) -> tuple[str, str]:
    """``registry/kiln/<name>:<tag>`` -> (name, tag)."""
    path, _, tag = reference.rpartition(":")
    return path.rsplit("/", 1)[-1], tag


def test_pools_run_on_the_kubernetes_backend_and_the_s3_store_from_kilns_images(
    resources: dict[Any, Any],
) -> None:
    config = resources["ConfigMap", "kiln-gateway"]["data"]
    assert config["KILN_POOL_BACKEND"] == "kubernetes"
    assert config["KILN_ARTIFACT_STORE"].startswith("s3://")
    gateway = resources["Deployment", "kiln-gateway"]["spec"]["template"]["spec"]
    assert gateway["automountServiceAccountToken"] is True  # the pool manager calls the API
    role = resources["RoleBinding", "kiln-pool-manager"]["subjects"]
    assert {s["name"] for s in role} == {gateway["serviceAccountName"]}
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    images = [
        ("platform", _container(resources, "kiln-gateway")["image"]),
        ("runtime-gpu", config["KILN_WORKER_IMAGE"]),
        ("runtime-gpu", _container(resources, "kiln-pool-resnet50-1")["image"]),  # KEDA's
    ]
    for dockerfile, reference in images:
        name, tag = _image(reference)
        assert name == dockerfile, reference
        assert (REPO / "docker" / f"{name}.Dockerfile").is_file(), reference
        assert tag == version, reference


def test_gateways_are_one_fleet_of_two_or_more_that_drains_one_at_a_time(
    resources: dict[Any, Any],
) -> None:
    """Shared workers on; the HPA alone sizes the gateways (the Deployment names no replicas,
    so an apply never resets them), never below 2, on CPU; the PDB lets a drain take one (and
    any unready one) at a time; the pool manager may list the Deployments a new leader adopts."""
    config = resources["ConfigMap", "kiln-gateway"]["data"]
    assert Settings.model_validate({"shared_workers": config["KILN_SHARED_WORKERS"]}).shared_workers
    gateway = resources["Deployment", "kiln-gateway"]
    assert "replicas" not in gateway["spec"]
    hpa = resources["HorizontalPodAutoscaler", "kiln-gateway"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": "kiln-gateway"}  # fmt: skip
    assert 2 <= hpa["minReplicas"] < hpa["maxReplicas"]
    assert [m["resource"]["name"] for m in hpa["metrics"]] == ["cpu"]
    pdb = resources["PodDisruptionBudget", "kiln-gateway"]["spec"]
    assert pdb["maxUnavailable"] == 1
    assert "minAvailable" not in pdb
    assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    [deployments] = [r for r in resources["Role", "kiln-pool-manager"]["rules"]
                     if "deployments" in r["resources"]]  # fmt: skip
    assert {"get", "list", "create", "patch", "delete"} <= set(deployments["verbs"])


def test_database_roles_are_split_and_the_owner_password_is_a_mounted_secret(
    resources: dict[Any, Any],
) -> None:
    config = resources["ConfigMap", "kiln-gateway"]["data"]
    app, owner = (urlsplit(config[k]) for k in ("KILN_DATABASE_URL", "KILN_DATABASE_OWNER_URL"))
    assert app.username == APP_ROLE  # serving: owns nothing, RLS binds it
    assert owner.username == tf_default("db_username")  # migrations: the RDS master user
    assert app.password is None
    assert owner.password is None
    assert config["KILN_DATABASE_IAM"] == "rds"
    irsa = (TERRAFORM / "modules" / "irsa" / "variables.tf").read_text()
    assert re.search(rf'variable "database_user" {{[^}}]*default\s*=\s*"{APP_ROLE}"', irsa)
    path = PurePosixPath(config["KILN_DATABASE_OWNER_PASSWORD_FILE"])
    pod = resources["Deployment", "kiln-gateway"]["spec"]["template"]["spec"]
    mounts = pod["containers"][0]["volumeMounts"]
    [mount] = [m for m in mounts if m["mountPath"] == str(path.parent)]
    assert mount["readOnly"] is True
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "subPath" not in mount  # a subPath mount would never see the rotated file
    assert [i["path"] for i in volume["secret"]["items"]] == [path.name]
    assert volume["secret"]["defaultMode"] & 0o007 == 0  # not world-readable
