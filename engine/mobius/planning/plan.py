"""A ``parallelism.schedule: mobius`` job as a Plan (Mobius, Feng et al., ASPLOS '23).

The job names S (``parallelism.pipeline_stages``), more stages than the N devices
of the pool. The sec. 3.2 MIP (``partition.mobius_partition``, HiGHS) cuts the calibrated
blocks into exactly S stages for the least step time under ``hardware.memory_gb``
per device; with ``hardware.topology`` on one node the sec. 3.3 cross mapping puts
adjacent stages under different root complexes, else stage j runs on rank j % N.
The plan has P = N ranks, D = T = 1; ``Plan.stages[r]`` lists every block rank r
hosts (its checkpoint part), ``Plan.mobius`` the stages themselves
(``core.plan.MobiusLayout``). The micro-batch size is the spec's, or under ``auto``
the largest one that gives at least N micro-batches.
"""

from __future__ import annotations

from jobctl.engine.calibration.record import Calibration
from jobctl.engine.core.plan import MobiusLayout, Plan, Prediction, RankPlan, StagePlan
from jobctl.engine.mobius.planning.costs import (
    LayerCost,
    MobiusConfig,
    layer_costs,
    stage_sums,
    step_time,
)
from jobctl.engine.mobius.planning.cross_mapping import (
    Topology,
    contention,
    cross_mapping,
    topology_of,
)
from jobctl.engine.mobius.planning.partition import MobiusPartition, mobius_partition
from jobctl.engine.planner.search import PlanError
from jobctl.engine.planner.sizing import GB
from jobctl.spec import JobSpec
from jobctl.spec.cost import run_price

#: B, the tier's bandwidth the MIP assumes (not measured yet): local disk through the
#: page cache on a CPU device, PCIe 3.0 x16 on CUDA.
TIER_BPS = {"cpu": 2e9, "cuda": 12e9}


def micro_batch(spec: JobSpec, N: int) -> int:
    """m: the spec's, or the largest divisor of the global batch giving M >= N."""
    B, m = spec.training.global_batch_size, spec.training.micro_batch_size
    if isinstance(m, int):
        return m
    return max(d for d in range(1, B + 1) if B % d == 0 and B // d >= min(N, B))


def mobius_plan(spec: JobSpec, cal: Calibration, N: int) -> Plan:
    """The Mobius plan of ``spec`` on ``N`` devices (``PlanError``: it cannot run)."""
    S = spec.parallelism.pipeline_stages
    if not isinstance(S, int) or S <= N:
        raise PlanError(
            f"parallelism.pipeline_stages {S}: a Mobius pipeline has more stages than its "
            f"{N} devices; raise it above {N}"
        )
    m = micro_batch(spec, N)
    M = spec.training.global_batch_size // m
    layers = layer_costs(cal, m, M)
    try:
        part = mobius_partition(layers, _config(spec, N, M, S), S)
    except ValueError as err:
        raise PlanError(
            f"{err}: {S} stages of this model do not fit {spec.hardware.memory_gb} GB per "
            "device; raise parallelism.pipeline_stages or hardware.memory_gb"
        ) from None
    layout = _layout(spec, part, N)
    pred = _prediction(spec, cal, layers, layout, m)
    _check_budget(spec, pred)
    return _plan(spec, cal, layout, m, pred)


def _config(spec: JobSpec, N: int, M: int, S: int) -> MobiusConfig:
    """The MIP's machine for N ranks, M micro-batches and S stages: the one that cuts
    a plan (``mobius_plan``) and the one that prices its re-cuts (``cut_step_s``)."""
    return MobiusConfig(
        devices=N,
        memory_bytes=spec.hardware.memory_gb * GB,
        tier_Bps=TIER_BPS[spec.hardware.device],
        micro_batches=M,
        max_units=max(16, S),
    )


def stage_memory(spec: JobSpec, cal: Calibration, plan: Plan):
    """Device bytes of each stage of a stage map, and the cap they must fit: the MIP's
    constraint 4 and the runtime's two reserved buffers of a stage record (what
    rebalancing's balancer keeps a re-cut within)."""
    layers = layer_costs(cal, plan.micro_batch_size, plan.micro_batches)
    per_block = [_sections(spec) * 4.0 * b.params for b in cal.blocks]

    def memory(stages: list[list[int]]) -> list[float]:
        sums = stage_sums(layers, [len(s) for s in stages])
        records = [2 * sum(per_block[b] for b in s) for s in stages]
        return [max(c.memory_f, c.memory_b, r) for c, r in zip(sums, records, strict=True)]

    return memory, spec.hardware.memory_gb * GB


def cut_step_s(spec: JobSpec, cal: Calibration, plan: Plan, stages: list[list[int]]) -> float:
    """Seconds of ``plan``'s step with its S stages cut as ``stages``, by the MIP's own
    model (``costs.step_time``): the step ``recut`` predicts, without building its plan
    (rebalancing prices the cut it has and the one it may take)."""
    layers = layer_costs(cal, plan.micro_batch_size, plan.micro_batches)
    cfg = _config(spec, plan.mobius.N, plan.micro_batches, plan.mobius.S)
    return step_time(layers, [len(s) for s in stages], cfg)


def recut(spec: JobSpec, cal: Calibration, plan: Plan, stages: list[list[int]]) -> Plan:
    """``plan`` with its S stages cut at new boundaries (rebalancing, ``mobius.relayout``):
    the same ranks per stage, each rank's blocks and the prediction re-derived, the
    step priced by ``cut_step_s``."""
    m, N = plan.micro_batch_size, plan.mobius.N
    layers = layer_costs(cal, m, plan.micro_batches)
    step = cut_step_s(spec, cal, plan, stages)
    update = {"stages": [list(s) for s in stages], "step_time_s": step}
    lay = plan.mobius.model_copy(update=update)
    hosted = [[b for j in lay.hosted(r) for b in lay.stages[j]] for r in range(N)]
    plan_stages = [s.model_copy(update={"blocks": hosted[s.index]}) for s in plan.stages]
    pred = _prediction(spec, cal, layers, lay, m)
    return plan.model_copy(update={"mobius": lay, "stages": plan_stages, "prediction": pred})


def _check_budget(spec: JobSpec, pred: Prediction) -> None:
    """The runtime's rule (``MobiusRunner._reserve``): a rank's two reserved buffers
    fit ``hardware.memory_gb``."""
    need = max(pred.memory_per_stage_gb)
    if need > spec.hardware.memory_gb:
        raise PlanError(
            f"hardware.memory_gb: a rank's two reserved buffers (its largest stage record, "
            f"current and prefetched: weights, gradients, optimizer slots in fp32) need "
            f"{need:.3g} GB, over {spec.hardware.memory_gb} GB; raise "
            "parallelism.pipeline_stages or hardware.memory_gb"
        )


def mapped_topology(spec: JobSpec, N: int) -> Topology | None:
    """``hardware.topology`` where the cross mapping applies: one node's N devices."""
    topology = topology_of(spec.hardware)
    if topology is None or spec.hardware.nodes > 1 or topology.devices != N:
        return None
    return topology


def _mapping_note(spec: JobSpec, lay: MobiusLayout) -> str:
    """The explanation's words on where the stages run."""
    if mapped_topology(spec, lay.N) is not None:
        return (
            f"; cross mapping (sec. 3.3) {lay.ranks}: eq. 13 contention "
            f"{lay.contention:.3g} vs {lay.sequential:.3g} for j % N"
        )
    if spec.hardware.topology is not None:
        nodes = spec.hardware.nodes
        return (
            "; hardware.topology not applied (the cross mapping maps one node's "
            f"devices, this run has {lay.N} ranks on {nodes} nodes): j % N"
        )
    return "; stage j on rank j % N"


def _layout(spec: JobSpec, part: MobiusPartition, N: int) -> MobiusLayout:
    """The partition's stages and their ranks (the cross mapping on one node)."""
    topology = mapped_topology(spec, N)
    ranks = list(part.devices)
    plain = [j % N for j in range(len(part.stages))]
    costs = (0.0, 0.0)
    if topology is not None:
        mapping = cross_mapping(len(part.stages), topology)
        ranks = list(mapping.stage_devices)
        costs = (float(mapping.contention), float(contention(plain, topology)))
    return MobiusLayout(
        S=len(part.stages),
        stages=[list(r) for r in part.stages],
        ranks=ranks,
        step_time_s=part.step_time_s,
        optimal=part.optimal,
        contention=costs[0],
        sequential=costs[1],
    )


def _plan(spec: JobSpec, cal: Calibration, lay: MobiusLayout, m: int, pred) -> Plan:
    N, ppn = lay.N, spec.hardware.processes_per_node
    ranks = [
        RankPlan(rank=r, node=r // ppn, local_rank=r % ppn, stage=r, replica=0) for r in range(N)
    ]
    stages = [
        StagePlan(
            index=r,
            blocks=[b for j in lay.hosted(r) for b in lay.stages[j]],
            ranks=[r],
            recompute=True,
            actions="",
        )
        for r in range(N)
    ]
    sizes = [len(s) for s in lay.stages]
    mapped = _mapping_note(spec, lay)
    return Plan(
        P=N,
        D=1,
        micro_batch_size=m,
        micro_batches=spec.training.global_batch_size // m,
        global_batch_size=spec.training.global_batch_size,
        schedule="mobius",
        nodes=max(r.node for r in ranks) + 1,
        processes_per_node=min(ppn, N),
        device=spec.hardware.device,
        block_names=cal.names,
        stages=stages,
        ranks=ranks,
        prediction=pred,
        mobius=lay,
        explanation=[
            f"mobius: S = {lay.S} stages on N = {N} ranks, swapped through the tier below "
            f"{spec.hardware.memory_gb} GB per device",
            f"MIP partition (sec. 3.2): blocks per stage {sizes}, "
            f"{lay.step_time_s:.4g} s/step{'' if lay.optimal else ' (time limit hit)'}"
            f"{mapped}",
        ],
    )


def _sections(spec: JobSpec) -> int:
    """A stage record's sections (``engine.mobius.layout``): weights, gradients and
    the optimizer's per-parameter slots."""
    t = spec.training
    return 2 + (2 if t.optimizer in ("adam", "adamw") else int(bool(t.momentum)))


def _prediction(
    spec: JobSpec, cal: Calibration, layers: list[LayerCost], lay: MobiusLayout, m: int
) -> Prediction:
    """The MIP's step as a Prediction; the idle share is the compute the N ranks do
    not fill (forwards run twice: each stage but the last recomputes in backward).
    A rank's memory is its two reserved buffers, each its largest stage record (fp32,
    whatever the training precision: ``engine.mobius.layout``)."""
    step, M, N = lay.step_time_s or 0.0, spec.training.global_batch_size // m, lay.N
    compute = M * sum(c.forward_s + c.backward_s for c in layers)
    compute += M * sum(layers[i].forward_s for j in range(lay.S - 1) for i in lay.stages[j])
    fp32 = [4.0 * cal.blocks[i].params for i in range(cal.num_blocks)]  # ELEMENT bytes
    records = [_sections(spec) * sum(fp32[i] for i in s) for s in lay.stages]
    samples = spec.training.global_batch_size / step
    price = run_price(spec.hardware) * N
    return Prediction(
        step_time_s=step,
        samples_per_s=samples,
        memory_per_stage_gb=[2 * max(records[j] for j in lay.hosted(r)) / GB for r in range(N)],
        bubble_ratio=max(0.0, N * step / compute - 1.0) if compute > 0 else 0.0,
        cost_per_1k_samples=price / 3600.0 / samples * 1000.0,
        source="calibration" if cal.source == "measured" else "analytic",
        samples_per_s_per_device=samples / N,
        calibration=cal.fingerprint.key if cal.source == "measured" else None,
    )
