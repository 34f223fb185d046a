"""Predicted stage load after pruning, and what rebalancing would recover (``jobctl plan``).

Per pruning step of the schedule, each block's calibrated forward+backward time is
rescaled for the sparsity of its prunable layers. Where the sparsities come from:

* ``profile``: the newest earlier run of this job in the state home that recorded
  its pruning steps (each layer's sparsity under global magnitude pruning, which
  leaves layers unevenly sparse), at the steps whose target matches the schedule's;
* ``uniform``: otherwise the schedule, with global pruning assumed to leave every
  prunable layer at the schedule's sparsity (the view says which).

A layer computing densely (masked weights) takes as long as before. One computing in
CSR takes the measured CSR / dense ratio of its shape class at its sparsity
(``sparse_threshold: auto``, the crossover records of ``pruning_crossover``), or, with a
fixed threshold, a time proportional to its nonzeros and equal to dense at the
threshold. A layer's share of its block's time is its share of the block's parameters.
The balancer of ``rebalancing`` then runs on those costs (or on nonzero parameter
counts, ``by: params``) and the simulator predicts the step with the static and the
rebalanced stage map; a stage's idle % is ``1 - busy / step time`` of that simulated
step (its compute over the whole step, allreduce and optimizer included).
engine/views/rebalance.py renders the result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from jobctl.engine.calibration.cache import DEFAULT_THREADS, calibration_for
from jobctl.engine.calibration.record import Calibration
from jobctl.engine.core.env import DB_URL
from jobctl.engine.core.events import Kind, read_metrics
from jobctl.engine.core.home import default_home
from jobctl.engine.core.plan import Plan
from jobctl.engine.model.blocks import model_def
from jobctl.engine.planner.layout import Layout
from jobctl.engine.planner.simulator.simulation import SimResult
from jobctl.engine.planner.stage_costs import BlockTimes
from jobctl.engine.pruning.crossover import load, ratio_at, record_path, shape_key
from jobctl.engine.pruning.pruner import prunable_names
from jobctl.engine.pruning.schedule import schedule
from jobctl.engine.rebalance.rebalancer import MemoryFn, Stages, loads_of, rebalance
from jobctl.engine.rebalance.replan import (
    choose_pack,
    layout_of,
    memory_cap,
    memory_model,
    simulate_stages,
)
from jobctl.engine.state.db import StateDB
from jobctl.spec import JobSpec, PruningSpec, RebalancingSpec


@dataclass(frozen=True)
class Layer:
    """One prunable weight: its block, name, (out, in) shape and whether an
    ``nn.Linear`` computes with it (only those can switch to CSR)."""

    block: int
    name: str
    shape: tuple[int, int]
    numel: int
    linear: bool


def model_layers(spec: JobSpec) -> tuple[list[int], list[Layer]]:
    """(parameter elements per block, the prunable weights), from meta-device shapes;
    a pruned tied embedding's head counts too (it computes with the same mask)."""
    mdef = model_def(spec.model, spec.training.seed)
    totals, found = [], {}
    with torch.device("meta"):
        for i in range(mdef.num_blocks):
            block = mdef.block(i)
            mods = dict(block.named_modules())
            totals.append(sum(p.numel() for p in block.parameters()))
            for n, p in block.named_parameters():
                owner, _, leaf = n.rpartition(".")
                linear = isinstance(mods.get(owner), nn.Linear) and leaf == "weight"
                shape = (p.shape[0], p.numel() // p.shape[0]) if p.dim() else (1, 1)
                found[f"layers.{i}.{n}"] = Layer(i, f"layers.{i}.{n}", shape, p.numel(), linear)
    names = set(prunable_names(list(found), spec.pruning.prunable, mdef.ties))
    names |= {t.alias for t in mdef.ties if t.canonical in names}
    return totals, [found[n] for n in found if n in names]


def sparsity_profile(spec: JobSpec, home: Path | None, layers: list[Layer]) -> dict[int, dict]:
    """Per pruning step, each layer's sparsity as the newest earlier run of this job
    recorded it (``pruning`` records with ``layer_sparsity``); {} when none did."""
    home = Path(home or default_home())
    if not (os.environ.get(DB_URL) or (home / "state.db").exists()):
        return {}  # never create a state database just to plan
    targets = dict(schedule(spec.pruning))
    names = {layer.name for layer in layers}
    for run in StateDB(home).list_runs():
        path = Path(run["run_dir"]) / "metrics.jsonl"
        if run["name"] != spec.name or not path.exists():
            continue
        found = {}
        for rec in read_metrics(path, 0)[0]:  # the run may still be appending
            if rec.get("kind") != Kind.PRUNING or set(rec.get("layer_sparsity", {})) != names:
                continue
            if abs(targets.get(rec["step"], -1.0) - rec["target_sparsity"]) < 1e-9:
                found[rec["step"]] = rec["layer_sparsity"]
        if found:
            return found
    return {}


def csr_ratio(
    pruning: PruningSpec, layer: Layer, sparsity: float, records: dict, tokens: int
) -> float:
    """Time of ``layer`` at ``sparsity`` relative to dense (1.0: it computes densely)."""
    limit = pruning.sparse_threshold
    if limit is None or not layer.linear:
        return 1.0
    if limit == "auto":
        rec = records.get(shape_key((*layer.shape, tokens)), {})
        x = rec.get("crossover")
        return 1.0 if x is None or sparsity < x else ratio_at(rec, sparsity) or 1.0
    return (1 - sparsity) / (1 - limit) if sparsity > limit else 1.0


def pruned_costs(
    spec: JobSpec, times: list[float], sparsity: dict[str, float], records: dict, tokens: int
) -> tuple[list[float], list[float]]:
    """(predicted seconds, nonzero parameters) per block with each prunable layer at
    ``sparsity[name]``."""
    totals, layers = model_layers(spec)
    secs, nnz = list(times), [float(n) for n in totals]
    for layer in layers:
        s, b = sparsity[layer.name], layer.block
        share = layer.numel / totals[b] if totals[b] else 0.0
        secs[b] -= times[b] * share * (1.0 - csr_ratio(spec.pruning, layer, s, records, tokens))
        nnz[b] -= layer.numel * s
    return secs, nnz


def idle_fractions(sim: SimResult) -> list[float]:
    """Per stage, 1 - busy / step time of a simulated step."""
    return [1.0 - b / sim.step_time if sim.step_time > 0 else 0.0 for b in sim.busy]


@dataclass
class Row:
    """One pruning step's prediction: stage seconds and idle, static vs rebalanced."""

    step: int
    sparsity: float
    source: str  # "profile" or "uniform"
    static: list[float]  # stage seconds
    balanced: list[float]
    stages: Stages
    idle_static: list[float]
    idle_balanced: list[float]
    step_static: float
    step_balanced: float
    pack: int | None


@dataclass(frozen=True)
class _Basis:
    """What every pruning step's prediction shares: the calibration and the plan's
    layout, dense block seconds, the memory model, the recorded sparsities and the
    CSR crossover records."""

    cal: Calibration
    base: list[float]
    lay: Layout
    mem: MemoryFn
    cap: float
    layers: list[Layer]
    profile: dict[int, dict]
    records: dict
    tokens: int


def _basis(spec: JobSpec, plan: Plan, home: Path | None) -> _Basis:
    cal = calibration_for(spec, home)
    times = BlockTimes.at(cal, plan.micro_batch_size)
    base = [f + b for f, b in zip(times.fwd, times.bwd, strict=True)]
    lay = layout_of(plan)
    mem, cap = memory_model(spec, cal, lay), memory_cap(spec.hardware)
    _, layers = model_layers(spec)
    profile = sparsity_profile(spec, home, layers)
    records = load(record_path(home, torch.device(spec.hardware.device), DEFAULT_THREADS))
    tokens = plan.micro_batch_size * spec.model.seq_len
    return _Basis(cal, base, lay, mem, cap, layers, profile, records, tokens)


def _predict_step(
    spec: JobSpec, plan: Plan, basis: _Basis, step: int, s: float, stages: Stages
) -> Row:
    """The prediction at pruning step ``step`` (sparsity ``s``) from the stage map
    ``stages`` that the previous step left."""
    cfg, b = spec.rebalancing, basis
    sparsity = b.profile.get(step) or {layer.name: s for layer in b.layers}
    secs, nnz = pruned_costs(spec, b.base, sparsity, b.records, b.tokens)
    costs = secs if cfg.by == "time" else nnz
    d = rebalance(costs, stages, cfg.balancer, cfg.by, cfg.tolerance, b.mem, b.cap)
    pack = None
    if cfg.pack:
        got = choose_pack(
            spec,
            b.cal,
            plan,
            secs,
            d.stages,
            cfg.tolerance,
            cfg.target_devices,
            cfg.balancer,
            costs,
        )
        pack = got.P if got is not None else None
    static = simulate_stages(spec, b.cal, b.lay, stages, secs)
    balanced = simulate_stages(spec, b.cal, b.lay, d.stages, secs)
    return Row(
        step,
        s,
        "profile" if step in b.profile else "uniform",
        loads_of(secs, stages),
        loads_of(secs, d.stages),
        d.stages,
        idle_fractions(static),
        idle_fractions(balanced),
        static.step_time,
        balanced.step_time,
        pack,
    )


def predict(spec: JobSpec, plan: Plan, home: Path | None = None) -> list[Row]:
    """One row per pruning step: stage seconds and idle static vs rebalanced."""
    basis = _basis(spec, plan, home)
    stages = [list(s.blocks) for s in plan.stages]
    rows = []
    for step, s in schedule(spec.pruning):
        if s <= 0.0:  # nothing pruned at this step (see pruning_schedule.target_at)
            continue
        rows.append(_predict_step(spec, plan, basis, step, s, stages))
        stages = rows[-1].stages
    return rows


@dataclass(frozen=True)
class RebalancePreview:
    """What ``jobctl plan`` shows about rebalancing: the predicted rows, the
    ``rebalancing`` section they were predicted with (the title names it) and the
    ``pruning.sparse_threshold`` that decides which layers compute in CSR."""

    rows: list[Row]
    rebalancing: RebalancingSpec
    sparse_threshold: float | str | None


def preview_rebalancing(spec: JobSpec, plan: Plan, home: Path | None = None) -> RebalancePreview:
    """The prediction with the spec's balancer, or, with rebalancing disabled, with
    the partition balancer by time (what enabling it would recover)."""
    cfg = spec.rebalancing
    if not cfg.enabled:
        cfg = cfg.model_copy(update={"balancer": "partition", "by": "time"})
        spec = spec.model_copy(update={"rebalancing": cfg})
    rows = predict(spec, plan, home)
    return RebalancePreview(rows, spec.rebalancing, spec.pruning.sparse_threshold)
