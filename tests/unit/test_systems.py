"""The step systems that plan themselves and the update strategies the search prices
(``engine.core.systems``), each in its room.

A system (Mobius) owns one room end to end, its planning included, and the planner's
resolver reaches it only through the registry: every registered entry imports and
offers ``StepSystem``, the resolver imports no module of a room (every import walked
with ``ast``, inside functions too, and the modules those import), a system's planning
modules live in its room, and ``schedule: auto`` still turns to a system in a fresh
interpreter that imported nothing but the resolver. The same for an update strategy
(AvgPipe's elastic averaging): its entry offers ``UpdateStrategy``, its planning
modules live in its room, neither the search nor the resolver imports any of them,
and a fresh interpreter that imported only the resolver still prices its N models.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobctl.engine.core import systems
from jobctl.engine.core.systems import PLAIN, SYSTEMS, UPDATES, StepSystem, UpdateStrategy
from jobctl.spec import load_spec

from ..jobrun import QUICKSTART
from .test_layers import ROOT, _module_name

RESOLVER = ROOT / "engine" / "planner" / "resolver.py"
SEARCH = ROOT / "engine" / "planner" / "search.py"


def _room(schedule: str) -> str:
    """The subpackage a system's entry lives in: ``jobctl.engine.<room>``."""
    return ".".join(SYSTEMS[schedule].split(".")[:3])


def _update_room(name: str) -> str:
    """The subpackage an update strategy's entry lives in: ``jobctl.engine.<room>``."""
    return ".".join(UPDATES[name].split(".")[:3])


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


def _strings(path: Path) -> list[str]:
    """Every string constant in ``path``: an import by name (``importlib``) is one."""
    return [
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def _owns_its_planning(entry: Path, room: str, own: str) -> None:
    """What ``entry`` reaches outside ``room`` is shared code below it, none of it the
    system's own (named ``own``), and the planner holds no module of it (AvgPipe's
    costs and tuning once were there)."""
    outside = [m for m in sorted(_reached(entry)) if not _in(m, room)]
    assert [m for m in outside if own in m.rsplit(".", 1)[-1]] == []
    planner = ROOT / "engine" / "planner"
    assert [p.name for p in planner.rglob("*.py") if own in p.stem] == []


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
    assert [s for s in _strings(RESOLVER) if room in s] == []


@pytest.mark.parametrize("schedule", sorted(SYSTEMS))
def test_a_systems_planning_modules_live_in_its_room(schedule):
    room = _room(schedule)
    entry = _path(SYSTEMS[schedule])
    assert entry is not None and entry.is_relative_to(_path(room).parent)
    _owns_its_planning(entry, room, schedule)


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


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_every_registered_update_strategy_imports_and_offers_the_protocol(name):
    entry = systems.update(name)
    assert isinstance(entry, UpdateStrategy) and entry.__name__ == UPDATES[name]
    assert all(callable(getattr(entry, n)) for n in ("calibration", "memory", "refusal_note"))
    assert entry.NAME
    spec = load_spec(QUICKSTART, overrides={"parallelism.averaging": name})
    assert systems.update_of(spec) is entry


def test_a_spec_that_names_no_strategy_trains_with_the_plain_update():
    spec = load_spec(QUICKSTART)
    assert spec.parallelism.averaging not in UPDATES
    assert systems.update_of(spec) is PLAIN and isinstance(PLAIN, UpdateStrategy)
    # the synchronous update adds nothing: the same calibration, the same bytes
    cal = object()
    assert PLAIN.calibration(spec, cal) is cal
    assert PLAIN.memory(spec, cal, [[0], [1]], [1.0, 2.0]) == [1.0, 2.0]
    assert PLAIN.refusal_note(spec) == ""


def test_an_update_entry_that_does_not_offer_the_protocol_is_refused(monkeypatch):
    monkeypatch.setitem(UPDATES, "bogus", "jobctl.engine.core.env")
    with pytest.raises(TypeError, match=r"does not offer UpdateStrategy: no \['NAME'"):
        systems.update("bogus")


@pytest.mark.parametrize("name", sorted(UPDATES))
@pytest.mark.parametrize("planner", [SEARCH, RESOLVER], ids=["search", "resolver"])
def test_the_planner_imports_no_module_of_an_update_strategys_room(name, planner):
    room = _update_room(name)
    direct = _imported(planner)
    reached = _reached(planner)
    assert "jobctl.engine.core.systems" in direct | reached  # what it asks instead
    assert [m for m in sorted(direct | reached) if _in(m, room)] == []
    assert [s for s in _strings(planner) if room in s] == []


@pytest.mark.parametrize("name", sorted(UPDATES))
def test_an_update_strategys_planning_modules_live_in_its_room(name):
    room = _update_room(name)
    entry = _path(UPDATES[name])
    assert entry is not None and entry.is_relative_to(_path(room).parent)
    _owns_its_planning(entry, room, room.rsplit(".", 1)[-1])


# Imports the resolver alone, then plans an elastic job whose N models do not fit: the
# refusal names them, so the search priced them through the registry's strategy.
FRESH_UPDATE = """
import json, sys
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.planner.search import PlanError
from jobctl.spec import load_spec
before = sorted(m for m in sys.modules if m.startswith(ROOM))
spec = load_spec(sys.argv[1], overrides=json.loads(sys.argv[2]))
try:
    make_plan(spec)
    why = ""
except PlanError as e:
    why = str(e)
print(json.dumps([before, ENTRY in sys.modules, why]))
"""


def test_the_search_prices_averaging_in_a_fresh_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path))  # the analytic calibration
    overrides = {
        "model.layers": 8,
        "model.hidden": 256,
        "training.micro_batch_size": 1,
        "parallelism.pipeline_stages": "auto",
        "parallelism.data_parallel": 1,
        "parallelism.averaging": "elastic",
        "parallelism.parallel_pipelines": 2,
        "hardware.memory_gb": 0.04,  # one model per stage fits at P >= 3, two do not
    }
    code = FRESH_UPDATE.replace("ROOM", repr(_update_room("elastic")))
    code = code.replace("ENTRY", repr(UPDATES["elastic"]))
    out = subprocess.run(
        [sys.executable, "-c", code, str(QUICKSTART), json.dumps(overrides)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    before, loaded, why = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == [] and loaded  # the registry loaded the strategy, not the import
    assert "with N=2 parallel models and the reference" in why
