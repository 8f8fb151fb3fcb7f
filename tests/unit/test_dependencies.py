"""Each package's pyproject.toml declares exactly the distributions its source imports, plus
the few that are used without being imported, each named here with the reason.

Extras (``kiln-runtimes``' engines and model-import toolchain) may declare what their
subprocesses and data packages need without importing it; what the source imports must be
declared in the dependencies or an extra."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {"kiln_runtimes": "runtimes", "kiln_platform": "platform", "kiln_console": "console"}
NOT_DECLARED = {"torch": "installed by pip as a CPU build (README); uv would fetch a CUDA one"}
IMPORTED_AS = {"pynvml": "nvidia-ml-py"}
"""Import names of distributions that may not be installed here (a GPU extra's)."""
USED_NOT_IMPORTED = {
    "asyncpg": "SQLAlchemy's driver (postgresql+asyncpg)",
    "jinja2": "the console's templates, through litestar[jinja]",
}


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group()).lower()


def _declared(folder: str) -> tuple[set[str], set[str]]:
    """The dependencies, and what the extras add."""
    project = tomllib.loads((REPO / folder / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {}).values()
    return {_name(r) for r in project["dependencies"]}, {_name(r) for e in extras for r in e}


def _imported(package: str, folder: str) -> dict[str, set[str]]:
    """Top-level import names outside the stdlib and the package -> the modules importing them."""
    found: dict[str, set[str]] = {}
    for path in (REPO / folder / "src" / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != package:
                    found.setdefault(top, set()).add(path.name)
    return found


def test_pyprojects_declare_what_they_import() -> None:
    dists = packages_distributions()
    problems = []
    for package, folder in PACKAGES.items():
        required, extras = _declared(folder)
        used = set()
        for top, where in sorted(_imported(package, folder).items()):
            candidates = {_name(d) for d in dists.get(top, [IMPORTED_AS.get(top, top)])}
            if not candidates & (required | extras | set(NOT_DECLARED)):
                problems.append(f"{folder}: imports {top} ({', '.join(sorted(where))}) undeclared")
            used |= candidates
        for name in sorted(required - used - set(USED_NOT_IMPORTED)):
            problems.append(f"{folder}: depends on {name} but never imports it")
    assert not problems, "\n".join(problems)
