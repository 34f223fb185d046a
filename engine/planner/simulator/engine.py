"""The simulator's engine: runs per-stage action lists on plain Python lists.

A stage runs its list in order, each action starting when the stage is free and its
input (activation from stage s-1 for F, gradient from stage s+1 for B) has arrived, so
start times follow by propagation along data flow: a stage advances as far as its
inputs are known, and a stage blocked on an input that is not computed yet resumes
when it is. No event queue is needed for that, and nothing is allocated per action
but one float (its start time).

Opportunistic deviation is the one decision that depends on what has arrived *by
now*. When a stage meets a backward task without its gradient, it decides at once if
the arrivals the decision needs are already computed; if one is not, the stage parks
in a heap keyed by time and parked stages decide in time order. Everything that
starts before a parked stage's decision time has been computed by then (it depends
only on earlier events), so every decision sees exactly the arrivals a real stage
would see. A deviation moves the forward to the front of the stage's remaining list;
the list, a copy, then is the executed order. Events are built only when asked for
(``timeline``).

The decision is incremental: per stage, what each position holds (+1/-1 full
activations and stashed inputs, ``StageFacts``) is counted once per action list and
cached with it as prefix sums, which a deviation shifts between the two positions it
swaps; only a recompute, or a backward without one, can deviate at all, and the hot
loop skips the decision where the stage holds its peak of what its forwards add, or
no forward is left. Stages advance first in, first out, so neighbours move side by
side and a decision rarely finds an arrival it needs not computed yet (a park).
"""

from __future__ import annotations

import collections
import copy
import heapq
from itertools import accumulate, compress, repeat
from operator import attrgetter, is_
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from jobctl.engine.core.actions import Action, Op
from jobctl.engine.schedule.checks import ActivationPeak

if TYPE_CHECKING:
    from jobctl.engine.planner.simulator.simulation import CostModel

INF = float("inf")
BLOCKED, PARKED = -1, -2  # waiting[s] when not waiting for a particular input key
FWD, REC, BWD, WGT = Op.FORWARD, Op.RECOMPUTE, Op.BACKWARD, Op.WEIGHT
TimelineEntry = tuple[int, Action | None, float, float, str]
_micro_batch = attrgetter("micro_batch")
_op = attrgetter("op")
FACTS_CACHED = 1024  # per-stage facts of this many action lists (a dozen schedules)
_facts: dict[int, tuple[list[Action], StageFacts]] = {}


class StageFacts(NamedTuple):
    """What one stage's action list holds, position by position (pure in the list).

    ``full[k]`` / ``stashed[k]``: how action k changes the full activations and stashed
    inputs the stage holds (``peak_activations``' counting; a split stage's B frees
    nothing, its W does); ``movable[k]``: action k may be preceded by a forward (a
    recompute, or a backward without one); ``peak``: the list's own activation peaks;
    ``held``: the prefix sums of ``full`` and ``stashed``, what the stage holds before
    each position (length ``len(list) + 1``).
    """

    recomputed: frozenset[int]
    split: bool
    full: tuple[int, ...]
    stashed: tuple[int, ...]
    movable: tuple[bool, ...]
    peak: ActivationPeak
    held: tuple[tuple[int, ...], tuple[int, ...]]


def _by_op(recomputed: bool, split: bool) -> tuple[dict, dict, dict]:
    """Per op, ``StageFacts``' full, stashed and movable where every forward of the list
    is recomputed (``recomputed``) or none is."""
    free = 0 if split else -1  # what a B frees: everything, unless its W does
    full = {FWD: 0 if recomputed else 1, REC: 1, BWD: free, WGT: -1}
    stashed = {FWD: 1 if recomputed else 0, REC: -1, BWD: 0, WGT: 0}
    movable = {FWD: False, REC: True, BWD: not recomputed, WGT: False}
    return full, stashed, movable


_BY_OP = {(r, w): _by_op(r, w) for r in (False, True) for w in (False, True)}


def _mixed(acts: list[Action], rec: frozenset[int], split: bool) -> tuple[tuple, ...]:
    """``StageFacts``' full, stashed and movable where some forwards are recomputed."""
    pairs = [(a.op, a.micro_batch) for a in acts]
    free = 0 if split else -1
    full = tuple(
        (m not in rec) if o is FWD else 1 if o is REC else -1 if o is WGT else free
        for o, m in pairs
    )
    stashed = tuple((o is FWD and m in rec) - (o is REC) for o, m in pairs)
    movable = tuple(o is REC or (o is BWD and m not in rec) for o, m in pairs)
    return full, stashed, movable


def stage_facts(acts: list[Action]) -> StageFacts:
    """``StageFacts`` of one stage's list, counted once per list object (the planner's
    lists come from cached generators and are never edited)."""
    hit = _facts.get(id(acts))
    if hit is not None and hit[0] is acts and len(hit[1].full) == len(acts):
        return hit[1]
    ops = list(map(_op, acts))
    recs = map(is_, ops, repeat(REC))
    rec = frozenset(compress(map(_micro_batch, acts), recs)) if REC in ops else frozenset()
    split = WGT in ops
    if not rec or len(rec) == ops.count(FWD):  # none or all recomputed: by op alone (in C)
        full, stashed, movable = (tuple(map(t.__getitem__, ops)) for t in _BY_OP[bool(rec), split])
    else:
        full, stashed, movable = _mixed(acts, rec, split)
    held = tuple(accumulate(full, initial=0)), tuple(accumulate(stashed, initial=0))
    peak = ActivationPeak(max(0, *held[0]), max(0, *held[1]))
    facts = StageFacts(rec, split, full, stashed, movable, peak, held)
    if len(_facts) >= FACTS_CACHED:
        _facts.clear()
    _facts[id(acts)] = acts, facts
    return facts


def _held(facts: StageFacts, M: int) -> list[list[int] | None]:
    """Per kind (full, stashed), what the stage holds before each position (a copy:
    deviations shift it), None for a kind none of its M forwards adds (never read)."""
    full = None if len(facts.recomputed) == M else list(facts.held[0])
    stashed = list(facts.held[1]) if facts.recomputed else None
    return [full, stashed]


def _gate(held: list[list[int] | None], peak: ActivationPeak) -> tuple[list[int] | None, int]:
    """The one kind a stage's forwards add, held before each position, and its peak (at
    or above it no forward may move ahead); (None, 0) where the kinds are mixed."""
    full, stashed = held
    if stashed is None:
        return full, peak.full
    if full is None:
        return stashed, peak.stashed
    return None, 0


def send_times(costs: CostModel, M: int, seed: int) -> tuple[list[list[float]], list[list[float]]]:
    """Per boundary and micro-batch, the time on the wire of each activation and gradient.

    The draw for a send depends only on (direction, boundary, micro-batch) and the seed.
    """
    if costs.jitter > 0 and costs.P > 1:
        z = np.random.default_rng(seed).standard_normal((2, costs.P - 1, M))
        factor = np.maximum(0.0, 1.0 + costs.jitter * z)
        act = factor[0] * np.asarray(costs.act)[:, None]
        grad = factor[1] * np.asarray(costs.grad)[:, None]
        return act.tolist(), grad.tolist()
    return [[x] * M for x in costs.act], [[x] * M for x in costs.grad]


class Engine:
    """One simulated step: ``run`` it, then read ``free``, ``busy``, ``lists``, ``timeline``.

    ``inbox[s][i]`` is when the activation of micro-batch i reaches stage s and
    ``inbox[s][M + i]`` when its gradient does (INF: not computed yet); the same index
    names what a blocked stage waits for and, in ``out_dur[s]``, how long the send of
    the output of F(i) (index i) or B(i) (index M + i) from stage s takes.
    """

    def __init__(self, stages: list[list[Action]], costs: CostModel, seed: int) -> None:
        P = self.P = costs.P
        self.costs = costs
        self.opportunistic = costs.opportunistic
        self.lists = [list(a) for a in stages]  # becomes the executed order
        M = self.M = max(map(_micro_batch, stages[0]), default=-1) + 1
        act, grad = send_times(costs, M, seed)
        none = [0.0] * M
        self.out_dur = [
            (act[s] if s < P - 1 else none) + (grad[s - 1] if s else none) for s in range(P)
        ]
        self.inbox = [[INF] * (2 * M) for _ in range(P)]
        self.inbox[0][:M] = none  # stage 0 reads its input from the data
        self.inbox[P - 1][M:] = none  # the last stage's gradient is the loss
        self.capped = costs.max_inflight_sends is not None
        self.inflight: list[list[float]] = [[] for _ in range(P)]  # send end times
        self.sent = [[0.0] * (2 * M) for _ in range(P)] if self.capped else None
        self.starts: list[list[float]] = [[] for _ in range(P)]
        facts = [stage_facts(acts) for acts in stages] if self.opportunistic else []
        # A stage with W actions splits every backward (checks.validate): B is b - w.
        self.split = (
            [f.split for f in facts] if facts else [WGT in set(map(_op, a)) for a in stages]
        )
        self.b = [costs.b[s] - costs.w[s] if self.split[s] else costs.b[s] for s in range(P)]
        self.movable: list[list[bool] | None] = [None] * P
        self.gates: list[tuple[list[int] | None, int]] = [(None, 0)] * P
        if facts:
            self._prepare_decisions(facts)
        self.context = [
            (self.lists[s], self.starts[s], self.inbox[s], self.out_dur[s])
            + (costs.f[s], costs.r[s], self.b[s], s + 1 if s + 1 < P else -1, s - 1)
            + (costs.w[s], self.movable[s], *self.gates[s])
            for s in range(P)
        ]
        self.pos = [0] * P
        self.free = [0.0] * P
        self.waiting = [BLOCKED] * P
        self.todo = collections.deque(range(P))  # first in, first out (module doc)
        self.heap: list[tuple[float, int]] = []
        self.deviations = 0

    def _prepare_decisions(self, facts: list[StageFacts]) -> None:
        """State of the opportunistic decisions (``_choose``), per stage."""
        P = self.P
        # Per position: may a forward move ahead of it (copied: deviations reorder it).
        self.movable = [list(f.movable) for f in facts]
        self.held = [_held(f, self.M) for f in facts]
        # A stage whose forwards add one kind holds its peak of it: no forward may move.
        self.gates = [_gate(held, f.peak) for f, held in zip(facts, self.held, strict=True)]
        self.rec = [f.recomputed for f in facts]
        self.bounds = [f.peak for f in facts]
        self.next_forward = [0] * P
        self.decided = [-1] * P  # position where the stage chose to keep order
        self.wants: list[tuple[int, int]] = [(-1, -1)] * P  # inbox keys a parked stage needs

    def run(self) -> None:
        """Advance stages along data flow; decide parked stages in time order."""
        todo, heap, waiting, free = self.todo, self.heap, self.waiting, self.free
        while True:
            while todo:
                self._advance(todo.popleft())
            if not heap:
                break
            t, s = heapq.heappop(heap)
            if waiting[s] != PARKED or t < free[s] or self._choose(s, self.pos[s], t, True):
                continue
            free[s], waiting[s] = t, BLOCKED
            todo.append(s)
        blocked = [s for s in range(self.P) if self.pos[s] < len(self.lists[s])]
        if blocked:
            waits = ", ".join(f"stage {s} at {self.lists[s][self.pos[s]]}" for s in blocked)
            raise ValueError(f"schedule deadlocks in simulation: {waits}")

    def _advance(self, s: int) -> None:
        """Run stage s's list from where it stopped until an input is missing (the hot
        loop: one function, locals only, nothing allocated per action but its start)."""
        acts, starts, inbox, dur, f, r, b, nxt, prv, wc, movable, gate, cap = self.context[s]
        k, t, n, M = self.pos[s], self.free[s], len(acts), self.M
        inboxes, waiting, capped = self.inbox, self.waiting, self.capped
        while k < n:  # the caller set waiting[s] to BLOCKED
            a = acts[k]
            if movable is not None and movable[k] and inbox[M + a.micro_batch] > t:
                # A backward task without its gradient: Varuna's deviation, unless the
                # stage already holds as many as its next forward may add (``_gate``).
                if (gate is None or gate[k] < cap) and self._choose(s, k, t, settled=False):
                    break
                a = acts[k]
            op = a.op
            if op is REC or op is WGT:  # needs nothing from another stage, sends nothing
                starts.append(t)
                t += r if op is REC else wc
                k += 1
                continue
            key, cost, dst = (a.micro_batch, f, nxt) if op is FWD else (M + a.micro_batch, b, prv)
            ready = inbox[key]
            if ready > t:
                if ready == INF:
                    waiting[s] = key
                    break
                t = ready
            starts.append(t)
            t += cost
            k += 1
            if dst >= 0:
                inboxes[dst][key] = arrival = self._send(s, key, t) if capped else t + dur[key]
                w = waiting[dst]
                if w == key:
                    waiting[dst] = BLOCKED
                    self.todo.append(dst)
                elif w == PARKED and key in self.wants[dst]:  # what its decision needs
                    heapq.heappush(self.heap, (arrival, dst))
        self.pos[s], self.free[s] = k, t

    def _send(self, s: int, key: int, t: float) -> float:
        """Arrival of a send issued at ``t`` when sends wait, in issue order, for a slot."""
        inflight = self.inflight[s]
        if len(inflight) >= self.costs.max_inflight_sends:
            t = max(t, heapq.heappop(inflight))
        self.sent[s][key] = t
        arrival = t + self.out_dur[s][key]
        heapq.heappush(inflight, arrival)
        return arrival

    def _choose(self, s: int, k: int, t: float, settled: bool) -> bool:
        """Stage s, free at t, is at a backward task at position k: True if it waits.

        The task is R(i) before its B(i), or a B(i) without recompute (never a B after
        its R: rule 2). If the gradient has not arrived by t and the next forward in
        the list has its input and fits the schedule's activation peaks, that forward
        moves ahead and runs now. Otherwise a recompute runs now, as in strict order,
        and a backward waits for its gradient or that forward's input. ``settled``:
        every arrival up to t is computed; if not, a decision that needs one not
        computed yet parks the stage until t comes (decisions in time order).
        """
        acts, inbox = self.lists[s], self.inbox[s]
        a = acts[k]  # movable: an R, or a B without one
        grad = inbox[self.M + a.micro_batch]
        j = -1 if grad <= t or k == self.decided[s] else self._fitting_forward(s, k)
        if j < 0:
            return False
        need = (self.M + a.micro_batch, acts[j].micro_batch)  # inbox keys: grad, fwd
        fwd = inbox[need[1]]
        if not settled and (
            (grad == INF and self._earliest(s + 1, need[0]) <= t)
            or (fwd == INF and self._earliest(s - 1, need[1]) <= t)
        ):  # an arrival not computed yet may come by t: decide when t comes
            self.waiting[s], self.wants[s] = PARKED, need
            heapq.heappush(self.heap, (t, s))
            return True
        if fwd <= t:
            self._move_ahead(s, j, k)
            return False
        if a.op is REC:
            self.decided[s] = k
            return False
        # Parked until the gradient or that forward's input (nothing else moves it).
        self.waiting[s], self.wants[s] = PARKED, need
        for wake in (grad, fwd):
            if wake < INF:
                heapq.heappush(self.heap, (wake, s))
        return True

    def _move_ahead(self, s: int, j: int, k: int) -> None:
        """Move the forward at position j to position k (a deviation). Only k .. j
        change (slices of one length: nothing after j is shifted)."""
        for order in (self.lists[s], self.movable[s]):
            order[k : j + 1] = order[j : j + 1] + order[k:j]
        for held in self.held[s]:  # before k + 1 .. j: one position on, plus the F
            if held is None:
                continue
            if held[j + 1] - held[j]:
                held[k + 1 : j + 1] = [x + 1 for x in held[k:j]]
            else:  # the F adds none of this kind
                held[k + 1 : j + 1] = held[k:j]
        self.deviations += 1

    def _earliest(self, src: int, key: int) -> float:
        """No earlier than this can the output ``key`` of stage ``src``, not computed
        yet, arrive: the stage runs in order from ``free[src]`` (a bound that settles a
        decision at once where the arrival cannot come by the decision's time)."""
        cost = self.costs.f[src] if key < self.M else self.b[src]
        return self.free[src] + cost + self.out_dur[src][key]

    def _fitting_forward(self, s: int, k: int) -> int:
        """Position of the next forward after k if it fits the activation peaks, else -1."""
        acts = self.lists[s]
        j = max(self.next_forward[s], k + 1)
        while j < len(acts) and acts[j].op is not FWD:
            j += 1
        self.next_forward[s] = j
        if j == len(acts):  # and none ever after k (forwards only move earlier): no
            self.movable[s][k:] = repeat(False, j - k)  # decision from here on
            return -1
        kind = acts[j].micro_batch in self.rec[s]  # 0: full activations, 1: stashed input
        return j if self.held[s][kind][k] < self.bounds[s][kind] else -1

    def busy(self) -> list[float]:
        """Compute time per stage (one F and one B per micro-batch, a W per micro-batch
        on a split stage, which with its B takes b, R where listed)."""
        c, M = self.costs, self.M
        return [
            M * (c.f[s] + c.b[s]) + (len(self.lists[s]) - (3 if self.split[s] else 2) * M) * c.r[s]
            for s in range(self.P)
        ]

    def timeline(self) -> list[TimelineEntry]:
        """Every interval, grouped by stage: each action, then the send of its output."""
        c, M, out = self.costs, self.M, []
        for s, acts in enumerate(self.lists):
            cost = {FWD: c.f[s], REC: c.r[s], BWD: self.b[s], WGT: c.w[s]}
            for a, start in zip(acts, self.starts[s], strict=True):
                end = start + cost[a.op]
                out.append((s, a, start, end, "compute"))
                key, dst = (a.micro_batch, s + 1) if a.op is FWD else (M + a.micro_batch, s - 1)
                if (a.op is FWD or a.op is BWD) and 0 <= dst < self.P:
                    sent = self.sent[s][key] if self.sent else end
                    kind = "send_activation" if a.op is FWD else "send_gradient"
                    out.append((s, a, sent, self.inbox[dst][key], kind))
            ar_end = self.free[s] + c.ar[s]
            out.append((s, None, self.free[s], ar_end, "allreduce"))
            out.append((s, None, ar_end, ar_end + c.opt[s], "optimizer"))
        return out

    def recosted(self, costs: CostModel) -> Engine:
        """This run with other allreduce and optimizer times (``SimResult.recosted``)."""
        other = copy.copy(self)
        other.costs = costs
        return other

    def step_time(self) -> float:
        """When the last stage finishes its allreduce and optimizer step."""
        c = self.costs
        return max(self.free[s] + c.ar[s] + c.opt[s] for s in range(self.P))
