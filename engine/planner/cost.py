"""Dollars and wall time to finish the whole job, from a plan's predicted step time.

``forecast`` is a pure function of the step time, the layout's devices and nodes, and
a typed ``CostConfig``; ``cost_config`` builds that config from the spec, the
calibration's state bytes and this machine's measured start-up. The wall time is

    T0 = start-up + steps x step + checkpoints x snapshot + the final checkpoint
    T  = T0 / (1 - lambda x (recovery + redo))

where lambda is the pool's preemption rate (``preemptions_per_hour`` per node, times
the nodes used) and each preemption costs a recovery (this machine's measured
recoveries, ``calibration.startup``; until one is measured, detecting the lost node
and a relaunch: ``heartbeat_timeout_s`` + the measured start-up) and, on average, half a
checkpoint interval of steps redone (Varuna sec. 4.6: work since the last checkpoint
is lost). The expected preemptions are lambda x T, so T solves T = T0 + lambda T
(recovery + redo); when lambda (recovery + redo) >= 1 the job never finishes (inf).
The devices are paid for all of T: dollars = devices x price x T / 3600.

The blocking part of a checkpoint is the snapshot of the largest stage's state (the
write and upload run in the background), at this machine's measured snapshot rate
(the supervisor records each run's from its checkpoints, ``calibration.startup``'s
``snapshot`` kind) or, until one is measured, an assumed one; the final checkpoint is
written (and uploaded) before the run ends, at assumed bandwidths. All named below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from jobctl.engine.calibration.record import Calibration
from jobctl.spec import JobSpec

SNAPSHOT_GBYTES_S = 2.0  # host copy of a stage's state, until this machine's is measured
DISK_GBYTES_S = 0.5  # the final checkpoint's local write


@dataclass(frozen=True)
class Pricing:
    """One way to pay for the pool: a price per device-hour and how often it is lost."""

    label: str  # "on-demand" or "spot"
    price_per_hour: float  # USD per device-hour
    preemptions_per_hour: float = 0.0  # per node-hour


@dataclass(frozen=True)
class Measured:
    """This machine's measured start-up and recovery (``calibration.startup``; None:
    not measured here yet)."""

    startup_s: float | None = None
    recovery_s: float | None = None
    snapshot_gbytes_s: float | None = None  # a checkpoint's host copy, GB/s
    # a whole checkpoint's cost in training time (background write and upload too),
    # measured inside runs that checkpointed often (#55), and the bytes a rank copied
    checkpoint_s: float | None = None
    checkpoint_bytes: float | None = None


@dataclass(frozen=True)
class CostConfig:
    """Everything besides the step time that the wall time and dollars depend on."""

    steps: int
    startup_s: float = 0.0  # launch to first step (measured here; 0 when not yet)
    recovery_s: float = 0.0  # one preemption: detection and relaunch
    checkpoint_every: int = 0  # steps between checkpoints; 0: none but the last
    snapshot_s: float = 0.0  # training time one checkpoint costs (blocking and background)
    final_s: float = 0.0  # the last checkpoint's write and upload
    pricings: tuple[Pricing, ...] = ()
    paid: str = "on-demand"  # the label of the pricing the run pays
    startup_measured: bool = True

    def pricing(self, label: str | None = None) -> Pricing:
        """The pricing named ``label`` (default: the one the run pays)."""
        want = label or self.paid
        return next(p for p in self.pricings if p.label == want)


@dataclass(frozen=True)
class Forecast:
    """The whole job on one layout and pricing: wall time, dollars, and where they go."""

    label: str
    devices: int
    nodes: int
    step_s: float
    wall_s: float  # inf: preemptions outpace progress
    usd: float
    hourly_usd: float
    preemptions: float  # expected number
    parts: dict[str, float] = field(default_factory=dict)  # seconds by cause

    @property
    def finishes(self) -> bool:
        return math.isfinite(self.wall_s)


def forecast(
    step_s: float, devices: int, nodes: int, cfg: CostConfig, pricing: Pricing
) -> Forecast:
    """Wall time and dollars to finish ``cfg.steps`` steps on ``devices`` (see module doc)."""
    saves = (cfg.steps - 1) // cfg.checkpoint_every if cfg.checkpoint_every else 0
    parts = {
        "start-up": cfg.startup_s,
        "steps": cfg.steps * step_s,
        "checkpoints": saves * cfg.snapshot_s + cfg.final_s,
    }
    base = sum(parts.values())
    rate = pricing.preemptions_per_hour * nodes / 3600.0  # lambda, per second
    interval = cfg.checkpoint_every or cfg.steps
    lost = cfg.recovery_s + 0.5 * interval * step_s  # per preemption
    wall = base / (1.0 - rate * lost) if rate * lost < 1.0 else math.inf
    parts["preemptions"] = wall - base
    hourly = devices * pricing.price_per_hour
    return Forecast(
        label=pricing.label,
        devices=devices,
        nodes=nodes,
        step_s=step_s,
        wall_s=wall,
        usd=hourly * wall / 3600.0,
        hourly_usd=hourly,
        preemptions=rate * wall,
        parts=parts,
    )


def forecasts(step_s: float, devices: int, nodes: int, cfg: CostConfig) -> list[Forecast]:
    """``forecast`` under every pricing the spec gives (on-demand and spot side by side)."""
    return [forecast(step_s, devices, nodes, cfg, p) for p in cfg.pricings]


def pricings(spec: JobSpec) -> tuple[tuple[Pricing, ...], str]:
    """The pool's pricings (on-demand, spot when a spot price is given) and the label of
    the one the run pays."""
    hw = spec.hardware
    paid = "spot" if hw.spot else "on-demand"
    if hw.spot_price_per_hour is None:  # one price: what the pool costs, spot or not
        rate = hw.preemptions_per_hour if hw.spot else 0.0
        return (Pricing(paid, hw.price_per_hour, rate),), paid
    spot = Pricing("spot", hw.spot_price_per_hour, hw.preemptions_per_hour)
    return (Pricing("on-demand", hw.price_per_hour), spot), paid


def stage_state_bytes(cal: Calibration, stages: list[list[int]]) -> float:
    """The state (weights, gradients, optimizer) of the largest stage: what one rank saves."""
    return max(sum(cal.blocks[b].state_bytes for b in s) for s in stages)


def rank_checkpoint_bytes(cal: Calibration, stages: list[list[int]], D: int) -> float:
    """What one rank copies into a checkpoint, at most: weights and optimizer state
    (no gradients) of its share of a stage's blocks (dealt over the D replicas), the
    measure a checkpoint event's ``snapshot_bytes`` gives."""
    per_stage = (
        sum(cal.blocks[b].state_bytes - cal.blocks[b].param_bytes for b in s) for s in stages
    )
    return max(per_stage) / max(1, D)


def checkpoint_cost_s(state_bytes: float, measured: Measured, rank_bytes: float = 0.0) -> float:
    """Training seconds one checkpoint costs: its whole measured cost, scaled by size,
    where a run here checkpointed a rank's ``rank_bytes`` of a like size (within 2x:
    fixed costs per file and per commit do not scale with bytes, so a far smaller
    run's figure would overprice a large model's); else its blocking copy of
    ``state_bytes`` at the measured snapshot rate; else at the default copy rate."""
    seen, size = measured.checkpoint_s, measured.checkpoint_bytes
    if seen is not None and size and rank_bytes and 0.5 <= rank_bytes / size <= 2.0:
        return seen * rank_bytes / size
    return state_bytes / ((measured.snapshot_gbytes_s or SNAPSHOT_GBYTES_S) * 1e9)


def cost_config(
    spec: JobSpec, state_bytes: float, measured: Measured, rank_bytes: float = 0.0
) -> CostConfig:
    """The ``CostConfig`` of ``spec``: a rank's checkpoint of ``state_bytes``, this
    machine's ``measured`` start-up (not measured yet: 0) and recovery (not measured
    yet: detection, ``elasticity.heartbeat_timeout_s``, and a start-up)."""
    start = measured.startup_s or 0.0
    recovery_s = measured.recovery_s
    if recovery_s is None:
        recovery_s = spec.elasticity.heartbeat_timeout_s + start
    final = state_bytes / (DISK_GBYTES_S * 1e9)
    if spec.checkpoint.remote:  # uploaded over the pool's link before the run ends
        final += state_bytes * 8 / (spec.hardware.interconnect.inter_node_gbps * 1e9)
    found, paid = pricings(spec)
    return CostConfig(
        steps=spec.training.steps,
        startup_s=start,
        recovery_s=recovery_s,
        checkpoint_every=spec.checkpoint.interval,
        snapshot_s=checkpoint_cost_s(state_bytes, measured, rank_bytes),
        final_s=final,
        pricings=found,
        paid=paid,
        startup_measured=measured.startup_s is not None,
    )
