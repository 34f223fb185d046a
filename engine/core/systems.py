"""The step systems that plan themselves, by schedule name, each loaded on first use.

A step system is a way of running a step that owns one room end to end: its planner
step, costs, simulator and step engine in one subpackage (Mobius: ``schedule: mobius``,
``engine.mobius``, its planning in ``engine.mobius.planning``). The planner's resolver
imports no room; it asks this registry. ``SYSTEMS`` registers each system by the import
path of its planning entry module, as a packaging entry point names one, and
``system`` imports that module with ``importlib`` the first time it is asked for. A
registry that the systems filled by being imported would miss one whenever nothing had
imported it yet, and ``schedule: auto`` would silently stop considering it; a path
here is always there. The entry module offers ``StepSystem``, what the resolver needs:
``plan`` (a job that names the schedule), ``resolve`` (``auto`` where nothing else
fits), ``faster`` (``auto`` where it is simulated faster than the search's plan),
``NAME`` and ``EXPLAIN`` (its lines). ``tests/unit/test_systems.py`` imports every
entry and checks that it offers the protocol, that the resolver imports no room and
that a system's planning modules live in its room.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from jobctl.engine.core.plan import Plan

if TYPE_CHECKING:
    from jobctl.spec import JobSpec

#: Schedule name -> the import path of the system's planning entry module, in the
#: order ``schedule: auto`` considers them.
SYSTEMS: dict[str, str] = {
    "mobius": "jobctl.engine.mobius.planning.system",
}

#: A system's plan, its simulated step (the system's own result type: its Gantt draws
#: it) and the line that says why the planner chose it.
Planned = tuple[Plan, Any, str]


@runtime_checkable
class StepSystem(Protocol):
    """What a step system's planning entry module offers the resolver. ``cal`` is a
    ``calibration.record.Calibration`` (a layer above this one, hence ``Any``);
    ``devices`` is G, the pool's devices."""

    #: The system in prose, as the resolver names it in an error ("as Mobius: ...").
    NAME: str
    #: The line the resolver refuses a pipeline-schedule simulation of a job that names
    #: the schedule with: where the system's own step is simulated and shown instead.
    EXPLAIN: str

    def plan(self, spec: JobSpec, cal: Any, devices: int, /) -> Plan:
        """The plan of a job whose ``parallelism.schedule`` names this system
        (``PlanError``: it cannot run)."""

    def resolve(self, spec: JobSpec, cal: Any, devices: int, /) -> Planned | None:
        """Under ``schedule: auto``, this system's plan where nothing else fits (None:
        the search plans ``spec``; ``PlanError``: neither this system nor, it says, the
        search can)."""

    def faster(self, spec: JobSpec, cal: Any, devices: int, base: Plan, /) -> Planned | None:
        """Under ``schedule: auto``, this system's plan where its simulated step beats
        ``base`` (the search's plan); None where ``base`` stands."""


@cache
def system(schedule: str) -> StepSystem:
    """The system that plans ``schedule``, its entry module imported on first use
    (``KeyError``: no system is registered under it; ``TypeError``: its entry does
    not offer ``StepSystem``)."""
    path = SYSTEMS[schedule]
    entry = importlib.import_module(path)
    if not isinstance(entry, StepSystem):
        missing = [
            n for n in ("NAME", "EXPLAIN", "plan", "resolve", "faster") if not hasattr(entry, n)
        ]
        raise TypeError(f"{path} (schedule {schedule!r}) does not offer StepSystem: no {missing}")
    return entry


def planned_by(schedule: str) -> StepSystem | None:
    """The system a job naming ``schedule`` is planned by; None: the search plans it."""
    return system(schedule) if schedule in SYSTEMS else None


def every() -> list[StepSystem]:
    """Every registered system, in ``SYSTEMS``' order (each entry imported)."""
    return [system(name) for name in SYSTEMS]
