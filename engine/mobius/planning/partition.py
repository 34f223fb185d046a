"""Mobius's MIP partition (Mobius sec. 3.2, constraints 4-11), solved with HiGHS.

The paper's MIP assigns L layers (after ``merge_identical``) to up to L logical
stages with booleans B_{i,j}. Here the stage count S is fixed per MIP, one MIP per S,
and the boolean is per run: x_{a,b,j} = [stage j is units a..b], created only for
runs that fit the device memory (constraint 4), one run per stage, stage j + 1
starting where stage j ends; B_{i,j} is the sum of x_{a,b,j} over a <= i <= b, so
every linear term of the paper keeps its meaning, and with S fixed no stage is
empty and the last N stages (the ones still resident when the backward starts) are
known. Times are in seconds (a prefetch counts as the seconds of upload it saves),
bytes over B. Stage j runs on device ``j % N``. The objective is the paper's: the end
of the first stage's backward on the last micro-batch, t^b_{0,M} + T^b_0. Valid
inequalities implied by the constraints (a device's compute and upload gaps are
sequential) tighten the LP relaxation that bounds each S from below (in the MIPs
themselves they slowed HiGHS down: 5.1 s against 3.0 s of CPU for S = 11-13 of the
48-layer benchmark at 18 units).

``mobius_partition`` returns the stages, their layers, their devices and the
predicted step time; ``costs.step_time`` prices any partition by the same
rules, and the unit tests check the MIP against enumerating every partition.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from jobctl.engine.mobius.planning.costs import (
    LayerCost,
    MobiusConfig,
    even_sizes,
    merge_identical,
    step_time,
    unit_layers,
)


@dataclass(frozen=True)
class MobiusPartition:
    """The MIP's answer: stage s holds ``stages[s]`` (layer indices) on ``device[s]``."""

    stages: tuple[range, ...]
    devices: tuple[int, ...]
    step_time_s: float  # the MIP's objective
    group: int  # identical layers merged per unit (1: none)
    solve_s: float
    optimal: bool  # False: a MIP stopped at MobiusConfig.time_limit_s

    @property
    def sizes(self) -> list[int]:
        return [len(r) for r in self.stages]


class _Program:
    """A mixed-integer program under construction: variables, rows, then HiGHS."""

    def __init__(self) -> None:
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.integer: list[int] = []
        self.rows: list[tuple[dict[int, float], float, float]] = []
        self.timed_out = False

    def var(self, lb: float = 0.0, ub: float = math.inf, integer: bool = False) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(int(integer))
        return len(self.lb) - 1

    def geq(self, terms: dict[int, float], rhs: float = 0.0) -> None:
        """sum(terms) >= rhs."""
        self.rows.append((terms, rhs, math.inf))

    def leq(self, terms: dict[int, float], rhs: float = 0.0) -> None:
        """sum(terms) <= rhs."""
        self.rows.append((terms, -math.inf, rhs))

    def solve(self, objective: dict[int, float], time_limit: float) -> np.ndarray | None:
        """HiGHS's optimum; None when the rows cannot all hold."""
        # Imported here: scipy.optimize costs 0.7 s of CPU, and every `jobctl apply`
        # and `plan` imports this module whether or not the job uses Mobius.
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix

        c = np.zeros(len(self.lb))
        for k, v in objective.items():
            c[k] += v
        entries = [(i, k, v) for i, (t, _, _) in enumerate(self.rows) for k, v in t.items()]
        r, k, v = zip(*entries, strict=True)
        a = coo_matrix((v, (r, k)), shape=(len(self.rows), len(self.lb))).tocsr()
        lo = np.array([row[1] for row in self.rows])
        hi = np.array([row[2] for row in self.rows])
        res = milp(  # status 0 optimal, 1 time limit, 2 infeasible
            c,
            constraints=LinearConstraint(a, lo, hi),
            integrality=np.array(self.integer),
            bounds=Bounds(np.array(self.lb), np.array(self.ub)),
            options={"time_limit": time_limit, "mip_rel_gap": 1e-7},
        )
        self.timed_out = self.timed_out or res.status == 1
        if res.status not in (0, 1, 2):
            raise RuntimeError(f"HiGHS failed on the Mobius partition: {res.message}")
        return res.x


def _prefix(values: list[float]) -> list[float]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


def _add(*parts: dict[int, float], scale: tuple[float, ...] = ()) -> dict[int, float]:
    """The linear combination of ``parts`` with weights ``scale`` (default 1 each)."""
    out: dict[int, float] = {}
    for n, part in enumerate(parts):
        w = scale[n] if n < len(scale) else 1.0
        for k, v in part.items():
            out[k] = out.get(k, 0.0) + w * v
    return out


class _Partition:
    """The variables of sec. 3.2 for ``units`` in exactly ``stages`` stages on ``cfg``,
    and the rows over them."""

    def __init__(
        self, units: list[LayerCost], cfg: MobiusConfig, stages: int, relaxed: bool = False
    ) -> None:
        self.u, self.cfg, self.p, self.relaxed = units, cfg, _Program(), relaxed
        L, K, M = len(units), stages, cfg.micro_batches
        self.L, self.K = L, K
        self.runs = self._runs(relaxed)
        self.tf = [[self.p.var() for _ in range(M)] for _ in range(K)]
        self.tb = [[self.p.var() for _ in range(M)] for _ in range(K)]
        self.link: list[list[dict[int, float]]] = [[] for _ in range(cfg.devices)]
        self.idle: list[list[dict[int, float]]] = [[] for _ in range(cfg.devices)]

    def _runs(self, relaxed: bool) -> list[dict[tuple[int, int], int]]:
        """x_{a,b,j}: stage j is units a..b, for the runs that fit the memory
        (constraint 4) and leave every other stage at least one unit."""
        L, K, G = self.L, self.K, self.cfg.memory_bytes
        mem_f, mem_b = _prefix([u.memory_f for u in self.u]), _prefix([u.memory_b for u in self.u])
        runs: list[dict[tuple[int, int], int]] = []
        for j in range(K):
            firsts = range(j, L - K + j + 1) if j else range(1)
            runs.append({})
            for a in firsts:
                lasts = range(a, L - K + j + 1) if j < K - 1 else range(L - 1, L)
                for b in lasts:
                    if max(mem_f[b + 1] - mem_f[a], mem_b[b + 1] - mem_b[a]) <= G:
                        runs[j][a, b] = self.p.var(0.0, 1.0, not relaxed)
        return runs

    def stage(self, j: int, per_unit: list[float]) -> dict[int, float]:
        """sum_i per_unit[i] * B_{i,j}, B_{i,j} = sum of x_{a,b,j} over a <= i <= b."""
        pre = _prefix(per_unit)
        return {v: pre[b + 1] - pre[a] for (a, b), v in self.runs[j].items()}

    def sent(self, j: int) -> dict[int, float]:
        """Seconds to send stage j's output: its last unit's boundary."""
        return {v: self.u[b].boundary / self.cfg.link for (_, b), v in self.runs[j].items()}

    def time(self, j: int, dur: str) -> dict[int, float]:
        """Stage j's seconds per micro-batch of ``dur``: a backward recomputes the
        forward in every stage but the last (``costs.as_run``)."""
        T = self.stage(j, self.col(dur))
        if dur == "backward_s" and j < self.K - 1:
            T = _add(T, self.stage(j, self.col("recompute_s")))
        return T

    def data(self, j: int, e: str) -> dict[int, float]:
        """Seconds of link before stage j's forward (e "f": the record up, the update,
        the store back) or backward ("b": weights, gradients down, the input reload of
        its first unit), as ``costs.as_run`` prices them."""
        if e == "f":
            return _add(self.stage(j, self.col("upload_f")), self.stage(j, self.col("update_s")))
        reload = {v: self.u[a].reload / self.cfg.tier_Bps for (a, _), v in self.runs[j].items()}
        down = self.stage(j, self.col("grad_down"))
        return _add(self.stage(j, self.col("upload_b")), down, reload)

    def col(self, name: str) -> list[float]:
        """A LayerCost field per unit; bytes in seconds at B, memory over B too."""
        vals = [getattr(x, name) for x in self.u]
        return vals if name.endswith("_s") else [v / self.cfg.tier_Bps for v in vals]

    def structure(self) -> None:
        """One run per stage, and stage j + 1 starts right after stage j ends."""
        for j, runs in enumerate(self.runs):
            self.p.geq(dict.fromkeys(runs.values(), 1.0), 1.0)
            self.p.leq(dict.fromkeys(runs.values(), 1.0), 1.0)
            if j + 1 == self.K:
                continue
            for e in range(self.L - 1):
                ends = {v: 1.0 for (_, b), v in runs.items() if b == e}
                starts = {v: -1.0 for (a, _), v in self.runs[j + 1].items() if a == e + 1}
                if ends or starts:
                    self.p.geq(_add(ends, starts), 0.0)
                    self.p.leq(_add(ends, starts), 0.0)

    def chain(self, t: list[list[int]], dur: str, j: int, frm: int, wire: int) -> None:
        """Constraints 8 and 10: t[j][m] after the previous micro-batch on stage j and
        after micro-batch m on stage ``frm`` plus its send (stage ``wire``'s output)."""
        T = self.time(j, dur)
        Tf = self.time(frm, dur)
        for m in range(self.cfg.micro_batches):
            if m:
                self.p.geq(_add({t[j][m]: 1, t[j][m - 1]: -1}, T, scale=(1, -1)))
            self.p.geq(_add({t[j][m]: 1, t[frm][m]: -1}, Tf, self.sent(wire), scale=(1, -1, -1)))

    def sequence(self, t: list[list[int]], dur: str, j: int) -> None:
        """Constraint 10 alone (the stage that waits for no other stage's output)."""
        T = self.time(j, dur)
        for m in range(1, self.cfg.micro_batches):
            self.p.geq(_add({t[j][m]: 1, t[j][m - 1]: -1}, T, scale=(1, -1)))

    def upload(self, t: list[list[int]], e: str, j: int, prev: int) -> None:
        """Constraints 5, 6 and 9: stage j starts after stage ``prev`` on its device ends
        plus the part of its upload not prefetched (seconds ``pre`` while ``prev`` runs,
        into the memory it leaves free, at most the stage's data)."""
        mem, dur = f"memory_{e}", "forward_s" if e == "f" else "backward_s"
        pre, left = self.p.var(), self.p.var()
        g = self.cfg.memory_bytes / self.cfg.tier_Bps
        self.p.leq(_add({pre: 1}, self.stage(prev, self.col(mem))), g)
        span = _add(self.time(prev, dur), {t[prev][-1]: 1}, {t[prev][0]: -1})
        self.p.leq(_add({pre: 1}, span, scale=(1, -1)))
        data = self.data(j, e)
        self.p.leq(_add({pre: 1}, data, scale=(1, -1)))
        self.p.geq(_add({left: 1, pre: 1}, data, scale=(1, -1)))
        end = _add({t[prev][-1]: 1}, self.time(prev, dur), {left: 1})
        self.p.geq(_add({t[j][0]: 1}, end, scale=(1, -1)))
        self.link[j % self.cfg.devices].append({pre: 1, left: 1})
        self.idle[j % self.cfg.devices].append({left: 1})

    def forward(self) -> None:
        N, tf = self.cfg.devices, self.tf
        for j in range(self.K):
            if j < N:  # the first stage on each device: uploaded at the step's start
                first = self.data(j, "f")
                self.p.geq(_add({tf[j][0]: 1}, first, scale=(1, -1)))
                self.link[j].append(first)
                self.idle[j].append({tf[j][0]: 1})  # idle until its first forward
            else:
                self.upload(tf, "f", j, j - N)
            if j:
                self.chain(tf, "forward_s", j, j - 1, j - 1)
            else:
                self.sequence(tf, "forward_s", j)

    def backward(self) -> None:
        N, K, tb, tf = self.cfg.devices, self.K, self.tb, self.tf
        for j in range(K):
            done = _add({tf[j][-1]: 1}, self.stage(j, self.col("forward_s")))
            self.p.geq(_add({tb[j][0]: 1}, done, scale=(1, -1)))  # constraint 11
            if j + N < K:  # the last stage on each device is still resident
                self.upload(tb, "b", j, j + N)
            if j + 1 < K:
                self.chain(tb, "backward_s", j, j + 1, j)
            else:
                self.sequence(tb, "backward_s", j)

    def bounds(self, objective: dict[int, float]) -> None:
        """Valid inequalities implied by constraints 8-11 that tighten the LP relaxation
        (added to it only):
        a device computes its stages one after another (M (T^f + T^b) each), its link
        carries its uploads one after another (each in the time between the start of
        the stage before it on the device and its own start), and every stage's M
        micro-batches lie on a path with one micro-batch through the rest."""
        M, N = self.cfg.micro_batches, self.cfg.devices
        work = [f + b for f, b in zip(self.col("forward_s"), self.col("backward_s"), strict=True)]
        for d in range(N):
            load = [self.stage(j, work) for j in range(d, self.K, N)]
            tail = [self.stage(j, self.col("backward_s")) for j in range(min(d, self.K))]
            busy = [*load, *self.idle[d], *tail]
            scale = (1, *([-M] * len(load)), *([-1] * (len(self.idle[d]) + len(tail))))
            self.p.geq(_add(objective, *busy, scale=scale))
            self.p.geq(_add(objective, *self.link[d], scale=(1, *([-1] * len(self.link[d])))))
        for j in range(self.K):
            self.p.geq(_add(objective, self.stage(j, work), scale=(1, 1 - M)), sum(work))

    def solve(self, cutoff: float) -> np.ndarray | None:
        """The best solution with a step time below ``cutoff``; None if there is none."""
        self.structure()
        self.forward()
        self.backward()
        objective = _add({self.tb[0][-1]: 1}, self.time(0, "backward_s"))
        if self.relaxed:  # they tighten the LP bound but slow HiGHS's search down
            self.bounds(objective)
        if math.isfinite(cutoff):
            self.p.leq(objective, cutoff)
        self.objective = objective
        return self.p.solve(objective, self.cfg.time_limit_s)

    def sizes_of(self, x: np.ndarray) -> list[int]:
        """Units per stage in a solution."""
        return [next(b - a + 1 for (a, b), v in runs.items() if x[v] > 0.5) for runs in self.runs]

    def value(self, x: np.ndarray) -> float:
        return float(sum(c * x[k] for k, c in self.objective.items()))


def mobius_partition(
    layers: list[LayerCost], cfg: MobiusConfig, stages: int | None = None
) -> MobiusPartition:
    """The step-time-optimal Mobius partition of ``layers`` (identical consecutive
    layers merged first, ``merge_identical``), into exactly ``stages`` stages where
    given (a job's ``parallelism.pipeline_stages``), else into the best count. Raises
    ``ValueError`` when no partition fits the devices' memory."""
    t0 = time.perf_counter()
    units, g = merge_identical(layers, cfg.max_units)
    if stages is not None and len(units) < stages:  # merged too far for S stages
        units, g = layers, 1
    value, sizes, optimal = _optimum(units, cfg, stages)
    if not math.isfinite(value):
        raise ValueError("no Mobius partition fits the devices' memory (hardware.memory_gb)")
    stages = _spans(unit_layers(layers, g), sizes)
    return MobiusPartition(
        stages=tuple(stages),
        devices=tuple(s % cfg.devices for s in range(len(stages))),
        step_time_s=value,
        group=g,
        solve_s=time.perf_counter() - t0,
        optimal=optimal,
    )


def _spans(spans: list[range], sizes: list[int]) -> list[range]:
    """Stages of ``sizes`` consecutive spans each, as one range each."""
    ends = [sum(sizes[: k + 1]) for k in range(len(sizes))]
    return [range(spans[e - n].start, spans[e - 1].stop) for e, n in zip(ends, sizes, strict=True)]


def _optimum(
    units: list[LayerCost], cfg: MobiusConfig, stages: int | None = None
) -> tuple[float, list[int], bool]:
    """The least step time over partitions of ``units`` (into ``stages`` stages, where
    given), the stage sizes giving it and whether every MIP was solved to the end (not
    stopped by the time limit).

    One MIP per stage count S. The first incumbent is the best even split; the LP
    relaxation of each S bounds it from below, and the stage counts are solved in
    order of their bound, each cut off at the incumbent, until the next bound is no
    better."""
    counts = range(1, len(units) + 1) if stages is None else [stages]
    value, S = min((step_time(units, even_sizes(len(units), S), cfg), S) for S in counts)
    sizes, optimal = even_sizes(len(units), S), True
    for bound, S in sorted((_relaxation(units, cfg, S), S) for S in counts):
        if bound >= value * (1 - 1e-9):
            break
        problem = _Partition(units, cfg, S)
        x = problem.solve(value)
        optimal = optimal and not problem.p.timed_out
        if x is not None and problem.value(x) < value * (1 - 1e-9):
            value, sizes = problem.value(x), problem.sizes_of(x)
    return value, sizes, optimal


def _relaxation(units: list[LayerCost], cfg: MobiusConfig, stages: int) -> float:
    """The LP relaxation's step time with ``stages`` stages (inf: none fits)."""
    problem = _Partition(units, cfg, stages, relaxed=True)
    x = problem.solve(math.inf)
    return math.inf if x is None else problem.value(x)
