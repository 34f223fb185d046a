"""The engine's layer order (``jobctl.engine.LAYERS``) and size limits, enforced.

Every import in ``engine/``, ``backends/`` and ``spec/`` is read with ``ast``, at module
level and inside functions alike (a deferred import is still a dependency).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

from jobctl.engine import LAYERS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"engine": "jobctl.engine", "backends": "jobctl.backends", "spec": "jobctl.spec"}
# A file past this is worth a look, not a split: a concept stays in one file (ruff format
# took three that fit 400 lines to 410-415; one run's life, supervise/supervisor.py,
# took 465 once a launch could retry on new ports: #44 allows up to 600 for a concept).
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 40


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [PACKAGES[rel.parts[0]].split(".", 1)[1], *rel.parts[1:]]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return "jobctl." + ".".join(parts)


def _sources() -> list[Path]:
    return sorted(p for top in PACKAGES for p in (ROOT / top).rglob("*.py"))


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every ``jobctl`` module ``path`` imports, absolute, with its line."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, node.lineno))
    return [(name, line) for name, line in found if name.startswith("jobctl.")]


def _unit(module: str) -> str:
    """The layered unit a module belongs to: an engine subpackage (``calibration.measure``
    apart from ``calibration``), or a top-level package."""
    parts = module.split(".")
    if parts[1] != "engine":
        return parts[1]
    if len(parts) == 2:
        return "engine"
    if parts[2:4] == ["calibration", "measure"]:
        return "calibration.measure"
    return parts[2]


LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}


def _edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in _sources():
        src = _unit(_module_name(path))
        for target, line in _imports(path):
            dst = _unit(target)
            if dst != src:
                edges[(src, dst)].append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    return edges


def _violations(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    bad = []
    for (src, dst), where in edges.items():
        if src in LEVEL and dst in LEVEL and LEVEL[dst] > LEVEL[src]:
            bad += [f"upward ({src} -> {dst}): {w}" for w in where]
        if src == "backends" and dst not in ("backends", "core", "spec", "templates"):
            bad += [f"backends may import engine.core only: {w}" for w in where]
        if src == "spec" and dst not in ("spec",):
            bad += [f"spec imports nothing of jobctl: {w}" for w in where]
    return bad


def test_the_layer_order_names_every_engine_subpackage_once() -> None:
    names = [n for layer in LAYERS for n in layer]
    assert len(names) == len(set(names))
    found = {p.name for p in (ROOT / "engine").iterdir() if (p / "__init__.py").exists()}
    assert found | {"calibration.measure"} == set(names)


def test_no_module_sits_directly_in_engine() -> None:
    assert [p.name for p in (ROOT / "engine").glob("*.py")] == ["__init__.py"]


def test_imports_go_down_the_layers_only() -> None:
    assert _violations(_edges()) == []


def test_engine_reaches_backends_only_through_the_registry() -> None:
    bad = []
    for path in _sources():
        if _unit(_module_name(path)) in LEVEL:
            bad += [
                f"{path.relative_to(ROOT)}:{line} imports {target}"
                for target, line in _imports(path)
                if target.startswith("jobctl.backends.")
            ]
    assert bad == []


def _cycle(edges: set[tuple[str, str]]) -> list[str] | None:
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_cycle_between_subpackages() -> None:
    assert _cycle(set(_edges())) is None


def test_the_checks_catch_an_upward_import_and_a_cycle() -> None:
    # The checks themselves can fail: core importing cli is upward, a <-> b a cycle.
    planted = {("core", "cli"): ["engine/core/x.py:1 imports jobctl.engine.cli.app"]}
    assert _violations(planted)
    assert _cycle({("runtime", "pruning"), ("pruning", "runtime")})
    assert _cycle({("a", "b"), ("b", "c")}) is None


def test_views_only_render_what_they_are_given() -> None:
    # Views never import torch, and from the rest of jobctl they take types and
    # constants only (CapWords / UPPER names): no simulating, loading or rebalancing.
    bad = []
    for path in sorted((ROOT / "engine" / "views").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                bad += [
                    f"{path.name}:{node.lineno} {a.name}"
                    for a in node.names
                    if a.name.split(".")[0] == "torch"
                ]
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if module.split(".")[0] == "torch":
                    bad.append(f"{path.name}:{node.lineno} {module}")
                if module.startswith("jobctl.") and not module.startswith("jobctl.engine.views"):
                    bad += [
                        f"{path.name}:{node.lineno} {module}.{a.name}"
                        for a in node.names
                        if not a.name[0].isupper()
                    ]
    assert bad == []


@pytest.mark.parametrize("top", sorted(PACKAGES))
def test_files_and_functions_stay_small(top: str) -> None:
    long_files, long_functions = [], []
    for path in sorted((ROOT / top).rglob("*.py")):
        src = path.read_text()
        if len(src.splitlines()) > MAX_FILE_LINES:
            long_files.append(str(path.relative_to(ROOT)))
        for node in ast.walk(ast.parse(src)):
            is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_function and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert long_files == [] and long_functions == []


def test_every_module_and_subpackage_says_what_it_is() -> None:
    missing = []
    for path in _sources():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if not doc.strip() or "TODO" in doc:
            missing.append(str(path.relative_to(ROOT)))
    assert missing == []
