"""The step systems that plan themselves (by schedule name) and the update strategies
the search prices (by ``parallelism.averaging``), each loaded on first use.

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

An update strategy is a different kind of entry: a way of updating the weights that
combines with every pipeline schedule rather than replacing it (AvgPipe's elastic
averaging, ``parallelism.averaging: elastic``: N parallel models of each stage pulled
towards a reference, its planning in ``engine.averaging.planning``). It plans no job;
the planner's search prices it inside each layout it weighs, so ``UPDATES`` names its
entry by the ``parallelism.averaging`` value, loaded the same way, and
``UpdateStrategy`` is what the search (and Mobius's fit check) needs from it: the
calibration a step is priced with, each stage's memory with the strategy's models, and
what a memory refusal adds. ``update_of`` gives ``PLAIN``, the synchronous update that
adds nothing, where a spec names none. The (M, N) tuner is not part of it: it runs
before the planner (it resolves ``auto`` into a spec the planner then plans), from the
room itself.
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

#: ``parallelism.averaging`` -> the import path of the update strategy's planning entry
#: module ("none", the synchronous update, is ``PLAIN`` and needs no entry).
UPDATES: dict[str, str] = {
    "elastic": "jobctl.engine.averaging.planning.strategy",
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


@runtime_checkable
class UpdateStrategy(Protocol):
    """What an update strategy's planning entry module offers the planner's search.
    ``cal`` is a ``calibration.record.Calibration`` (a layer above, hence ``Any``);
    ``stages`` are each stage's block indices."""

    #: The strategy in prose.
    NAME: str

    def calibration(self, spec: JobSpec, cal: Any, /) -> Any:
        """``cal`` with the strategy's work per step folded into each block's costs
        (AvgPipe: the optimizer step N times), what the search prices a step with
        (``ValueError``: the spec leaves the strategy's settings unresolved)."""

    def memory(
        self, spec: JobSpec, cal: Any, stages: list[list[int]], one: list[float], /
    ) -> list[float]:
        """Each stage's bytes with the strategy's models, from ``one``: the bytes the
        search prices for one model (state, the schedule's activation peak)."""

    def refusal_note(self, spec: JobSpec, /) -> str:
        """What a memory refusal adds when the strategy's models take part in it
        ("" or a clause that starts with a space)."""


class _Plain:
    """The synchronous update (``parallelism.averaging: none``): one model, nothing
    added to its step or its memory."""

    NAME = "the synchronous update"

    def calibration(self, spec: JobSpec, cal: Any, /) -> Any:
        return cal

    def memory(
        self, spec: JobSpec, cal: Any, stages: list[list[int]], one: list[float], /
    ) -> list[float]:
        return one

    def refusal_note(self, spec: JobSpec, /) -> str:
        return ""


PLAIN: UpdateStrategy = _Plain()


def _load(path: str, protocol: type, names: tuple[str, ...], key: str) -> Any:
    """The entry module at ``path``, imported; ``TypeError`` (naming what it lacks of
    ``names``) where it does not offer ``protocol``."""
    entry = importlib.import_module(path)
    if not isinstance(entry, protocol):
        missing = [n for n in names if not hasattr(entry, n)]
        raise TypeError(f"{path} ({key}) does not offer {protocol.__name__}: no {missing}")
    return entry


@cache
def system(schedule: str) -> StepSystem:
    """The system that plans ``schedule``, its entry module imported on first use
    (``KeyError``: no system is registered under it; ``TypeError``: its entry does
    not offer ``StepSystem``)."""
    names = ("NAME", "EXPLAIN", "plan", "resolve", "faster")
    return _load(SYSTEMS[schedule], StepSystem, names, f"schedule {schedule!r}")


def planned_by(schedule: str) -> StepSystem | None:
    """The system a job naming ``schedule`` is planned by; None: the search plans it."""
    return system(schedule) if schedule in SYSTEMS else None


def every() -> list[StepSystem]:
    """Every registered system, in ``SYSTEMS``' order (each entry imported)."""
    return [system(name) for name in SYSTEMS]


@cache
def update(name: str) -> UpdateStrategy:
    """The update strategy ``parallelism.averaging: <name>`` names, its entry module
    imported on first use (``KeyError``: none is registered under it; ``TypeError``:
    its entry does not offer ``UpdateStrategy``)."""
    names = ("NAME", "calibration", "memory", "refusal_note")
    return _load(UPDATES[name], UpdateStrategy, names, f"averaging {name!r}")


def update_of(spec: JobSpec) -> UpdateStrategy:
    """The update strategy ``spec`` trains with: the one its ``parallelism.averaging``
    names, or ``PLAIN`` where that is none."""
    name = spec.parallelism.averaging
    return update(name) if name in UPDATES else PLAIN
