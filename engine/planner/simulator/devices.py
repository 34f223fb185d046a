"""One simulated step of a schedule with several stages per device (ZB-V's V shape).

``simulate_devices(devices, costs)`` runs per-device lists of ``Placed`` actions
(``schedule.placement``) under a ``CostModel`` over the S stages the model is cut
into: a device runs its list in order, each action starting when the device is free
and its input has arrived (an activation from stage s-1 for F, a gradient from stage
s+1 for B). A send between two stages on the same device is a hand-over in memory and
takes no time; across devices it takes ``act[s]`` / ``grad[s]`` of the boundary. A
stage with W actions splits its backward (B takes ``b - w``, W takes ``w``), as in
``simulation``. After a device's last action come its stages' allreduces and
optimizer steps, one after the other. Send jitter, a send cap and Varuna's
opportunistic deviation are not modelled here (the V schedules do not use them); a
cost model asking for them is refused.

Start times follow by propagation along data flow, as in ``simulator.engine``: a
device advances while the input of its next action is known.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobctl.engine.core.actions import Action, Op
from jobctl.engine.core.plan import idle_share
from jobctl.engine.planner.simulator.simulation import CostModel
from jobctl.engine.schedule.checks import ActivationPeak
from jobctl.engine.schedule.placement import Placed, device_peaks

__all__ = ["DeviceEvent", "DeviceSimResult", "simulate_devices"]


@dataclass(frozen=True)
class DeviceEvent:
    """One compute interval: ``placed`` ran on ``device`` from ``start`` to ``end``."""

    device: int
    placed: Placed
    start: float
    end: float


@dataclass(frozen=True)
class DeviceSimResult:
    """Outcome of one simulated step, per device.

    ``step_time``: until the last optimizer step ends; ``pipeline_time``: until the
    last compute action ends. ``busy[d]``: compute time of device d (all its stages);
    ``bubble_ratio``: Merak's (sec. 5.1), idle time of the busiest device over its
    compute, ``(pipeline_time - max(busy)) / max(busy)``. ``peaks[d]``: the most stage
    micro-batches device d holds at once (``placement.device_peaks``).
    """

    step_time: float
    pipeline_time: float
    busy: tuple[float, ...]
    bubble_ratio: float
    peaks: list[ActivationPeak]
    events: list[DeviceEvent]

    @property
    def idle_share(self) -> float:
        """The busiest device's idle share of the pipeline's wall time, in [0, 1)."""
        return idle_share(self.bubble_ratio)

    @property
    def executed(self) -> list[list[Action]]:
        """Per stage, its actions in the order they ran (``SimResult.executed``'s view;
        a device runs its list in order, so this is each stage's share of it)."""
        out: list[list[Action]] = [[] for _ in range(1 + max(e.placed.stage for e in self.events))]
        for e in self.events:
            out[e.placed.stage].append(e.placed.action)
        return out


def simulate_devices(devices: list[list[Placed]], costs: CostModel) -> DeviceSimResult:
    """Simulate one step of ``devices`` (valid per ``placement.validate_devices``)."""
    if costs.jitter or costs.max_inflight_sends is not None or costs.opportunistic:
        raise ValueError("simulate_devices models no send jitter, send cap or deviation")
    home = {s: d for d, acts in enumerate(devices) for s, _ in acts}
    if sorted(home) != list(range(costs.P)):
        raise ValueError(
            f"the devices' stages {sorted(home)} are not the cost model's 0..{costs.P - 1}"
        )
    split = {s for acts in devices for s, a in acts if a.op is Op.WEIGHT}
    free, events = _propagate(devices, costs, home, split)
    busy = tuple(sum(e.end - e.start for e in events if e.device == d) for d in range(len(devices)))
    pipeline = max(free)
    tails = [
        sum(costs.ar[s] + costs.opt[s] for s in set(home) if home[s] == d)
        for d in range(len(devices))
    ]
    critical = max(busy)
    return DeviceSimResult(
        step_time=max(f + t for f, t in zip(free, tails, strict=True)),
        pipeline_time=pipeline,
        busy=busy,
        bubble_ratio=(pipeline - critical) / critical if critical > 0 else 0.0,
        peaks=device_peaks(devices),
        events=events,
    )


def _propagate(
    devices: list[list[Placed]], costs: CostModel, home: dict[int, int], split: set[int]
) -> tuple[list[float], list[DeviceEvent]]:
    """Run every device as far as its inputs are known, until all are done."""
    S, pos, free = costs.P, [0] * len(devices), [0.0] * len(devices)
    arrival: dict[Placed, float] = {}  # output of an F or B at the stage that reads it
    events: list[DeviceEvent] = []
    progress = True
    while progress:
        progress = False
        for d, acts in enumerate(devices):
            while pos[d] < len(acts):
                p = acts[pos[d]]
                ready = _input(p, S, arrival)
                if ready is None:
                    break
                start = max(free[d], ready)
                free[d] = end = start + _cost(p, costs, split)
                events.append(DeviceEvent(d, p, start, end))
                _send(p, end, costs, home, arrival)
                pos[d] += 1
                progress = True
    stuck = [
        f"device {d} at {devices[d][pos[d]]}"
        for d in range(len(devices))
        if pos[d] < len(devices[d])
    ]
    if stuck:
        raise ValueError(f"schedule deadlocks in simulation: {', '.join(stuck)}")
    return free, events


def _input(p: Placed, S: int, arrival: dict[Placed, float]) -> float | None:
    """When the input of ``p`` is there (0 for none needed), None if not computed yet."""
    s, a = p
    if (a.op is Op.FORWARD and s > 0) or (a.op is Op.BACKWARD and s < S - 1):
        return arrival.get(p)
    return 0.0


def _cost(p: Placed, costs: CostModel, split: set[int]) -> float:
    s, op = p.stage, p.action.op
    if op is Op.FORWARD:
        return costs.f[s]
    if op is Op.RECOMPUTE:
        return costs.r[s]
    if op is Op.WEIGHT:
        return costs.w[s]
    return costs.b[s] - costs.w[s] if s in split else costs.b[s]


def _send(
    p: Placed, end: float, costs: CostModel, home: dict[int, int], arrival: dict[Placed, float]
) -> None:
    """Record when the output of an F or B reaches the stage that reads it."""
    s, a = p
    if a.op is Op.FORWARD and s < costs.P - 1:
        dst, wire = s + 1, costs.act[s]
    elif a.op is Op.BACKWARD and s > 0:
        dst, wire = s - 1, costs.grad[s - 1]
    else:
        return
    arrival[Placed(dst, a)] = end + (0.0 if home[dst] == home[s] else wire)
