"""The Plan: everything a run needs to know about its parallel layout.

A plan is a pure value: P, D, micro-batch size and count, which blocks each stage
holds, which rank runs which stage on which node, the schedule's action lists, and
what the planner predicted. It is written to ``plan.json`` in the run folder and read
by every worker, so the planner and the runtime cannot disagree.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from jobctl.engine.core.actions import Action, parse_actions


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StagePlan(_Frozen):
    """One pipeline stage: its blocks and the ranks that run it (one per replica)."""

    index: int = Field(description="stage number, 0 = first")
    blocks: list[int] = Field(description="model blocks (cut-point sections) this stage holds")
    ranks: list[int] = Field(
        description="global rank of this stage in replica d, for each d (with T > 1: its "
        "t = 0 rank; t is that rank + t, Plan.rank_at)"
    )
    recompute: bool = Field(False, description="forwards keep only inputs; R re-runs them")
    keep_blocks: int | None = Field(
        None,
        description="stage-aware recomputation (Merak sec. 5.2): the leading blocks that keep "
        "their activations; the others keep only their input and recompute in backward",
    )
    alpha: float | None = Field(None, description="Merak's non-recompute ratio alpha_i")
    actions: str = Field(description="compact action list, e.g. 'F0 F1 B0 B1'")

    def action_list(self) -> list[Action]:
        return parse_actions(self.actions)


class RankPlan(_Frozen):
    """Where one worker process sits and what it runs."""

    rank: int
    node: int = Field(description="logical node index (torchrun agent)")
    local_rank: int
    stage: int
    replica: int
    tp_rank: int = Field(0, description="t: this rank's shard of its stage (0..T-1)")


def idle_share(bubble_ratio: float | None) -> float | None:
    """Merak's bubble ratio r (the busiest device's idle time over its compute time in
    the pipeline, above 1 when it idles longer than it computes) as the share of the
    pipeline's wall time that device idles, r / (1 + r): in [0, 1), never -0.0. What
    ``jobctl plan`` shows as ``idle``."""
    if bubble_ratio is None:
        return None
    r = max(bubble_ratio, 0.0)
    return r / (1.0 + r) + 0.0  # + 0.0: -0.0 is 0.0


class Prediction(_Frozen):
    """What the planner expects of this plan."""

    step_time_s: float = Field(description="predicted seconds per optimizer step")
    samples_per_s: float
    memory_per_stage_gb: list[float]
    bubble_ratio: float = Field(
        description="Merak's bubble ratio: the busiest device's idle time over its compute "
        "time in the pipeline (can exceed 1); `idle_share` is the share of the step it idles"
    )
    cost_per_1k_samples: float = Field(description="USD per 1,000 samples")
    source: str = Field(description="where the costs came from: analytic or calibration")
    samples_per_s_per_device: float | None = Field(None, description="samples/s / (P x D)")
    calibration: str | None = Field(None, description="fingerprint key of the calibration used")
    startup_s: float | None = Field(
        None,
        description="launch to first step on this machine and backend, measured by earlier "
        "runs (calibration.startup); None: not measured here yet",
    )

    finish_s: float | None = Field(
        None,
        description="wall seconds to finish the whole job: start-up, steps, checkpoints "
        "and expected preemptions (planner.cost)",
    )
    finish_usd: float | None = Field(None, description="USD to finish the whole job")
    hourly_usd: float | None = Field(None, description="USD per hour of the devices used")

    @property
    def idle_share(self) -> float | None:
        """The share of the pipeline's wall time the busiest device idles, in [0, 1)."""
        return idle_share(self.bubble_ratio)

    def total_s(self, steps: int) -> float:
        """End to end: start-up (where measured) and ``steps`` steps."""
        return (self.startup_s or 0.0) + self.step_time_s * steps


class Alternative(_Frozen):
    """A candidate the planner considered and did not pick."""

    P: int
    D: int
    micro_batch_size: int
    schedule: str
    step_time_s: float | None
    samples_per_s: float | None
    why_not: str
    micro_batches: int | None = Field(None, description="micro-batches per replica (N_m)")
    recompute: bool = Field(False, description="the schedule recomputes forwards")
    samples_per_s_per_device: float | None = None
    memory_per_stage_gb: list[float] = Field(default_factory=list)
    bubble_ratio: float | None = None
    cost_per_1k_samples: float | None = Field(None, description="USD per 1,000 samples")

    @property
    def idle_share(self) -> float | None:
        """As ``Prediction.idle_share``; None where the candidate was not simulated."""
        return idle_share(self.bubble_ratio)


class MobiusLayout(_Frozen):
    """A Mobius pipeline (Feng et al., ASPLOS '23, sec. 3): S stages on the N ranks of
    one pipeline (S > N), each stage living in the tier below device memory (pinned
    host memory on CUDA, files on local disk on a CPU device) and uploaded before it
    runs; ``engine.mobius.MobiusRunner`` runs it.

    Shape (stable: the simulator, the Gantt and ``auto`` read it): ``S`` stages;
    ``stages[j]`` the global block indices of stage j (consecutive, in order, every
    block once: the sec. 3.2 MIP partition); ``ranks[j]`` the rank that runs stage j
    (the sec. 3.3 cross mapping from ``hardware.topology``, else j % N); ``prefetch``
    whether the next stage is uploaded while the current one computes. The plan around
    it has P = N ranks, D = T = 1, and ``Plan.stages[r]`` lists all blocks rank r hosts
    (what its checkpoint part writes); ``step_time_s`` is the MIP's predicted step,
    ``optimal`` whether HiGHS proved it, ``contention`` eq. 13 of the mapping (0 without
    a topology) and ``sequential`` that of the plain j % N mapping, for comparison.
    """

    S: int = Field(description="Mobius stages (parallelism.pipeline_stages)")
    stages: list[list[int]] = Field(description="global block indices of each stage")
    ranks: list[int] = Field(description="the rank of each stage (cross mapping)")
    prefetch: bool = Field(True, description="upload the next stage while one computes")
    step_time_s: float | None = Field(None, description="the MIP's predicted step time")
    optimal: bool = Field(True, description="False: a MIP stopped at its time limit")
    contention: float = Field(0.0, description="eq. 13 of ``ranks`` (0: no topology)")
    sequential: float = Field(0.0, description="eq. 13 of the j % N mapping")

    @property
    def N(self) -> int:  # noqa: N802 - the paper's name
        return len(set(self.ranks))

    def hosted(self, rank: int) -> list[int]:
        """The stages ``rank`` runs, in order."""
        return [j for j, r in enumerate(self.ranks) if r == rank]


class Plan(_Frozen):
    """A resolved parallel layout for one run."""

    P: int = Field(description="pipeline stages")
    D: int = Field(description="data-parallel replicas")
    T: int = Field(1, description="tensor-parallel ranks per stage (Merak 4.1), consecutive")
    tp_subpipeline: bool = Field(
        False,
        description="sub-pipelined TMP (Merak 5.3): each micro-batch of a split stage "
        "as two halves, one all-reducing while the other computes (planner.tp_overlap)",
    )
    t_search: list[str] = Field(
        default_factory=list,
        description="how T was chosen (tensor_parallel auto: each T's best, or why only T=1)",
    )
    micro_batch_size: int = Field(description="samples per micro-batch (m)")
    micro_batches: int = Field(description="micro-batches per replica per step (N_m)")
    global_batch_size: int
    schedule: str
    nodes: int = Field(description="torchrun agents (nodes) used")
    processes_per_node: int
    device: str
    block_names: list[str]
    stages: list[StagePlan]
    ranks: list[RankPlan]
    prediction: Prediction | None = None
    alternatives: list[Alternative] = Field(default_factory=list)
    explanation: list[str] = Field(
        default_factory=list, description="the planner's reasoning: m choice, P sweep"
    )
    placement: list[list[int]] | None = Field(
        None,
        description="the stages each device of a replica hosts, where it hosts several "
        "(ZB-V's V: device d hosts stages d and 2P-1-d of 2P); None: stage d on device d. "
        "A rank's ``RankPlan.stage`` is then its device",
    )
    device_actions: list[str] = Field(
        default_factory=list,
        description="with a placement: per device, its actions on its stages in run order "
        "('F0@0 F0@3 B0@3 ...', schedule.placement); each StagePlan keeps its own list",
    )
    mobius: MobiusLayout | None = Field(
        None,
        description="schedule mobius: S stages over the P ranks, swapped through the tier "
        "below device memory (MobiusLayout); None: any other schedule",
    )

    @property
    def world_size(self) -> int:
        return self.T * self.P * self.D

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(d, p, t)`` of ``rank``: its replica, stage and tensor-parallel shard."""
        me = self.ranks[rank]
        return me.replica, me.stage, me.tp_rank

    def rank_at(self, d: int, p: int, t: int = 0) -> int:
        """The rank of shard ``t`` of stage ``p`` in replica ``d`` (T consecutive ranks)."""
        return self.stages[p].ranks[d] + t

    def tp_ranks(self, rank: int) -> list[int]:
        """The T ranks of ``rank``'s tensor-parallel group (itself included)."""
        d, p, _ = self.coords(rank)
        return [self.rank_at(d, p, t) for t in range(self.T)]

    def rank(self, rank: int) -> RankPlan:
        return self.ranks[rank]

    def stage_of(self, rank: int) -> StagePlan:
        return self.stages[self.ranks[rank].stage]

    def hosted(self, rank: int) -> list[StagePlan]:
        """The stages ``rank`` runs: its device's under a placement, else its one stage."""
        if self.placement is None:
            return [self.stage_of(rank)]
        return [self.stages[s] for s in self.placement[self.ranks[rank].stage]]

    def node_sizes(self) -> list[int]:
        """Worker processes on each node."""
        sizes = [0] * self.nodes
        for r in self.ranks:
            sizes[r.node] += 1
        return sizes

    def summary(self) -> str:
        """One line: ``P=2 D=2 m=2 N_m=4 1f1b`` (``T=2 P=2 ...`` with T > 1)."""
        tp = f"T={self.T} " if self.T > 1 else ""
        return (
            f"{tp}P={self.P} D={self.D} m={self.micro_batch_size} "
            f"N_m={self.micro_batches} {self.schedule}"
        )
