"""The package layering, read from the source: ``kiln_runtimes`` <- ``kiln_platform`` <-
``kiln_console``, and no import cycle between modules, at run time or under ``TYPE_CHECKING``.

Every ``import`` statement counts, wherever it is (a function body, ``if TYPE_CHECKING:``): a
cycle that only type checking closes still ties the modules together for a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = {
    "kiln_runtimes": REPO / "runtimes" / "src",
    "kiln_platform": REPO / "platform" / "src",
    "kiln_console": REPO / "console" / "src",
}
LAYER = {"kiln_runtimes": 0, "kiln_platform": 1, "kiln_console": 2}
"""A package may import only packages of a lower or equal layer."""


def _modules() -> dict[str, Path]:
    found = {}
    for package, src in SOURCES.items():
        for path in sorted((src / package).rglob("*.py")):
            parts = path.relative_to(src).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The first-party modules ``name`` imports (``from a import b``: ``a.b`` if a module)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            module = target
            while module and module not in known:
                module = module.rpartition(".")[0]
            if module and module != name and module.split(".")[0] in LAYER:
                found.add(module)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    # ``from pkg import mod`` also runs ``pkg/__init__``: an edge to the package itself is
    # implied by the edge to ``pkg.mod`` and adds nothing; drop package -> own child edges
    for name, edges in graph.items():
        edges.discard(name.rpartition(".")[0])
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_packages_import_only_lower_layers() -> None:
    wrong = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in sorted(targets)
        if LAYER[target.split(".")[0]] > LAYER[module.split(".")[0]]
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_the_scan_sees_imports_in_functions_and_under_type_checking(tmp_path: Path) -> None:
    probe = tmp_path / "a.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from kiln_platform.b import C\n"
        "def f():\n    from kiln_console import d\n"
    )
    known = {"kiln_platform.a", "kiln_platform.b", "kiln_console", "kiln_console.d"}
    found = _imports("kiln_platform.a", probe, known)
    assert found == {"kiln_platform.b", "kiln_console", "kiln_console.d"}
    graph = {"kiln_platform.a": {"kiln_platform.b"}, "kiln_platform.b": {"kiln_platform.a"}}
    assert _cycles(graph) == [["kiln_platform.a", "kiln_platform.b"]]
