"""What tensor parallelism (Merak sec. 4.1, Megatron-LM's TMP) costs one rank of a T group.

The search prices a T group as one device (``resolver.tp_groups``); this module turns
the calibration of whole blocks into the calibration of one rank's shard of them
(``calibration``), so every stage cost, memory check and simulation downstream prices
T without knowing about it. Per block, from the traced graph's column/row plan
(``model.graph.tp_plan``, ``facts``):

* phi: the share of the block's parameters in split (column or row) linears. Their
  parameters, gradients and optimizer state are 1/T on each rank; the rest (layer
  norms, embeddings, the head, biases of row linears) stays whole. Compute is split
  in the same share: a linear's FLOPs are proportional to its parameters, and
  attention between the column and row linears runs on 1/T of the heads; layer norms,
  residual adds and dropout are not split. A block's fixed per-call time (kernel
  launches, Python: the m -> 0 intercept of its calibrated times) is not split either:
  ``t_T(m) = o + (t(m) - o) (1 - phi + phi / T)``.
* Megatron's communication: after each row linear its partial sums are all-reduced in
  forward (g), and before each column group the input's gradient is all-reduced in
  backward (f), one f per g: per transformer layer 2 + 2 all-reduces of the activation
  (b x s x h; ``reduce_bytes`` holds each row output's bytes per sample). A recompute
  is a forward, so it repeats the forward's g's (the stage costs price it as one).
  Each is a ring over the T ranks of one node, priced by the calibration's own
  tensor-parallel all-reduce at T where it has one (``tp_allreduce``, from
  ``measure.tp_allreduce``: activation sizes among T local processes), else by
  ``cal.allreduce(same_node=True)`` at ring T, measured where the calibration measured
  that ring, else its ring model (``link_source`` says which; a record from before
  ``tp_allreduce`` takes these). One ring in flight per group: on accelerators each
  group has its own links; on CPU the host's memory bandwidth is shared, which the
  core sharing below only partly covers.
* Activations as Megatron without sequence parallelism: the values between a column
  and a row linear (psi: their share of the block's kept bytes, from the graph's
  split values) are 1/T on each rank; layer-norm inputs, residuals and dropout masks
  stay whole (Megatron's ``sbh (10 + 24 / T) + 5 a s^2 b / T`` for a GPT layer).
* CPU ranks of one machine: a group is T processes on the host's cores, so each
  rank's compute is slowed as T busy processes are (``host.factor(T)``), and k busy
  groups slow each other as k T processes do.

Stage boundaries send whole activations (each rank t to rank t), so those bytes stay,
and the gradient all-reduce of each (stage, t) runs over its D replicas at once: T
messages and T rings where the search sees one. Across nodes they share the node's
NIC, so the inter-node link and all-reduce run at 1/T of their bandwidth
(``shared_nic``); inside a node each pair has its own path (NVLink's switch, or
memory on one host), so those stay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jobctl.engine.calibration.record import (
    BlockCalibration,
    Calibration,
    HostCalibration,
    Stat,
)


@dataclass(frozen=True)
class TPBlock:
    """What tensor parallelism splits in one block (subgraph), independent of T."""

    phi: float  # share of parameters (and compute) in split linears
    psi: float  # share of kept activation bytes that are split values
    reduce_bytes: tuple[float, ...] = ()  # per sample, each row linear's output (g)


@dataclass(frozen=True)
class TPCosts:
    """The typed config of one T's pricing: T, the per-block facts, and whether the
    host's cores are shared by every process (CPU workers on one machine)."""

    T: int
    blocks: tuple[TPBlock, ...]
    share_cores: bool = False


def split_time(t: float, overhead: float, phi: float, T: int) -> float:
    """Seconds of one rank's shard: the fixed part whole, the rest 1 - phi + phi / T."""
    fixed = min(max(overhead, 0.0), t)
    return fixed + (t - fixed) * (1.0 - phi + phi / T)


def overhead(times: dict[int, Stat]) -> float:
    """The m -> 0 intercept of a block's calibrated times (its per-call cost), from the
    two smallest micro-batch sizes; 0 with one size."""
    ms = sorted(times)
    if len(ms) < 2:
        return 0.0
    m1, m2 = ms[:2]
    t1, t2 = times[m1].median, times[m2].median
    return min(t1, max(0.0, t1 - m1 * (t2 - t1) / (m2 - m1)))


def _measured_tp(cal: Calibration, T: int) -> bool:
    """Whether the calibration timed tensor parallelism's own all-reduce at ring T."""
    return cal.tp_allreduce is not None and any(p.ring == T for p in cal.tp_allreduce.points)


def reduce_time(cal: Calibration, T: int, nbytes: float) -> float:
    """One all-reduce of ``nbytes`` over a T group inside one node: the measured
    activation all-reduce at T where the calibration has it, else the intra-node ring."""
    if _measured_tp(cal, T):
        return cal.tp_allreduce.time(T, nbytes)
    return cal.allreduce(True).time(T, nbytes)


def comm_time(cal: Calibration, block: TPBlock, T: int, m: int) -> float:
    """A forward's (or a backward's) all-reduces of one block at micro-batch size m."""
    return sum(reduce_time(cal, T, b * m) for b in block.reduce_bytes)


def link_source(cal: Calibration, T: int) -> str:
    """Where the T all-reduce's price comes from, for the plan's explanation."""
    if _measured_tp(cal, T):
        return f"this machine's measured tensor-parallel all-reduces at T = {T}"
    ring = cal.allreduce(True)
    if ring.source != "measured":
        return "the analytic intra-node link model from the hardware spec"
    if any(p.ring == T for p in ring.points):
        why = f"the calibration's measured intra-node all-reduces at ring {T}"
    else:
        why = (
            f"the ring model fitted to this machine's measured all-reduces (ring {T} not measured)"
        )
    # A record from before tp_allreduce, or one whose spec admitted no T > 1 then.
    return f"{why}; no tensor-parallel all-reduce at T = {T} in the calibration"


def _times(cal: Calibration, b: BlockCalibration, fact: TPBlock, tp: TPCosts, key: str):
    """A block's ``forward``/``forward_nograd``/``backward`` table for one rank."""
    table: dict[int, Stat] = getattr(b, key)
    o, slow = overhead(table), cal.host.factor(tp.T) if tp.share_cores else 1.0
    return {
        m: Stat(
            median=slow * split_time(s.median, o, fact.phi, tp.T) + comm_time(cal, fact, tp.T, m),
            iqr=s.iqr,
            n=s.n,
        )
        for m, s in table.items()
    }


def rank_block(cal: Calibration, b: BlockCalibration, fact: TPBlock, tp: TPCosts):
    """One rank's share of block ``b`` (times, bytes) at ``tp.T``."""
    T = tp.T
    keep = 1.0 - fact.phi + fact.phi / T  # parameters, gradients, optimizer state
    acts = 1.0 - fact.psi + fact.psi / T
    state = b.state_bytes * keep
    return b.model_copy(
        update={
            "params": int(round(b.params * keep)),
            "param_bytes": b.param_bytes * keep,
            "state_bytes": state,
            "act_bytes": b.act_bytes * acts,
            "forward": _times(cal, b, fact, tp, "forward"),
            "forward_nograd": _times(cal, b, fact, tp, "forward_nograd"),
            "backward": _times(cal, b, fact, tp, "backward"),
            "optimizer": Stat(
                median=b.optimizer.median * keep, iqr=b.optimizer.iqr * keep, n=b.optimizer.n
            ),
            "peak_bytes": {
                m: state + max(0.0, p - b.state_bytes) * acts for m, p in b.peak_bytes.items()
            },
        }
    )


def group_host(host: HostCalibration, T: int) -> HostCalibration:
    """The host as T groups see it: a group is T processes, so k busy groups slow each
    other as k T processes do (relative to one group's own T, priced in its compute)."""
    top = max([1, *host.slowdown])
    base = host.factor(T)
    slowdown = {k: host.factor(k * T) / base for k in range(2, max(2, top // T) + 1)}
    return host.model_copy(update={"cores": max(1, host.cores // T), "slowdown": slowdown})


def shared_nic(cal: Calibration, T: int) -> dict:
    """The inter-node link and all-reduce as each of T ranks gets them when all T send
    at once: 1/T of the fitted bandwidth (measured points were one sender's: dropped)."""
    return {
        name: getattr(cal, name).model_copy(
            update={
                "bandwidth_Bps": getattr(cal, name).bandwidth_Bps / T,
                "points": type(getattr(cal, name).points)(),
            }
        )
        for name in ("p2p_inter", "allreduce_inter")
    }


def calibration(cal: Calibration, tp: TPCosts) -> Calibration:
    """``cal`` as one rank of a T group pays it (the module docstring's equations)."""
    if tp.T == 1:
        return cal
    if len(tp.blocks) != cal.num_blocks:
        raise ValueError(
            f"{len(tp.blocks)} tensor-parallel block facts for {cal.num_blocks} calibrated blocks"
        )
    blocks = [rank_block(cal, b, f, tp) for b, f in zip(cal.blocks, tp.blocks, strict=True)]
    update: dict = {"blocks": blocks, **shared_nic(cal, tp.T)}
    if tp.share_cores:
        update["host"] = group_host(cal.host, tp.T)
    return cal.model_copy(update=update)


def _value_bytes(node) -> float:
    """Bytes of a node's float value (0 for anything else)."""
    val = node.meta.get("val")
    if val is None or not hasattr(val, "dtype") or not val.dtype.is_floating_point:
        return 0.0
    return float(math.prod(val.shape) * val.element_size())


def facts(graph, plan, traced_m: int = 1) -> tuple[TPBlock, ...]:
    """Per subgraph of ``graph`` (a ``GraphModel`` traced at micro-batch ``traced_m``),
    what ``plan`` (``tp_plan.discover``, any T) splits: phi from its parameters, psi and
    the row outputs from its values."""
    nodes = {n.name: n for n in graph.gm.graph.nodes}
    split_names = set(plan.params)
    out = []
    for shard in graph.shards:
        sizes = {t: graph.shapes[graph.original(t)] for t in shard.params}
        total = sum(math.prod(s[0]) for s in sizes.values() if s[2]) or 1
        split = sum(
            math.prod(s[0]) for t, s in sizes.items() if s[2] and graph.original(t) in split_names
        )
        values = {n: _value_bytes(nodes[n]) for n in shard.nodes if n in nodes}
        kept = sum(values.values()) or 1.0
        held = sum(v for n, v in values.items() if n in plan.sharded)
        rows = tuple(values[n] / traced_m for n in shard.nodes if n in plan.row)
        out.append(TPBlock(phi=split / total, psi=held / kept, reduce_bytes=rows))
    return tuple(out)


def gpt_facts(layers: int, hidden: int, heads: int, seq_len: int) -> tuple[TPBlock, ...]:
    """Per block of the builtin GPT (embedding, ``layers`` blocks, head), what its
    Megatron plan splits (``model.gpt_tp``): in a block, the q/k/v, attention output
    and MLP linears' weights and their column biases, 12 h^2 + 7 h of 12 h^2 + 13 h
    parameters; of its kept activations Megatron's split share, (24 s h + 5 a s^2) of
    (34 s h + 5 a s^2) per sample; two row outputs of s x h fp32 values to all-reduce.
    The embedding and the head stay whole."""
    h, s, a = hidden, seq_len, heads
    block = TPBlock(
        phi=(12 * h * h + 7 * h) / (12 * h * h + 13 * h),
        psi=(24 * s * h + 5 * a * s * s) / (34 * s * h + 5 * a * s * s),
        reduce_bytes=(4.0 * s * h, 4.0 * s * h),
    )
    whole = TPBlock(phi=0.0, psi=0.0)
    return (whole, *[block] * layers, whole)
