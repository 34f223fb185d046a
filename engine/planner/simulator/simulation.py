"""Event-driven simulation of one training step of a pipeline schedule (Varuna sec. 4.4).

``simulate(stages, costs, seed)`` runs the per-stage action lists under a ``CostModel``:
per-stage compute times, per-boundary activation and gradient send times with seeded
jitter, a bound on concurrent sends, the data-parallel allreduce and optimizer step
after each stage's last backward, and optionally Varuna's opportunistic deviation. It
returns a ``SimResult`` with the step time, busy/idle time per stage, the bubble ratio,
peak activations and the full timeline. The planner calls it for every candidate layout,
so its engine (``simulator.engine``) works on plain lists and builds event objects only
when ``SimResult.events`` is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from jobctl.engine.core.actions import Action
from jobctl.engine.core.plan import idle_share
from jobctl.engine.planner.simulator.engine import Engine
from jobctl.engine.schedule.checks import ActivationPeak, peak_activations

__all__ = ["CostModel", "SimEvent", "SimResult", "simulate"]


@dataclass(frozen=True)
class CostModel:
    """Times (any one unit, e.g. seconds) for every kind of work in a step.

    Per stage s: ``f[s]`` forward, ``b[s]`` backward, ``r[s]`` recompute (default
    ``f``), ``ar[s]`` gradient allreduce among the data-parallel replicas of stage s,
    run after the stage's last backward (all stages' allreduces run concurrently),
    ``opt[s]`` optimizer step after it, ``w[s]`` the weight-gradient share of ``b[s]``
    (default ``b / 2``: a matrix product's input and weight gradients cost the same):
    on a stage whose list splits its backwards (``W`` actions, zero bubble), B takes
    ``b - w`` and W takes ``w``. Per boundary s (between stages s and s+1, P-1 of
    them): ``act[s]`` send time of an activation s -> s+1, ``grad[s]`` of a gradient
    s+1 -> s. Empty tuples mean the default (``f`` for ``r``, zeros otherwise).

    ``jitter``: relative standard deviation of every send time; each send takes
    ``base * max(0, 1 + jitter * z)``, z standard normal, seeded per send.
    ``max_inflight_sends``: how many sends a stage keeps in flight at once (None: no
    limit); more wait in issue order. ``opportunistic``: Varuna's deviation (sec. 3.2):
    when a stage reaches a backward task whose gradient has not arrived (R(i) followed
    by its B(i), or a B(i) without recompute; never between R(i) and B(i), rule 2), it
    runs the next forward of its list first if that forward's input is there and the
    stage stays within the list's own activation peaks (``peak_activations``).
    """

    f: Sequence[float]
    b: Sequence[float]
    r: Sequence[float] = ()
    act: Sequence[float] = ()
    grad: Sequence[float] = ()
    jitter: float = 0.0
    max_inflight_sends: int | None = None
    ar: Sequence[float] = ()
    opt: Sequence[float] = ()
    opportunistic: bool = False
    w: Sequence[float] = ()

    def __post_init__(self) -> None:
        P = len(self.f)
        if P < 1:
            raise ValueError("CostModel needs at least one stage: f is empty")
        defaults = {"r": tuple(self.f), "act": (0.0,) * (P - 1), "grad": (0.0,) * (P - 1)}
        defaults["w"] = tuple(float(x) / 2 for x in self.b)
        for name in ("f", "b", "r", "act", "grad", "ar", "opt", "w"):
            value = tuple(float(x) for x in getattr(self, name))
            if not value:
                value = defaults.get(name, (0.0,) * P)
            want = P - 1 if name in ("act", "grad") else P
            if len(value) != want:
                raise ValueError(f"CostModel.{name} has {len(value)} values, expected {want}")
            if any(x < 0 for x in value):
                raise ValueError(f"CostModel.{name} has a negative time: {value}")
            object.__setattr__(self, name, value)
        if any(w > b for w, b in zip(self.w, self.b, strict=True)):
            raise ValueError(f"CostModel.w {self.w} exceeds the whole backward b {self.b}")
        if self.jitter < 0:
            raise ValueError(f"CostModel.jitter must be >= 0, got {self.jitter}")
        if self.max_inflight_sends is not None and self.max_inflight_sends < 1:
            raise ValueError(
                f"CostModel.max_inflight_sends must be >= 1 or None, got {self.max_inflight_sends}"
            )

    @property
    def P(self) -> int:  # noqa: N802 - names from the papers
        """Number of pipeline stages."""
        return len(self.f)

    @classmethod
    def uniform(
        cls, P: int, f: float = 1.0, b: float = 2.0, comm: float = 0.0, **options: Any
    ) -> CostModel:
        """Identical stages; ``comm`` is both send times; ``options`` set other fields."""
        sends = (comm,) * (P - 1)
        return cls(f=(f,) * P, b=(b,) * P, act=sends, grad=sends, **options)


@dataclass(frozen=True)
class SimEvent:
    """One interval on the timeline.

    ``kind`` is ``compute`` (``action`` is the F/R/B/W that ran on ``stage``),
    ``send_activation`` / ``send_gradient`` (``stage`` is the sender, ``action`` the F
    or B whose output is sent; the interval is the time on the wire), ``allreduce`` or
    ``optimizer`` (``action`` is None).
    """

    stage: int
    action: Action | None
    start: float
    end: float
    kind: str = "compute"


@dataclass(frozen=True)
class SimResult:
    """Outcome of one simulated step.

    ``step_time``: until the last optimizer step ends. ``pipeline_time``: until the
    last compute action ends (the pipeline flush, before allreduce). ``busy[s]``:
    compute time of stage s; ``idle[s] = pipeline_time - busy[s]``; ``stage_end[s]``:
    when stage s's last compute action ends (its allreduce and optimizer step follow).

    ``bubble_ratio`` is Merak's (sec. 5.1): bubble (idle) time over computation
    running time of the critical stage, the one with the most compute:
    ``(pipeline_time - max(busy)) / max(busy)``. With uniform stages every stage has
    the same busy time and this equals ``(P * T - sum(busy)) / sum(busy)``; with
    Merak's shifted critical path the last stage does less, and only this form gives
    the paper's 3(P-2)/(4M).

    ``executed[s]``: the order stage s actually ran (differs from its list only with
    ``opportunistic``); ``deviations``: how many forwards ran ahead of their turn.
    """

    step_time: float
    pipeline_time: float
    busy: tuple[float, ...]
    idle: tuple[float, ...]
    stage_end: tuple[float, ...]
    bubble_ratio: float
    executed: list[list[Action]]
    deviations: int
    _engine: Engine = field(repr=False, compare=False)

    @property
    def idle_share(self) -> float:
        """The busiest device's idle share of the pipeline's wall time, in [0, 1)."""
        return idle_share(self.bubble_ratio)

    @cached_property
    def events(self) -> list[SimEvent]:
        """Every compute, send, allreduce and optimizer interval, grouped by stage:
        each action in executed order followed by the send of its output, then the
        stage's allreduce and optimizer step."""
        return [SimEvent(*entry) for entry in self._engine.timeline()]

    def recosted(self, costs: CostModel) -> SimResult:
        """This step under ``costs`` that differ from the simulated ones in ``ar`` and
        ``opt`` only: they run after each stage's last action and change nothing before
        it, so only the step time (and the timeline's tail) moves (the planner's D
        variants with one M share a pipeline)."""
        ends = zip(self.stage_end, costs.ar, costs.opt, strict=True)
        step = max(e + a + o for e, a, o in ends)
        return replace(self, step_time=step, _engine=self._engine.recosted(costs))

    @cached_property
    def peak_activations(self) -> list[ActivationPeak]:
        """Per stage, the most micro-batches held at once in the executed order."""
        return [peak_activations(actions) for actions in self.executed]


def simulate(stages: list[list[Action]], costs: CostModel, seed: int = 0) -> SimResult:
    """Simulate one step of ``stages`` (one action list per stage) under ``costs``.

    ``seed`` fixes the send-time jitter; each send's draw depends only on its
    direction, boundary and micro-batch, so strict and opportunistic runs of the same
    schedule see the same network. The lists are assumed valid
    (``schedule.checks.validate``); a wait cycle raises ValueError.
    """
    if len(stages) != costs.P:
        raise ValueError(f"schedule has {len(stages)} stages but the cost model has {costs.P}")
    engine = Engine(stages, costs, seed)
    engine.run()
    busy = tuple(engine.busy())
    critical = max(busy)
    pipeline_time = max(engine.free)
    return SimResult(
        step_time=engine.step_time(),
        pipeline_time=pipeline_time,
        busy=busy,
        idle=tuple(pipeline_time - x for x in busy),
        stage_end=tuple(engine.free),
        bubble_ratio=(pipeline_time - critical) / critical if critical > 0 else 0.0,
        executed=engine.lists,
        deviations=engine.deviations,
        _engine=engine,
    )
