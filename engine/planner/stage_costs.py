"""From a calibration and one candidate layout to the simulator's CostModel.

A layout is P stages x D replicas at micro-batch size m with a schedule. Per stage,
compute is the sum over its blocks at m (Varuna sec. 4.4): forward (without autograd
for micro-batches the stage recomputes later), backward, recompute (a forward with
autograd), the data fetch on the first and last stage, the optimizer step. Per
boundary, the activation and gradient send time of that boundary's bytes on the link
between the two ranks (same node or not). Per stage, the gradient allreduce over its D
replicas (ring size D, as many rings in flight as share its node), plus the tied
embedding's allreduce over the first and last stage. Send jitter is the measured
spread. Where the calibration measured the runtime's own costs (``RuntimeCalibration``),
every message carries its extra time and every stage its fixed per-step work. Core
sharing stretches these costs afterwards (``contention``); the schedule's activation
peaks give each stage's memory (``stage_memory``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter
from typing import NamedTuple

from jobctl.engine.calibration.record import Calibration
from jobctl.engine.core.actions import Action, Op
from jobctl.engine.planner.layout import Hosting, Layout
from jobctl.engine.planner.partition import partition
from jobctl.engine.planner.simulator.engine import stage_facts
from jobctl.engine.planner.simulator.simulation import CostModel
from jobctl.engine.schedule.checks import ActivationPeak, peak_activations
from jobctl.engine.schedule.generators import generate

_op = attrgetter("op")
LOSS_BYTES = 8  # the float64 loss summed over replicas on the last stage
# ``activation_peaks`` needs no schedule for these
CLOSED_FORM_PEAKS = ("gpipe", "1f1b", "zb_h1", "shifted_critical_path")


@dataclass(frozen=True)
class BlockTimes:
    """Per block, the calibrated seconds at one micro-batch size (looked up once)."""

    m: int
    fwd: list[float]
    nograd: list[float]
    bwd: list[float]
    opt: list[float]
    data: float
    params: list[float]  # bytes per block (not seconds, but looked up as often)
    tied: list[float]

    @classmethod
    def at(cls, cal: Calibration, m: int) -> BlockTimes:
        n = range(cal.num_blocks)
        return cls(
            m=m,
            fwd=[cal.forward(i, m) for i in n],
            nograd=[cal.forward(i, m, graph=False) for i in n],
            bwd=[cal.backward(i, m) for i in n],
            opt=[b.optimizer.median for b in cal.blocks],
            data=cal.data_time(m),
            params=[b.param_bytes for b in cal.blocks],
            tied=[b.tied_bytes for b in cal.blocks],
        )

    def balance_costs(self, mode: str = "none") -> tuple[list[float], list[float]]:
        """Per block, what a micro-batch costs it on a stage that recomputes and on the
        last stage (``search.recompute_mode``): forward + backward, plus the first
        forward without autograd where the stage recomputes (Varuna's last stage does
        not: 'last_free'); the data fetch on the end blocks. The partition balances
        these, so its bottleneck is the schedule's own per-stage cost."""
        plain = [f + b for f, b in zip(self.fwd, self.bwd, strict=True)]
        rec = [p + n for p, n in zip(plain, self.nograd, strict=True)]
        costs, last = {"none": (plain, plain), "all": (rec, rec), "last_free": (rec, plain)}[mode]
        costs, last = list(costs), list(last)
        costs[0] += self.data
        last[-1] += self.data
        return costs, last


class Tables:
    """One search's lookups, computed once: block times per m, partitions per (P, m)."""

    def __init__(self, cal: Calibration) -> None:
        self.cal = cal
        self._times: dict[int, BlockTimes] = {}
        self._stages: dict[tuple[int, int, str], list[list[int]]] = {}
        # Simulated pipelines, shared by the D variants of one (P, M) (``recosted``).
        self.pipelines: dict[tuple, object] = {}

    def times(self, m: int) -> BlockTimes:
        if m not in self._times:
            self._times[m] = BlockTimes.at(self.cal, m)
        return self._times[m]

    def stages(self, P: int, m: int, mode: str = "none") -> list[list[int]]:
        """Blocks per stage, balanced by calibrated time at m under recompute ``mode``
        (exact min-max of the schedule's per-stage cost)."""
        if (P, m, mode) not in self._stages:
            costs, last = self.times(m).balance_costs(mode)
            self._stages[P, m, mode] = partition(costs, P, last=last)
        return self._stages[P, m, mode]

    def min_memory(self, P: int, m: int) -> float:
        """Heaviest stage with the least any schedule needs: state and one micro-batch."""
        blocks = self.cal.blocks
        return max(
            sum(blocks[i].state_bytes + m * blocks[i].act_bytes for i in s)
            for s in self.stages(P, m)
        )


def activation_peaks(layout: Layout, actions: list[list[Action]] | None) -> list[ActivationPeak]:
    """Per stage, the most micro-batches held at once (full activations, stashed inputs).

    GPipe's, 1F1B's and ZB-H1's peaks have closed forms (``test_planner`` checks them
    against ``peak_activations``), so a candidate that cannot fit needs no schedule
    generated. ZB-H1 holds a micro-batch from F to W, min(P, M) of them on every stage;
    with recompute, inputs from F to R (1F1B's min(P - s, M)) and full activations
    from R to W, which starts s micro-batches late (min(s + 1, M)).
    """
    P, M, name, rec = layout.P, layout.M, layout.schedule, layout.recompute
    if name == "shifted_critical_path":  # 1F1B + early recompute; see the generator
        return shifted_critical_path_peaks(P, M)
    if name == "zb_h1":
        return [
            ActivationPeak(min(s + 1, M), min(P - s, M)) if rec else ActivationPeak(min(P, M), 0)
            for s in range(P)
        ]
    if name == "1f1b":
        return [
            ActivationPeak(1, min(P - s, M)) if rec else ActivationPeak(min(P - s, M), 0)
            for s in range(P)
        ]
    if name == "gpipe" and not rec:
        return [ActivationPeak(M, 0)] * P
    if name == "gpipe":  # the last stage keeps its last micro-batch: one full more
        return [ActivationPeak(1, M)] * (P - 1) + [ActivationPeak(min(2, M), M - 1)]
    return [peak_activations(a) for a in actions]


@lru_cache(maxsize=64)
def generated(name: str, P: int, M: int, options: tuple) -> list[list[Action]]:
    """``generate(name, P, M, **dict(options))``, once per (kind, P, M, options): the
    search's candidates and steady-state runs share it (generators are pure and
    nothing edits an action list)."""
    return generate(name, P, M, **dict(options))


@lru_cache(maxsize=4096)
def generated_peaks(name: str, P: int, M: int, options: tuple) -> list[ActivationPeak]:
    """``activation_peaks`` of ``generated(name, P, M, options)``, counted once (by the
    simulator's per-list ``stage_facts``, which a simulation of these lists reuses)."""
    if name not in CLOSED_FORM_PEAKS:
        return [stage_facts(acts).peak for acts in generated(name, P, M, options)]
    layout = Layout(P, 1, 1, M, name, ("recompute", True) in options)
    return activation_peaks(layout, generated(name, P, M, options))


def shifted_critical_path_peaks(P: int, M: int) -> list[ActivationPeak]:
    """Early recompute holds one full micro-batch (R to B) and 1F1B's min(P - s, M)
    inputs; the penultimate stage's F2, pulled ahead of R0, makes that 3 there (M >= 3);
    the last stage keeps one micro-batch's activations and recomputes nothing."""
    peaks = [ActivationPeak(1, min(P - s, M)) for s in range(P - 1)]
    if P >= 2 and M >= 3:
        peaks[P - 2] = ActivationPeak(1, 3)
    return [*peaks, ActivationPeak(1, 0)]


def stage_memory(
    cal: Calibration, stages: list[list[int]], peaks: list[ActivationPeak], m: int
) -> list[float]:
    """Bytes per stage: training state, plus activations at the schedule's peaks
    (full activations of kept forwards, stage inputs of forwards recomputed later)."""
    out = []
    for blocks, peak in zip(stages, peaks, strict=True):
        state = sum(cal.blocks[i].state_bytes for i in blocks)
        acts = sum(cal.blocks[i].act_bytes for i in blocks) * m
        inp = cal.blocks[blocks[0] - 1].boundary_bytes * m if blocks[0] > 0 else 0.0
        work = max(cal.blocks[i].peak_bytes.get(m, 0.0) - cal.blocks[i].state_bytes for i in blocks)
        out.append(state + peak.full * acts + peak.stashed * inp + max(work, 0.0))
    return out


class _BoundTimes(NamedTuple):
    """The CostModel fields ``lower_bound`` reads, for ``StageCosts.bound``."""

    f: list[float]
    b: list[float]
    r: list[float]
    ar: list[float]
    opt: list[float]

    @property
    def P(self) -> int:  # noqa: N802 - names from the papers
        return len(self.f)


@dataclass(frozen=True)
class StageCosts:
    """Per-stage seconds of one (P, D, m) layout, before a schedule says which
    micro-batches it recomputes; ``model`` turns them into the simulator's CostModel."""

    graph: list[float]  # forward keeping the autograd graph (also a recompute)
    nograd: list[float]  # first forward of a micro-batch recomputed later
    fetch: list[float]  # data loading per forward (first and last stage)
    b: list[float]
    opt: list[float]
    ar: list[float]
    sends: list[float]  # per boundary, activation and gradient alike
    jitter: float
    bound_only: bool = False  # sends not priced (``lower_bound`` reads none)

    def bound(self, layout: Layout, recomputes: Sequence[int], split: bool = False) -> float:
        """``lower_bound`` of ``model(layout, None)`` without building (and checking) a
        CostModel: the search bounds every candidate, and simulates few."""
        f = [x + min(g, n) for x, g, n in zip(self.fetch, self.graph, self.nograd, strict=True)]
        times = _BoundTimes(f, self.b, self.graph, self.ar, self.opt)
        return lower_bound(times, recomputes, layout.M, split=split)  # type: ignore[arg-type]

    def model(self, layout: Layout, recomputes: Sequence[int] | None) -> CostModel:
        """The CostModel for ``recomputes[s]`` recomputed micro-batches per stage
        (None, for bounds: whichever forward is cheaper)."""
        M = layout.M
        if self.bound_only and recomputes is not None:
            raise ValueError("these stage costs are for a bound only: sends not priced")
        if recomputes is None:
            f = [x + min(g, n) for x, g, n in zip(self.fetch, self.graph, self.nograd, strict=True)]
        else:
            f = [
                x + (k * n + (M - k) * g) / M
                for x, g, n, k in zip(self.fetch, self.graph, self.nograd, recomputes, strict=True)
            ]
        return CostModel(
            f=f,
            b=self.b,
            r=self.graph,
            act=self.sends,
            grad=self.sends,
            jitter=self.jitter,
            ar=self.ar,
            opt=self.opt,
            opportunistic=layout.schedule == "varuna",
        )


def stage_costs(
    cal: Calibration,
    layout: Layout,
    stages: list[list[int]],
    hosting: Hosting,
    times: BlockTimes,
    bound_only: bool = False,
) -> StageCosts:
    """Sum the calibrated block costs over each stage's blocks at the layout's m.

    ``bound_only``: sends left at 0 (their NIC sharing is most of the cost here), for a
    ``lower_bound`` of a candidate the search may never simulate."""
    P, rt = layout.P, cal.runtime
    a = rt.action_s if rt else 0.0  # the executor's own cost per action
    fwd, nograd, bwd, opt = (t.__getitem__ for t in (times.fwd, times.nograd, times.bwd, times.opt))
    return StageCosts(  # sum(map(...)): the same sums in the same order, in C
        graph=[a + sum(map(fwd, blocks)) for blocks in stages],
        nograd=[a + sum(map(nograd, blocks)) for blocks in stages],
        fetch=[times.data if s in (0, P - 1) else 0.0 for s in range(P)],
        b=[a + sum(map(bwd, blocks)) for blocks in stages],
        opt=[sum(map(opt, blocks)) + (rt.step_s if rt else 0.0) for blocks in stages],
        ar=_allreduces(cal, layout, stages, hosting, times),
        sends=[0.0] * (P - 1) if bound_only else _sends(cal, layout, stages, hosting),
        jitter=cal.jitter,
        bound_only=bound_only,
    )


def _sends(
    cal: Calibration, layout: Layout, stages: list[list[int]], hosting: Hosting
) -> list[float]:
    """Per boundary, the send time of its activation (and gradient) at the layout's m."""
    rt = cal.runtime
    # Messages at the idle probe's cost; ``contend`` moves it with the plan's load.
    message = rt.message_s if rt else 0.0
    # Cores oversubscribed: the probes' fitted message cost (``contend``) is what the
    # runtime pays; the busy ping-pong is only the fallback without them (bimodal: a
    # woken process preempts a computing one, or waits out its time slice, so its
    # median was 0.09 ms in one calibration and 1.8 ms in the next).
    busy_link = hosting.oversubscribed and rt is None
    return with_message(
        [
            cal.link(hosting.same_node((s, 0), (s + 1, 0))).time(
                cal.blocks[stages[s][-1]].boundary_bytes * layout.m * hosting.nic_sharing(s),
                busy=busy_link,
            )
            for s in range(layout.P - 1)
        ],
        message,
    )


def recompute_counts(actions: list[list[Action]]) -> list[int]:
    """Recomputes per stage (counted in C: the search asks for every simulated layout)."""
    return [list(map(_op, acts)).count(Op.RECOMPUTE) for acts in actions]


def cost_model(
    cal: Calibration,
    layout: Layout,
    stages: list[list[int]],
    actions: list[list[Action]],
    hosting: Hosting,
) -> CostModel:
    """CostModel of ``layout`` running ``actions``, before core sharing (``contend``)."""
    costs = stage_costs(cal, layout, stages, hosting, BlockTimes.at(cal, layout.m))
    return costs.model(layout, recompute_counts(actions))


def _allreduces(
    cal: Calibration,
    layout: Layout,
    stages: list[list[int]],
    hosting: Hosting,
    times: BlockTimes,
) -> list[float]:
    """Per stage, its gradient sum over its D replicas, the tied embedding's over the
    first and last stage, and the last stage's loss sum, one after the other."""
    P, D = layout.P, layout.D
    whole = cal.allreduce(hosting.same_node((0, 0), (P - 1, D - 1)))  # the tied ring
    tied_of, params_of = times.tied.__getitem__, times.params.__getitem__
    out = []
    for s, blocks in enumerate(stages):
        tied = sum(map(tied_of, blocks)) if P > 1 else 0.0
        grads = sum(map(params_of, blocks)) - tied
        ring = cal.allreduce(hosting.same_node((s, 0), (s, D - 1)))
        t = ring.time(D, grads, hosting.rings_sharing(s))
        if tied:
            t += whole.time(2 * D, tied)
        if s == P - 1:
            t += ring.time(D, LOSS_BYTES)
        out.append(t)
    return out


def lower_bound(
    costs: CostModel, recomputes: Sequence[int], M: int, *, split: bool = False
) -> float:
    """A step time no schedule can beat, from data flow alone.

    Every stage does its own work (``busy``) and then its allreduce and optimizer step.
    Stage s cannot start before micro-batch 0's forwards of stages 0..s-1, and after its
    last backward the gradient still crosses the backwards of stages s-1..0, after which
    stage 0 reduces and steps. Sends are left out (jitter may shorten them), so this
    holds for every schedule, opportunistic ones included. A ``split`` backward (zero
    bubble) lets W's run after the stage's last B, so only each stage's own work bounds
    it.
    """
    busy = [M * (costs.f[s] + costs.b[s]) + recomputes[s] * costs.r[s] for s in range(costs.P)]
    own = max(busy[s] + costs.ar[s] + costs.opt[s] for s in range(costs.P))
    if split:
        return own
    through, ramp = 0.0, 0.0
    for s in range(costs.P):
        through = max(through, ramp + busy[s])
        ramp += costs.f[s] + costs.b[s]
    return max(own, through + costs.ar[0] + costs.opt[0])


def step_floor(
    costs: CostModel, recomputes: Sequence[int], M: int, *, split: bool = False
) -> float:
    """``lower_bound`` with the ramps and sends each stage cannot avoid (for pruning).

    Stage s starts no earlier than micro-batch 0's forwards and activation sends on
    stages 0..s-1 (its first action is a forward), ends no earlier than that plus its
    own work (``busy``), and then (unsplit: its last action is a backward) the
    gradient crosses each stage u < s (send, then u's backward) before u reduces and
    steps. Sends count only where fixed (a jittered send may take 0). The search
    prunes with it (``shortlist``; ``test_planner_search``: never above a simulation).
    """
    P, fixed = costs.P, costs.jitter == 0
    act = costs.act if fixed else (0.0,) * (P - 1)
    grad = costs.grad if fixed else (0.0,) * (P - 1)
    # With C[s] the gradient's way down to stage 0 from s, the end of stage u after
    # stage s's last backward is end[s] + C[s] - C[u]: keep the best u <= s so far.
    floor, start, down, tail = 0.0, 0.0, 0.0, -float("inf")
    for s in range(P):
        end = start + M * (costs.f[s] + costs.b[s]) + recomputes[s] * costs.r[s]
        finish = costs.ar[s] + costs.opt[s]
        tail = finish if split else max(tail, finish - down)
        floor = max(floor, end + (tail if split else down + tail))
        if s < P - 1:
            start += costs.f[s] + act[s]
            down += grad[s] + costs.b[s]
    return floor


def with_message(sends: Sequence[float], extra: float) -> list[float]:
    """Send times with ``extra`` seconds per message (negative: a channel cheaper than
    the measured link), never below a free send."""
    return [max(0.0, x + extra) for x in sends]
