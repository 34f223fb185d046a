"""The step systems that plan themselves (``engine.core.systems``), each in its room.

A system (Mobius) owns one room end to end, its planning included, and the planner's
resolver reaches it only through the registry: every registered entry imports and
offers ``StepSystem``, the resolver imports no module of a room (every import walked
with ``ast``, inside functions too, and the modules those import), a system's planning
modules live in its room, and ``schedule: auto`` still turns to a system in a fresh
interpreter that imported nothing but the resolver.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobctl.engine.core import systems
from jobctl.engine.core.systems import SYSTEMS, StepSystem

from ..jobrun import QUICKSTART
from .test_layers import ROOT, _module_name

RESOLVER = ROOT / "engine" / "planner" / "resolver.py"


def _room(schedule: str) -> str:
    """The subpackage a system's entry lives in: ``jobctl.engine.<room>``."""
    return ".".join(SYSTEMS[schedule].split(".")[:3])


def _path(module: str) -> Path | None:
    """The file of a ``jobctl.engine`` module or package; None outside the engine."""
    parts = module.split(".")
    if parts[:2] != ["jobctl", "engine"]:
        return None
    base = ROOT.joinpath("engine", *parts[2:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imported(path: Path) -> set[str]:
    """Every ``jobctl`` module ``path`` imports, module level and inside functions; for
    ``from package import name``, the package and ``package.name`` both."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name.startswith("jobctl.")}


def _reached(path: Path) -> set[str]:
    """The engine modules ``path`` imports and those they import, and so on."""
    seen: set[str] = set()
    todo = [path]
    while todo:
        for name in _imported(todo.pop()):
            found = _path(name)
            if found is not None and name not in seen:
                seen.add(name)
                todo.append(found)
    return seen


def _in(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


@pytest.mark.parametrize("schedule", sorted(SYSTEMS))
def test_every_registered_entry_imports_and_offers_the_protocol(schedule):
    entry = systems.system(schedule)
    assert isinstance(entry, StepSystem)
    assert entry.__name__ == SYSTEMS[schedule]
    assert all(callable(getattr(entry, name)) for name in ("plan", "resolve", "faster"))
    assert entry.NAME and schedule in entry.EXPLAIN
    assert systems.planned_by(schedule) is entry and entry in systems.every()


def test_a_schedule_with_no_system_is_the_searchs():
    assert systems.planned_by("auto") is None and systems.planned_by("1f1b") is None


def test_an_entry_that_does_not_offer_the_protocol_is_refused(monkeypatch):
    # The check can fail: core.env offers none of it, and says what is missing.
    monkeypatch.setitem(SYSTEMS, "bogus", "jobctl.engine.core.env")
    with pytest.raises(TypeError, match=r"does not offer StepSystem: no \['NAME'"):
        systems.system("bogus")


@pytest.mark.parametrize("schedule", sorted(SYSTEMS))
def test_the_resolver_imports_no_module_of_a_room(schedule):
    room = _room(schedule)
    direct = _imported(RESOLVER)
    reached = _reached(RESOLVER)
    assert "jobctl.engine.core.systems" in direct  # what it asks instead
    assert [m for m in sorted(direct | reached) if _in(m, room)] == []
    # nor by name, through importlib
    strings = [
        node.value
        for node in ast.walk(ast.parse(RESOLVER.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    assert [s for s in strings if room in s] == []


@pytest.mark.parametrize("schedule", sorted(SYSTEMS))
def test_a_systems_planning_modules_live_in_its_room(schedule):
    room = _room(schedule)
    entry = _path(SYSTEMS[schedule])
    assert entry is not None and entry.is_relative_to(_path(room).parent)
    # what the entry reaches outside its room is shared code below it, none of it the
    # system's own (named after it)
    outside = [m for m in sorted(_reached(entry)) if not _in(m, room)]
    assert [m for m in outside if schedule in m.rsplit(".", 1)[-1]] == []
    # and the planner holds no module of it
    planner = ROOT / "engine" / "planner"
    assert [p.name for p in planner.rglob("*.py") if schedule in p.stem] == []


# Imports the resolver alone, then plans an auto job no P x D layout fits: the registry
# loads the system itself (a registry filled by imports would have none here).
FRESH = """
import json, sys
from jobctl.engine.planner.resolver import make_plan
from jobctl.spec import load_spec
before = sorted(m for m in sys.modules if m.startswith(ROOM))
spec = load_spec(sys.argv[1], overrides=json.loads(sys.argv[2]))
plan = make_plan(spec)
print(json.dumps([before, plan.schedule, plan.explanation[0]]))
"""


def test_auto_considers_mobius_in_a_fresh_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path))  # the analytic calibration
    overrides = {
        "model.layers": 6,
        "model.hidden": 256,
        "hardware.nodes": 1,
        "hardware.processes_per_node": 2,
        "hardware.memory_gb": 0.03,  # the state is 1.2x what the 2 devices hold
        "parallelism.pipeline_stages": "auto",
        "parallelism.data_parallel": "auto",
        "parallelism.schedule": "auto",
    }
    code = FRESH.replace("ROOM", repr(_room("mobius")))
    out = subprocess.run(
        [sys.executable, "-c", code, str(QUICKSTART), json.dumps(overrides)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    before, schedule, why = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == []  # importing the resolver loaded no module of the room
    assert schedule == "mobius" and why.startswith("mobius: no P x D fits")
