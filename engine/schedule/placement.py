"""Schedules with several stages (model chunks) per device: placement, checks, memory.

The one-stage-per-device format (``list[list[Action]]``, one list per stage) cannot say
in which order a device interleaves the work of two stages it hosts, so a multi-chunk
schedule is given per *device*: an ordered list of ``Placed(stage, action)``. The model
is cut into S stages; ``placement[d]`` names the stages device d hosts.

* ``v_placement(P)``: the V shape of ZB-V (arXiv 2401.10241, sec. 6): S = 2P stages,
  device d hosts stage d (going down) and stage 2P-1-d (coming back up), so the last
  device hosts stages P-1 and P and the first device the first and the last stage.
* ``stage_lists``: the per-stage lists (the classic format) a device schedule runs;
  every per-stage rule of ``checks`` applies to them.
* ``validate_devices``: the stage rules plus the device rules (each action on a device
  that hosts its stage; the device lists run to completion in data-flow order).
* ``device_peaks``: the most micro-batches of stage activations a device holds at once,
  counted in stages (a V device holding one micro-batch of both its chunks holds 2).

Compact form of one placed action: ``F3@5`` (forward of micro-batch 3 on stage 5).
"""

from __future__ import annotations

from typing import NamedTuple

from jobctl.engine.core.actions import Action, Op, recomputed, weight_split
from jobctl.engine.schedule.checks import ActivationPeak, _check_stage

__all__ = [
    "Placed",
    "device_peaks",
    "device_text",
    "format_devices",
    "parse_placed",
    "stage_lists",
    "v_placement",
    "validate_devices",
]


class Placed(NamedTuple):
    """One action of a device's list, on one of the stages the device hosts."""

    stage: int
    action: Action

    def __str__(self) -> str:
        return f"{self.action}@{self.stage}"


def v_placement(P: int) -> list[tuple[int, int]]:
    """ZB-V's V shape: device d hosts stages d and 2P-1-d of 2P."""
    if P < 1:
        raise ValueError(f"need P >= 1 devices, got P={P}")
    return [(d, 2 * P - 1 - d) for d in range(P)]


def format_devices(devices: list[list[Placed]]) -> str:
    """One line per device: ``D0: F0@0 F1@0 F0@3 B0@3``."""
    return "\n".join(f"D{d}: {' '.join(map(str, acts))}" for d, acts in enumerate(devices))


def device_text(acts: list[Placed]) -> str:
    """One device's list in compact form, ``F0@0 F0@3 B0@3`` (a plan's
    ``device_actions``); ``parse_placed`` reads it back."""
    return " ".join(map(str, acts))


def parse_placed(text: str) -> list[Placed]:
    """Inverse of ``device_text``."""
    out = []
    for tok in text.split():
        action, _, stage = tok.partition("@")
        if not stage.isdigit():
            raise ValueError(f"{tok!r} is not a placed action such as 'F3@5'")
        out.append(Placed(int(stage), Action.parse(action)))
    return out


def stage_lists(devices: list[list[Placed]], S: int) -> list[list[Action]]:
    """Per stage, its actions in the order its device runs them."""
    stages: list[list[Action]] = [[] for _ in range(S)]
    for acts in devices:
        for s, a in acts:
            if not 0 <= s < S:
                raise ValueError(f"{a}@{s}: stage {s} is outside stages 0..{S - 1}")
            stages[s].append(a)
    return stages


def validate_devices(devices: list[list[Placed]], placement: list[tuple[int, ...]], M: int) -> None:
    """Raise ValueError, naming device, stage, action and position, if invalid.

    Per device: every action is on a stage the device hosts, and every stage is hosted
    by exactly one device. Per stage: the rules of ``checks.validate`` (one F and one B
    per micro-batch, R and W in place). Across devices: the lists run to completion,
    a forward on stage s waiting for stage s-1's and a backward for stage s+1's.
    """
    if len(devices) != len(placement):
        raise ValueError(f"schedule has {len(devices)} devices, the placement {len(placement)}")
    hosts = [s for stages in placement for s in stages]
    S = len(hosts)
    if sorted(hosts) != list(range(S)):
        raise ValueError(f"placement {placement} must host each of stages 0..{S - 1} once")
    for d, acts in enumerate(devices):
        for k, (s, a) in enumerate(acts):
            if s not in placement[d]:
                raise ValueError(
                    f"device {d}: {a}@{s} at position {k} is on stage {s}, but the "
                    f"device hosts stages {placement[d]}"
                )
    for s, acts in enumerate(stage_lists(devices, S)):
        _check_stage(s, acts, M)
    _check_devices_feasible(devices, S)


def _check_devices_feasible(devices: list[list[Placed]], S: int) -> None:
    """Run the device lists in data-flow order; every device must reach its end."""
    pos = [0] * len(devices)
    done: set[Placed] = set()
    progress = True
    while progress:
        progress = False
        for d, acts in enumerate(devices):
            while pos[d] < len(acts) and _ready(acts[pos[d]], S, done):
                done.add(acts[pos[d]])
                pos[d] += 1
                progress = True
    blocked = [d for d in range(len(devices)) if pos[d] < len(devices[d])]
    if blocked:
        waits = "; ".join(
            f"device {d} waits at {devices[d][pos[d]]} (position {pos[d]}) for "
            f"{_needed(devices[d][pos[d]], S)}"
            for d in blocked
        )
        raise ValueError(f"schedule deadlocks: {waits}")


def _ready(p: Placed, S: int, done: set[Placed]) -> bool:
    need = _needed(p, S)
    return need is None or need in done


def _needed(p: Placed, S: int) -> Placed | None:
    """The action on another stage whose output ``p`` needs, or None."""
    s, a = p
    if a.op is Op.FORWARD and s > 0:
        return Placed(s - 1, a)
    if a.op is Op.BACKWARD and s < S - 1:
        return Placed(s + 1, a)
    return None


def device_peaks(devices: list[list[Placed]]) -> list[ActivationPeak]:
    """Per device, the most stage micro-batches held at once, full and stashed.

    Each stage counts as ``checks.peak_activations`` does (an F kept until its B, or its
    W on a split stage; a recomputed F holds its input until the R); a device's count
    is the sum over the stages it hosts, in the device's order.
    """
    peaks = []
    for acts in devices:
        stages = {s for s, _ in acts}
        per = {s: [a for t, a in acts if t == s] for s in stages}
        rec = {s: recomputed(per[s]) for s in stages}
        split = {s: weight_split(per[s]) for s in stages}
        full = stashed = top_full = top_stashed = 0
        for s, a in acts:
            again = a.micro_batch in rec[s]
            if a.op is Op.FORWARD:
                full, stashed = full + (not again), stashed + again
            elif a.op is Op.RECOMPUTE:
                full, stashed = full + 1, stashed - 1
            elif a.op is Op.WEIGHT or a.micro_batch not in split[s]:
                full -= 1
            top_full, top_stashed = max(top_full, full), max(top_stashed, stashed)
        peaks.append(ActivationPeak(top_full, top_stashed))
    return peaks
