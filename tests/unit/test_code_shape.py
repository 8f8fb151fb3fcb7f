"""The size rules of issue 15, so they cannot regress: no module over 400 lines, no function
over 60, the median module at most 100 lines (litestar's is 84); and every module path that
``docs/architecture.md``'s module maps name exists."""

from __future__ import annotations

import ast
import re
import statistics
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "platform" / "src", ROOT / "console" / "src", ROOT / "runtimes" / "src"]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_MEDIAN_MODULE_LINES = 100


def _modules() -> list[Path]:
    return sorted(p for src in SOURCES for p in src.rglob("*.py"))


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_sources_are_found() -> None:
    assert len(_modules()) > 100


def test_no_module_over_400_lines() -> None:
    long = {_name(p): n for p in _modules() if (n := _lines(p)) > MAX_MODULE_LINES}
    assert not long, f"split these modules along their seams: {long}"


def test_median_module_at_most_100_lines() -> None:
    median = statistics.median(_lines(p) for p in _modules())
    assert median <= MAX_MEDIAN_MODULE_LINES


def test_no_function_over_60_lines() -> None:
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long[f"{_name(path)}:{node.lineno} {node.name}"] = length
    assert not long, f"split these functions along their seams: {long}"


PACKAGES = {
    "kiln_platform": ROOT / "platform" / "src",
    "kiln_console": ROOT / "console" / "src",
    "kiln_runtimes": ROOT / "runtimes" / "src",
}
TABLES = {
    "| module (`kiln_runtimes/`) | what it holds |": "kiln_runtimes/",
    "| module | does |": "kiln_runtimes/build/",
    "| module | holds |": "",
}
"""The module maps that are tables: header row -> the folder their paths are relative to."""
BULLETS = {"Module map (this context):": "kiln_platform/"}
"""The module maps that are lists of bullets: the line before them -> their folder."""
TICKED = re.compile(r"`([^`]+)`")


def _expand(token: str) -> list[str]:
    """``{a,b}.py`` -> ``a.py``, ``b.py`` (one pair of braces)."""
    braces = re.search(r"\{([^}]*)\}", token)
    if braces is None:
        return [token]
    return [token[: braces.start()] + part + token[braces.end() :] for part in braces[1].split(",")]


def _paths(cell: str, base: str, folder: str) -> tuple[list[str], str]:
    """The module paths a cell names (from a package's name on), and the folder its last path
    was in: a bare name after ``backends/base.py`` is ``backends/``'s."""
    paths = []
    for ticked in TICKED.findall(cell):
        for token in _expand(ticked):
            if not (token.endswith(".py") or token.endswith("/")):
                continue
            if "/" not in token.rstrip("/"):
                path = folder + token
            else:
                path = token if token.partition("/")[0] in PACKAGES else base + token
            folder = path if path.endswith("/") else path.rpartition("/")[0] + "/"
            paths.append(path)
    return paths, folder


def _mapped() -> list[str]:
    """Every module path named in the module maps, from its package's name on."""
    lines = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines()
    found: list[str] = []
    for i, line in enumerate(lines):
        if line in TABLES:
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                cells = row.split(" | ")
                base = TABLES[line]
                paths, folder = _paths(cells[0], base, base)
                found += paths
                if paths and paths[-1].endswith("/"):
                    found += _paths(cells[1], base, folder)[0]
        elif line in BULLETS:
            for row in lines[i + 2 :]:
                if not row.strip():
                    break
                base = BULLETS[line]
                found += _paths(row, base, base)[0]
    return found


def _exists(path: str) -> bool:
    return any(PACKAGES[path.partition("/")[0]].glob(path.rstrip("/")))


def test_module_maps_name_modules_that_exist() -> None:
    mapped = _mapped()
    assert len(mapped) > 50
    missing = [p for p in mapped if not _exists(p)]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"
