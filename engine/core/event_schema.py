"""The fields each event kind must carry, and the check the channel and the monitor run.

A record reaches the supervisor from a worker's ``EventLog`` or from anyone holding the
run's secret through the channel; a record the supervisor's handlers cannot read (a
``step`` without ``samples_per_s``, a ``heartbeat`` whose ``rank`` is a string) once
crashed it. ``problem`` names what is wrong with a record, or None when it has every
field its kind needs, each of the right type. Other fields are free: kinds carry
extras (``deviations``, ``epoch``) that only the views read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobctl.engine.core.events import Kind

if TYPE_CHECKING:
    from jobctl.engine.core.plan import Plan

MAX_INDEX = 1 << 53  # steps, ranks, nodes, stages: exact in a JSON number


def _index(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_INDEX


def _number(value: Any) -> bool:  # NaN is allowed: a diverged loss is still a record
    return type(value) in (int, float) and not (type(value) is float and math.isinf(value))


def _loss(value: Any) -> bool:  # a diverged loss may be inf too: still a record
    return type(value) in (int, float)


def _loss_or_null(value: Any) -> bool:
    return value is None or _loss(value)


TYPES = {
    "index": _index,
    "number": _number,
    "loss": _loss,
    "loss?": _loss_or_null,
    "text": lambda value: isinstance(value, str),
    "list": lambda value: isinstance(value, list),
    "mapping": lambda value: isinstance(value, dict),
}

_STEP = {"step": "index"}
_NODE = {"node": "index"}
_REBALANCE = {**_STEP, "moves": "list", "balancer": "text", "by": "text"}
SCHEMAS: dict[str, dict[str, str]] = {
    Kind.HEARTBEAT: {**_STEP, **_NODE, "rank": "index", "stage": "index", "compute_s": "number"},
    Kind.ALIVE: _NODE,
    Kind.CHANNEL_DROPPED: {},
    Kind.STEP: {**_STEP, "loss": "loss?", "samples_per_s": "number"},
    Kind.EVAL: {**_STEP, "eval_loss": "loss"},
    Kind.SIGTERM: _NODE,
    Kind.NODE_SIGTERM: _NODE,
    Kind.STOPPED: _STEP,
    Kind.CHECKPOINT: _STEP,
    Kind.CHECKPOINT_SKIPPED: _STEP,
    Kind.STAGING_CLEARED: {},
    Kind.UPLOAD: _STEP,
    Kind.UPLOADED: _STEP,
    Kind.UPLOAD_ERROR: {"error": "text"},
    Kind.PRUNING: {
        **_STEP,
        "stage_sparsity": "list",
        "achieved_sparsity": "number",
        "target_sparsity": "number",
    },
    Kind.PROFILE: {**_STEP, "stage": "index", "replica": "index", "blocks": "mapping"},
    Kind.REBALANCE: {**_STEP, "reason": "text"},
    Kind.REBALANCED: _REBALANCE,
    Kind.PACKED: {**_REBALANCE, "freed_nodes": "list"},
    Kind.REBALANCE_MEASURED: {
        **_STEP,
        "step_s_before": "number",
        "step_s_after": "number",
    },
    Kind.FREED: {"rank": "index", "host_node": "index"},
    Kind.TP_SUBPIPELINE: {
        "rank": "index",
        "stage": "index",
        "subpipelined": "list",
        "plain": "list",
    },
}
KINDS = frozenset(kind.value for kind in Kind)
TYPE_WORDS = {
    "index": "an integer >= 0",
    "number": "a finite number",
    "loss": "a number",
    "loss?": "a number or null",
    "text": "a string",
    "list": "a list",
    "mapping": "a mapping",
}


def problem(record: Any) -> str | None:
    """What makes ``record`` unreadable by its kind's handler, or None if nothing does."""
    if not isinstance(record, dict):
        return f"an event must be a JSON object, not {type(record).__name__}"
    kind = record.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        return f"unknown event kind {str(kind)[:40]!r}"
    if "ts" in record and not _number(record["ts"]):
        return "'ts' must be a finite number"
    for name, type_ in SCHEMAS.get(kind, {}).items():  # a new kind: no fields required yet
        if name not in record:
            return f"a {kind!r} event needs {name!r}"
        if not TYPES[type_](record[name]):
            return f"{kind!r}: {name!r} must be {TYPE_WORDS[type_]}"
    return None


def timed(record: dict) -> bool:
    """Whether ``record`` has a finite ``ts``, which the readers that place records in
    time need: the channel stamps one, but a worker on a shared disk appends to
    ``metrics.jsonl`` directly, and ``problem`` lets a record go without one."""
    ts = record.get("ts")
    return type(ts) in (int, float) and math.isfinite(ts)


@dataclass(frozen=True)
class Bounds:
    """What one run's plan allows its records: a step up to ``steps`` (its
    ``training.steps``), a rank, node or stage below ``ranks``, ``nodes``, ``stages``.
    A record beyond them is schema-valid but impossible (#46 item 5: ``uploaded`` at
    step 2**53 stayed in ``status`` as the last upload, a heartbeat for rank 999 added
    a row). The stage bound is the plan's block count: every engine's stage holds at
    least one block (two a rank under zb_v, S > P under Mobius), so it never refuses a
    real stage; ranks and nodes only shrink within an attempt (an in-place re-form)."""

    steps: int
    ranks: int
    nodes: int
    stages: int

    @classmethod
    def of(cls, plan: Plan, steps: int) -> Bounds:
        ranks = max(plan.world_size, len(plan.ranks))
        return cls(steps, ranks, plan.nodes, len(plan.block_names))

    def problem(self, record: dict) -> str | None:
        """Why ``record`` (schema-valid) cannot be this run's, or None."""
        limits = {
            "step": self.steps + 1,
            "rank": self.ranks,
            "node": self.nodes,
            "host_node": self.nodes,
            "stage": self.stages,
        }
        for name, limit in limits.items():
            value = record.get(name)
            if type(value) is int and value >= limit:
                kind = record.get("kind")
                return f"{kind!r}: {name} {value} is beyond the plan's (at most {limit - 1})"
        return None
