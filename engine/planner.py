"""Resolve a JobSpec into a Plan: P, D, micro-batching, partition, placement, schedule.

Explicit values in the spec are honoured; ``auto`` picks the smallest P whose stages
fit device memory (Varuna sec. 4.4 sweeps P upward from there), D = floor(G / P), and
the largest micro-batch that still gives every pipeline at least P micro-batches.
Blocks are split over stages by an exact min-max partition of their analytic cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from .costs import ModelCosts, model_costs
from .partition import partition
from .plan import Plan, Prediction, RankPlan, StagePlan
from .schedules import generate

GB = 1024**3


class PlanError(ValueError):
    """The spec asks for a layout that cannot exist; the message says what would fit."""


@dataclass(frozen=True)
class Layout:
    """The integer choices of a plan before placement."""

    P: int
    D: int
    m: int
    schedule: str


def pool_size(spec) -> int:
    """Devices in the spec's hardware pool."""
    return spec.hardware.nodes * spec.hardware.processes_per_node


def make_plan(spec, devices: int | None = None, costs: ModelCosts | None = None) -> Plan:
    """The plan for ``spec`` on ``devices`` devices (default: the whole pool)."""
    G = devices if devices is not None else pool_size(spec)
    if G < 1:
        raise PlanError("no devices available: the pool is empty")
    costs = costs or model_costs(spec)
    layout = choose_layout(spec, G, costs)
    return build_plan(spec, layout, costs)


def choose_layout(spec, G: int, costs: ModelCosts) -> Layout:
    """Pick P, D, m and the schedule name for G devices."""
    par, B = spec.parallelism, spec.training.global_batch_size
    n = costs.num_blocks
    if isinstance(par.pipeline_stages, int):
        P = par.pipeline_stages
        if n < P:
            raise PlanError(f"parallelism.pipeline_stages={P}: the model has only {n} blocks")
    else:
        P = smallest_fitting_P(spec, costs, min(n, G))
    D = par.data_parallel if isinstance(par.data_parallel, int) else max(1, G // P)
    if isinstance(par.data_parallel, str):
        while D > 1 and B % D:
            D -= 1
    if P * D > G:
        raise PlanError(
            f"P x D = {P} x {D} = {P * D} devices, but only {G} are available: "
            "lower parallelism.pipeline_stages or data_parallel, or add nodes"
        )
    if B % D:
        raise PlanError(f"training.global_batch_size={B} is not divisible by D={D}")
    m = choose_micro_batch(spec, B // D, P)
    schedule = "1f1b" if par.schedule == "auto" else par.schedule
    return Layout(P, D, m, schedule)


def smallest_fitting_P(spec, costs: ModelCosts, max_P: int) -> int:
    """Smallest P whose heaviest stage fits one device's memory."""
    cap = spec.hardware.memory_gb * GB
    for P in range(1, max_P + 1):
        stages = partition(costs.param_bytes, P)
        if max(costs.stage_memory(s, in_flight=P - k) for k, s in enumerate(stages)) <= cap:
            return P
    raise PlanError(
        f"the model does not fit {max_P} stages of {spec.hardware.memory_gb} GB: "
        "raise hardware.memory_gb, add devices, or use a smaller model"
    )


def choose_micro_batch(spec, per_replica: int, P: int) -> int:
    """Explicit micro-batch size, or the largest divisor giving >= P micro-batches."""
    m = spec.training.micro_batch_size
    if isinstance(m, int):
        if per_replica % m:
            raise PlanError(
                f"training.micro_batch_size={m} does not divide the per-replica batch "
                f"{per_replica} (global_batch_size / D): pick a divisor of {per_replica}"
            )
        return m
    divisors = [d for d in range(1, per_replica + 1) if per_replica % d == 0]
    fill = [d for d in divisors if per_replica // d >= P]
    return max(fill) if fill else 1


def build_plan(spec, layout: Layout, costs: ModelCosts) -> Plan:
    """Partition, place and schedule a chosen layout."""
    P, D, m = layout.P, layout.D, layout.m
    M = spec.training.global_batch_size // (D * m)
    stages = partition(costs.flops, P)
    schedule = generate(layout.schedule, P, M, **schedule_options(spec, layout))
    ranks = place(P, D, spec.hardware.processes_per_node, spec.parallelism.placement)
    stage_plans = [
        StagePlan(
            index=s,
            blocks=blocks,
            ranks=[r.rank for r in sorted(ranks, key=lambda r: r.replica) if r.stage == s],
            recompute=any(a.op.value == "R" for a in schedule[s]),
            actions=" ".join(str(a) for a in schedule[s]),
        )
        for s, blocks in enumerate(stages)
    ]
    nodes = max(r.node for r in ranks) + 1
    return Plan(
        P=P,
        D=D,
        micro_batch_size=m,
        micro_batches=M,
        global_batch_size=spec.training.global_batch_size,
        schedule=layout.schedule,
        nodes=nodes,
        processes_per_node=min(spec.hardware.processes_per_node, P * D),
        device=spec.hardware.device,
        block_names=costs.names,
        stages=stage_plans,
        ranks=ranks,
        prediction=predict(spec, layout, costs, stages),
    )


def schedule_options(spec, layout: Layout) -> dict:
    """Generator options the spec sets (recompute, advance_num)."""
    par = spec.parallelism
    opts: dict = {}
    if layout.schedule in ("gpipe", "1f1b") and par.recompute == "all":
        opts["recompute"] = True
    if layout.schedule == "advance_forward" and par.advance_num is not None:
        opts["advance_num"] = par.advance_num
    return opts


def place(P: int, D: int, per_node: int, placement: str) -> list[RankPlan]:
    """Map ranks to (stage, replica) and nodes.

    ``stage_major`` puts the replicas of one stage next to each other, so the
    data-parallel allreduce (the heavy traffic) stays inside a node where it can;
    ``pipeline_major`` keeps each pipeline's stages together instead.
    """
    out = []
    for rank in range(P * D):
        if placement == "pipeline_major":
            stage, replica = rank % P, rank // P
        else:
            stage, replica = rank // D, rank % D
        out.append(
            RankPlan(
                rank=rank,
                node=rank // per_node,
                local_rank=rank % per_node,
                stage=stage,
                replica=replica,
            )
        )
    return out


def predict(spec, layout: Layout, costs: ModelCosts, stages: list[list[int]]) -> Prediction:
    """Analytic prediction (compute-bound 1F1B bubble model)."""
    P, D, m = layout.P, layout.D, layout.m
    M = spec.training.global_batch_size // (D * m)
    rate = costs.device_flops
    stage_time = [3.0 * m * sum(costs.flops[i] for i in s) / rate for s in stages]
    step = (M + P - 1) * max(stage_time)
    samples = spec.training.global_batch_size / step
    price = spec.hardware.price_per_hour * P * D
    return Prediction(
        step_time_s=step,
        samples_per_s=samples,
        memory_per_stage_gb=[
            costs.stage_memory(s, in_flight=min(M, P - k)) / GB for k, s in enumerate(stages)
        ],
        bubble_ratio=(P - 1) / (M + P - 1),
        cost_per_1k_samples=price / 3600.0 / samples * 1000.0,
        source="analytic",
    )
