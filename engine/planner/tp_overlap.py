"""Sub-pipelined TMP's predicted gain (Merak sec. 5.3) and ``tp_subpipeline: auto``.

A transformer layer of a tensor-parallel stage costs, for one micro-batch, T_m of
compute and T_a of all-reduce in forward (Megatron's two g's), 2 T_m and T_a in
backward (its two f's); K layers cost ``(3 T_m + 2 T_a) K`` (``plain``). Split into
two sub-micro-batches that take turns (one all-reduces while the other computes, the
attention and MLP halves of a layer taken as equal), the paper's cost is

    forward   T_m / 4 + (K - 1/4) max(T_m, T_a) + T_a / 4
    backward  T_m / 2 + (K - 1/4) max(2 T_m, T_a) + T_a / 4
    total     3/4 T_m + 1/2 T_a + (K - 1/4) max(3 T_m, 2 T_m + T_a, 2 T_a)

Two deviations the paper leaves out, both making the split cost more: a half
micro-batch pays its per-call overhead again (T_o per layer, the m -> 0 intercept of
the calibrated forward times, ``tp_costs.overhead``), and an all-reduce hides under
compute only where it has something of its own to run on: a ``hidden`` share of T_a
overlaps (1 on accelerators, whose collectives have their own engines and streams;
on CPU ranks the share of a free core per rank), the rest stays exclusive.

``resolve`` sets ``Plan.tp_subpipeline`` from the spec: ``true``/``false`` as given,
``auto`` on where the summed predicted gain of the stages is positive.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import PrivateAttr

from jobctl.engine.calibration.record import Calibration
from jobctl.engine.core.plan import Plan
from jobctl.engine.planner import tp_costs
from jobctl.engine.planner.stage_costs import Tables


class SubPipelined(Calibration):
    """One rank's costs with sub-pipelined TMP's saving taken off its split blocks'
    times (``tp_search.overlapped``), and ``plain``: the same costs without it, from
    which a schedule that splits the backward is priced (ZB-H1: the halves cannot run
    its B and W apart, so it runs plain TMP; ``stage_costs.Tables.for_schedule``)."""

    plain: Calibration
    _plain_tables: object = PrivateAttr(default=None)  # the search's lookups of ``plain``


def tables_for(tables: Tables, plain: bool) -> Tables:
    """``tables``, or with ``plain`` (what runs plain TMP: a schedule that splits the
    backward, a recomputed block) and sub-pipelined TMP's saving in them, ``plain``'s."""
    cal = tables.cal
    if not plain or not isinstance(cal, SubPipelined):
        return tables
    if cal._plain_tables is None:
        cal._plain_tables = Tables(cal.plain)
    return cal._plain_tables


@dataclass(frozen=True)
class LayerTimes:
    """A stage's tensor-parallel layers as the paper counts them (seconds)."""

    T_m: float  # one layer's forward compute, one micro-batch, one rank
    T_a: float  # one layer's forward all-reduces (two g's)
    K: float  # layers: the stage's g's / 2
    T_o: float = 0.0  # the second half's extra per-call overhead, per layer


def plain(T_m: float, T_a: float, K: float) -> float:
    """Megatron TMP: every operation exclusive."""
    return (3 * T_m + 2 * T_a) * K


def forward(T_m: float, T_a: float, K: float) -> float:
    """Sub-pipelined forward of one micro-batch."""
    return T_m / 4 + (K - 0.25) * max(T_m, T_a) + T_a / 4


def backward(T_m: float, T_a: float, K: float) -> float:
    """Sub-pipelined backward of one micro-batch."""
    return T_m / 2 + (K - 0.25) * max(2 * T_m, T_a) + T_a / 4


def subpipelined(T_m: float, T_a: float, K: float) -> float:
    """Sub-pipelined forward and backward (``forward + backward``)."""
    return 0.75 * T_m + 0.5 * T_a + (K - 0.25) * max(3 * T_m, 2 * T_m + T_a, 2 * T_a)


def gain(layer: LayerTimes, hidden: float = 1.0) -> float:
    """Seconds a micro-batch saves by sub-pipelining (negative: it loses); only
    ``hidden`` of T_a can overlap, the rest runs exclusive in both cases."""
    K, exclusive = layer.K, (1.0 - hidden) * layer.T_a
    split = subpipelined(layer.T_m + layer.T_o, hidden * layer.T_a, K) + 2 * K * exclusive
    return plain(layer.T_m, layer.T_a, K) - split


def layers(
    compute: list[float],
    reduces: list[float],
    counts: list[int],
    overheads: list[float] | None = None,
) -> LayerTimes | None:
    """A stage's ``LayerTimes`` from its split blocks' forward compute, forward
    all-reduce seconds and number of g's (two per transformer layer); None without
    any g."""
    K = sum(counts) / 2
    if K <= 0:
        return None
    T_o = sum(overheads or []) / K
    return LayerTimes(sum(compute) / K, sum(reduces) / K, K, T_o)


def hidden_share(device: str, cores: int, processes: int) -> float:
    """How much of an all-reduce can hide under compute: all of it on accelerators;
    on CPU ranks, a free core per rank (gloo's thread needs one)."""
    if device != "cpu":
        return 1.0
    return min(1.0, max(0.0, (cores - processes) / max(processes, 1)))


def machine_ranks(hardware, ranks: int | None = None) -> int:
    """The ranks that share one machine's cores: a node's processes, or where every
    "node" runs on this machine (the local backend) all of them: ``ranks`` (a plan's)
    or the whole pool."""
    if hardware.one_machine:
        return ranks if ranks is not None else hardware.devices
    return hardware.processes_per_node


def stage_layers(
    cal: Calibration, facts, blocks: list[int], T: int, m: int, last: int, keep: int | None = None
) -> LayerTimes | None:
    """One stage's ``LayerTimes`` from the whole-model calibration: its split blocks
    but the model's last (whose mean loss runs as plain TMP) and those past ``keep``
    (stage-aware recomputation reruns them in backward: plain TMP, ``tp_stage``)."""
    compute, reduces, counts, overheads = [], [], [], []
    for i in blocks[:keep]:
        f = facts[i]
        if not f.reduce_bytes or i == last:
            continue
        o = tp_costs.overhead(cal.blocks[i].forward)
        compute.append(tp_costs.split_time(cal.forward(i, m), o, f.phi, T))
        reduces.append(tp_costs.comm_time(cal, f, T, m))
        counts.append(len(f.reduce_bytes))
        overheads.append(o)
    return layers(compute, reduces, counts, overheads)


def resolve(spec, cal: Calibration, plan: Plan) -> Plan:
    """``plan`` with ``tp_subpipeline`` set from ``spec`` (auto: the predicted gain)."""
    want = spec.parallelism.tp_subpipeline
    if plan.T == 1:
        if want is not True:
            return plan
        lines = [
            *plan.explanation,
            "sub-pipelined TMP off: parallelism.tp_subpipeline is "
            "true but the plan's T is 1: no split layer to overlap",
        ]
        return plan.model_copy(update={"explanation": lines})
    on, why = _decide(spec, cal, plan, want)
    lines = [*plan.explanation, f"sub-pipelined TMP {'on' if on else 'off'}: {why}"]
    return plan.model_copy(update={"tp_subpipeline": on, "explanation": lines})


def _decide(spec, cal: Calibration, plan: Plan, want) -> tuple[bool, str]:
    m = plan.micro_batch_size
    if plan.schedule == "zb_h1":  # true included: schedule auto may pick ZB-H1
        return False, "ZB-H1 splits the backward, which the halves run by hand"
    if want is not True and m % 2:
        return False, f"micro-batch {m} does not halve"
    if want != "auto":
        return bool(want), f"parallelism.tp_subpipeline: {str(want).lower()}"
    if spec.model.family is not None:
        return (
            False,
            "the builtin GPT's blocks run plain TMP (sub-pipelining halves traced subgraphs)",
        )
    from jobctl.engine.model.blocks import model_def
    from jobctl.engine.model.graph.tp_plan import discover

    graph = model_def(spec.model, spec.training.seed).graph
    facts = tp_costs.facts(graph, discover(graph, plan.T))
    hw = spec.hardware
    hidden = hidden_share(hw.device, cal.host.cores, machine_ranks(hw, len(plan.ranks)))
    saved = 0.0
    for st in plan.stages:
        layer = stage_layers(cal, facts, st.blocks, plan.T, m, len(facts) - 1, st.keep_blocks)
        saved += gain(layer, hidden) if layer is not None else 0.0
    return saved > 0, (
        f"predicted {1e3 * saved:+.2f} ms a micro-batch over the stages "
        f"(Merak 5.3's T_m/T_a overlap, {hidden:.0%} of T_a hideable)"
    )
