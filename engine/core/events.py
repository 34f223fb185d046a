"""The worker -> supervisor event protocol: the event kinds, the writer and the reader.

A worker rank (and the node script, on SIGTERM) reports what it did as one JSON object
per line, ``{"kind": ..., "ts": ..., **fields}``, appended to the run's
``metrics.jsonl``: directly through ``EventLog``, or through the run host's channel
(engine/channel), which appends the same lines. The supervisor follows the file with
``read_metrics``, which returns whole lines only (a writer may be mid-append).
"""

from __future__ import annotations

import json
import math
import time
from enum import StrEnum
from pathlib import Path
from typing import Any


class Kind(StrEnum):
    """Every kind of record a worker, its channel sender or its node script writes."""

    HEARTBEAT = "heartbeat"  # every rank, every step: compute times, memory
    ALIVE = "alive"  # the channel's sender thread while the rank sends nothing else
    CHANNEL_DROPPED = "channel_dropped"  # the channel's queue overflowed
    STEP = "step"  # the reporter rank: a step trained (loss, throughput)
    EVAL = "eval"  # the reporter rank: the validation split's loss (training.eval_every)
    SIGTERM = "sigterm"  # a rank got SIGTERM: checkpoint at the end of the step
    NODE_SIGTERM = "node_sigterm"  # a node script got SIGTERM (templates/node.sh.j2)
    STOPPED = "stopped"  # a rank checkpointed after a stop and is leaving
    CHECKPOINT = "checkpoint"  # a step's checkpoint is published locally
    CHECKPOINT_SKIPPED = "checkpoint_skipped"  # a waiting snapshot replaced by a newer one
    STAGING_CLEARED = "staging_cleared"  # a half-written checkpoint removed at start
    UPLOAD = "upload"  # upload progress of a local group's part
    UPLOADED = "uploaded"  # a step is committed to the remote store
    UPLOAD_ERROR = "upload_error"
    PRUNING = "pruning"  # a pruning step (the reporter rank)
    PROFILE = "profile"  # the profiled step after pruning (every rank)
    REBALANCE = "rebalance"  # a rebalancing decision that moved nothing
    REBALANCED = "rebalanced"  # layers moved between stages
    PACKED = "packed"  # layers moved onto fewer stages, freeing ranks
    REBALANCE_MEASURED = "rebalance_measured"  # the measured effect of a move
    FREED = "freed"  # a rank packed away, with the node script it runs under
    TP_SUBPIPELINE = "tp_subpipeline"  # a T > 1 rank's sub-pipelined and plain TMP blocks


class EventLog:
    """Appends JSON lines to the run's ``metrics.jsonl`` (small atomic appends)."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, kind: str, **fields) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"kind": kind, "ts": time.time(), **fields}) + "\n")


def read_metrics(path: Path, offset: int) -> tuple[list[dict], int]:
    """New complete JSON lines of ``metrics.jsonl`` after byte ``offset``."""
    if not path.exists():
        return [], offset
    with open(path, "rb") as f:
        f.seek(offset)
        chunk = f.read()
    end = chunk.rfind(b"\n") + 1
    lines = chunk[:end].decode(errors="replace").splitlines()
    return [rec for rec in map(_record, lines) if rec is not None], offset + end


def _record(line: str) -> dict | None:
    """The JSON object on ``line``; None for a blank or damaged line, which the readers
    skip (the channel refuses such input; a shared-disk writer can still leave one)."""
    try:
        rec = json.loads(line) if line.strip() else None
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) else None


def finite(doc: Any) -> Any:
    """``doc`` with every non-finite float (NaN, +-inf) as None, in dicts and lists at
    any depth: what ``json.dumps(..., allow_nan=False)`` can write (NaN is not JSON)."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [finite(v) for v in doc]
    return doc
