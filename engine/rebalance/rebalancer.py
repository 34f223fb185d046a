"""Rebalancing a pipeline's stage -> blocks map (DynPipe sec. 3.0.3, Alg. 3).

Pure functions on per-block loads (measured forward+backward seconds, or nonzero
parameter counts after pruning) and a stage map (contiguous runs of blocks):

* ``diffusion``: Alg. 3 restricted to pipelines. Every iteration, each overloaded
  stage (load above the mean) offers a boundary block to the less loaded of its
  neighbours (stages must stay contiguous, so only the first or last block can move,
  and only to stage s-1 or s+1); the move is accepted when it lowers the variance of
  the stage loads and the destination still fits its memory. Iterates until an
  iteration accepts nothing (or ``max_iters``).
* ``partition``: the exact contiguous min-max partition (``partition.partition``); if
  it does not fit memory, diffusion from the current map is used instead.

``rebalance`` applies the tolerance (nothing moves while max/mean - 1 is below it)
and returns a :class:`Decision` with the new map and the block moves.
``first_fit_pack`` is Alg. 4 (packing onto fewer devices), on a pipeline;
``rebalance_plan.pack_to`` runs it and then the balancer over the stages left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jobctl.engine.planner.partition import partition

Stages = list[list[int]]
MemoryFn = Callable[[Stages], list[float]]  # bytes per stage of a stage map


@dataclass(frozen=True)
class Move:
    """Block ``block`` leaves stage ``src`` for stage ``dst``."""

    block: int
    src: int
    dst: int


@dataclass
class Decision:
    """What a balancer decided, with the loads before and after."""

    balancer: str
    by: str
    stages: Stages
    moves: list[Move]
    before: list[float]
    after: list[float]
    reason: str = ""
    iterations: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.moves)

    @property
    def imbalance_before(self) -> float:
        return imbalance(self.before)

    @property
    def imbalance_after(self) -> float:
        return imbalance(self.after)


def loads_of(costs: Sequence[float], stages: Stages) -> list[float]:
    """Total load of each stage."""
    return [float(sum(costs[i] for i in s)) for s in stages]


def imbalance(loads: Sequence[float]) -> float:
    """max / mean - 1 (0 for a perfectly balanced pipeline)."""
    mean = sum(loads) / len(loads) if loads else 0.0
    return max(loads) / mean - 1.0 if mean > 0 else 0.0


def _variance(loads: Sequence[float]) -> float:
    mean = sum(loads) / len(loads)
    return sum((x - mean) ** 2 for x in loads) / len(loads)


def _fits(memory: MemoryFn | None, cap: float, stages: Stages, dst: int) -> bool:
    return memory is None or memory(stages)[dst] <= cap


def moves_between(old: Stages, new: Stages) -> list[Move]:
    """Every block whose stage differs between two maps, in block order."""
    where_old = {b: s for s, blocks in enumerate(old) for b in blocks}
    where_new = {b: s for s, blocks in enumerate(new) for b in blocks}
    if set(where_old) != set(where_new):
        raise ValueError("the two stage maps hold different blocks")
    return [
        Move(b, where_old[b], where_new[b])
        for b in sorted(where_old)
        if where_old[b] != where_new[b]
    ]


def check_stages(stages: Stages, num_blocks: int) -> None:
    """Raise unless ``stages`` are non-empty contiguous runs covering 0..num_blocks-1."""
    flat = [b for s in stages for b in s]
    if flat != list(range(num_blocks)) or any(not s for s in stages):
        raise ValueError(f"stage map {stages} is not {len(stages)} contiguous non-empty runs")


def diffusion(
    costs: Sequence[float],
    stages: Stages,
    memory: MemoryFn | None = None,
    cap: float = float("inf"),
    max_iters: int = 100,
) -> tuple[Stages, int]:
    """Alg. 3 on a pipeline: boundary blocks diffuse toward less loaded neighbours.

    Returns the new map and the number of iterations run.
    """
    cur = [list(s) for s in stages]
    P = len(cur)
    iterations = 0
    while iterations < max_iters:
        iterations += 1
        accepted = False
        for src in range(P):
            loads = loads_of(costs, cur)
            mean = sum(loads) / P
            if loads[src] <= mean or len(cur[src]) < 2:
                continue
            neighbours = [d for d in (src - 1, src + 1) if 0 <= d < P]
            for dst in sorted(neighbours, key=lambda d: loads[d]):
                cand = [list(s) for s in cur]
                block = cand[src].pop(0 if dst < src else -1)
                if dst < src:
                    cand[dst].append(block)
                else:
                    cand[dst].insert(0, block)
                if _variance(loads_of(costs, cand)) < _variance(loads) and _fits(
                    memory, cap, cand, dst
                ):
                    cur, accepted = cand, True
                    break
        if not accepted:
            break
    return cur, iterations


def partition_fitting(
    costs: Sequence[float],
    P: int,
    memory: MemoryFn | None = None,
    cap: float = float("inf"),
) -> Stages | None:
    """The exact min-max partition into P stages, or None if it does not fit memory."""
    stages = partition(list(costs), P)
    if memory is not None and max(memory(stages)) > cap:
        return None
    return stages


def _balance(
    costs: Sequence[float], stages: Stages, balancer: str, memory: MemoryFn | None, cap: float
) -> tuple[Stages, int, str]:
    """The balancer's map, its iterations, and why diffusion ran instead (or "")."""
    if balancer == "partition":
        new = partition_fitting(costs, len(stages), memory, cap)
        if new is None:
            new, iters = diffusion(costs, stages, memory, cap)
            return new, iters, "exact partition does not fit memory; diffusion instead"
        return new, 0, ""
    if balancer == "diffusion":
        return (*diffusion(costs, stages, memory, cap), "")
    raise ValueError(f"unknown balancer {balancer!r}; valid: diffusion, partition")


def rebalance(
    costs: Sequence[float],
    stages: Stages,
    balancer: str,
    by: str = "time",
    tolerance: float = 0.05,
    memory: MemoryFn | None = None,
    cap: float = float("inf"),
) -> Decision:
    """Run ``balancer`` (diffusion | partition) on ``stages`` with per-block ``costs``."""
    check_stages(stages, len(costs))
    before = loads_of(costs, stages)
    keep = Decision(balancer, by, [list(s) for s in stages], [], before, before)
    if imbalance(before) <= tolerance:
        keep.reason = f"imbalance {imbalance(before):.3f} within tolerance {tolerance}"
        return keep
    new, iters, keep.reason = _balance(costs, stages, balancer, memory, cap)
    after = loads_of(costs, new)
    if max(after) >= max(before) * (1 - 1e-9):
        keep.reason = keep.reason or "no move lowers the slowest stage"
        keep.iterations = iters
        return keep
    reason = keep.reason or f"max stage load {max(before):.4g} -> {max(after):.4g}"
    return Decision(balancer, by, new, moves_between(stages, new), before, after, reason, iters)


def first_fit_pack(memory_per_stage: Sequence[float], cap: float, target: int) -> list[list[int]]:
    """Alg. 4: merge stage ``src`` into a later stage while both fit one device and more
    than ``target`` devices are active. Returns groups of old stages (one per device).

    In a pipeline a merged group must be contiguous, so ``dst`` is the next active stage.
    """
    groups = [[s] for s in range(len(memory_per_stage))]
    mem = list(memory_per_stage)
    s = 0
    while s < len(groups) - 1 and len(groups) > target:
        if mem[s] + mem[s + 1] < cap:
            groups[s] += groups.pop(s + 1)
            mem[s] += mem.pop(s + 1)
        else:
            s += 1
    return groups
