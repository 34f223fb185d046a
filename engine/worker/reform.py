"""A survivor trains on in its own process after a lost node (issue #25, in place).

After the hand-over (``survival``) a survivor's process already holds what a relaunch
spends seconds on: torch, jobctl and ``torch._dynamo`` imported, the run host's store
and channel reached. So rather than exit and be relaunched, it waits, bounded, for the
supervisor's word under ``jobctl/reform/<epoch>`` in the run host's store (posted by
engine/supervise/reform.py): the re-planned layout (a plan file in the run folder),
each survivor's new rank, a fresh prefix for the new process group, and the checkpoint
to continue from (the emergency one the survivors just wrote). It gives up the old
trainer (its data readers, links and event client) and the broken process group, joins
the new group, and the worker builds a new trainer from that checkpoint: checkpoints
are layout-independent, so any layout of the survivors works. Once built, it says so
(``ok/<rank>``) and trains on; the supervisor follows the same processes as the next
attempt. No word in time, or this rank left out of it (or a ``leave`` word): it leaves
as before, exit status 0 (the supervisor ends survivors it does not re-form). A
failure before the new trainer is built: it posts ``failed/<rank>`` and exits 1, and
the supervisor relaunches from the same checkpoint.

Each re-formation starts an epoch: the hand-over and re-formation keys of the next
loss live under the next epoch's number (``JOBCTL_EPOCH``), never a stale one.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from jobctl.engine.checkpoint.upload import wait_for_uploads
from jobctl.engine.core.env import EPOCH, NODE
from jobctl.engine.core.plan import Plan
from jobctl.engine.runtime.p2p.gloo import join_world
from jobctl.engine.runtime.trainer import Trainer
from jobctl.engine.worker.survival import epoch, wait_key

KEY = "jobctl/reform/"  # engine/supervise/reform.py's
# As long as the supervisor waits for the answers (engine/supervise/reform.py): a slow
# re-plan must not send survivors away that it is about to re-form.
WAIT_S = float(os.environ.get("JOBCTL_REFORM_WAIT_S", "60"))
UPLOAD_WAIT_S = 60.0  # the old trainer's checkpoint upload, which reports through its sink


@dataclass(frozen=True)
class Reform:
    """The supervisor's word to one survivor: where it trains on."""

    plan: Plan
    rank: int  # this rank's number in ``plan``
    resume: Path  # the checkpoint the new trainer starts from
    prefix: str  # the new process group's store prefix
    epoch: int  # the epoch the word was posted in


def await_word(store, old_rank: int, torn) -> Reform | None:
    """The word for this rank (bounded by ``WAIT_S``), or None: leave."""
    now = epoch()
    word = wait_key(store, f"{KEY}{now}", WAIT_S, torn)
    if word is None or "leave" in word or str(old_rank) not in word["ranks"]:
        return None
    plan = Plan.model_validate_json(Path(word["plan"]).read_text())
    new_rank = int(word["ranks"][str(old_rank)])
    return Reform(plan, new_rank, Path(word["resume"]), word["prefix"], now)


def release(trainer: Trainer) -> None:
    """Give up what the old trainer holds beyond its tensors: its links (cut already
    when it trapped), data readers and event client (flushed first: the hand-over's
    records must reach the supervisor before the new attempt's)."""
    trainer.engine.cut_links()
    wait_for_uploads(UPLOAD_WAIT_S)  # its records must not go into a closed sink
    for source in (trainer.data, trainer.eval_data):
        with contextlib.suppress(Exception):  # a reader thread of a broken step
            getattr(source, "close", lambda: None)()
    close = getattr(trainer.events, "close", None)
    if close is not None:
        close()


def rejoin(store, reform: Reform) -> None:
    """Leave the broken process group and join the new one as ``reform.rank``; from
    here code that reads RANK and WORLD_SIZE (user models do) sees the new layout."""
    with contextlib.suppress(Exception):  # peers gone: its destructor may complain
        dist.destroy_process_group()
    world = reform.plan.world_size
    os.environ.update(RANK=str(reform.rank), WORLD_SIZE=str(world))
    os.environ[EPOCH] = str(reform.epoch + 1)
    # The node it now is in the plan (packing reports it; the node script keeps its own).
    os.environ[NODE] = str(reform.plan.rank(reform.rank).node)
    group_store = dist.PrefixStore(f"jobctl/pg/{reform.prefix}/", store)
    join_world(group_store, reform.rank, world, reform.plan.device)


def answer(store, reform: Reform, failure: str | None = None) -> None:
    """Tell the supervisor this rank's new trainer is built, or why it is not."""
    if failure is None:
        store.set(f"{KEY}{reform.epoch}/ok/{reform.rank}", "1")
    else:
        store.set(f"{KEY}{reform.epoch}/failed/{reform.rank}", json.dumps(failure[:300]))
