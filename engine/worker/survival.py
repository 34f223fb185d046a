"""A survivor's part after a lost peer: settle, tell, hear, agree, write, leave.

The trainer traps a lost peer (a failed collective or point-to-point, a peer-gone on a
shared-memory channel) and hands over what this rank holds (``runtime.failure.Held``).
Then, through the run host's store, which outlives every worker:

1. this rank's background checkpoint writer finishes (so no regular checkpoint can be
   published under the survivors' feet), and it posts what it holds;
2. it waits, bounded, for the supervisor's word: which nodes are lost (the supervisor
   kills those first, so nothing of them is left half alive);
3. it reads what every survivor holds and reaches the decision they all reach
   (``checkpoint.emergency.decide``): the step, and which blocks this rank writes;
4. it completes that step's update if it had the summed gradients but not the update,
   writes its blocks, posts that it is done, and leaves with exit status 0, so its
   torchrun agent tears nothing down while local peers still write (the supervisor
   ends the attempt once every survivor is done, or its own bound passed).

No store, no word in time, or no consistent step: the rank leaves as before (the
failure re-raised) and the run falls back to its newest complete checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

from jobctl.engine.checkpoint.blocks import snapshot_blocks
from jobctl.engine.checkpoint.emergency import Decision, decide, survivors_of, write_part
from jobctl.engine.checkpoint.hook import Checkpointing
from jobctl.engine.checkpoint.resume import local_root
from jobctl.engine.core.env import CHANNEL_URL, EPOCH, RDZV_ENDPOINT, SHARED_CKPT_DISK
from jobctl.engine.core.events import Kind
from jobctl.engine.runtime.failure import Held, cut_peer_connections
from jobctl.engine.runtime.trainer import Trainer

KEY = "jobctl/emergency/"  # then the epoch (engine/worker/reform.py): its own keys
WORD_WAIT_S = float(os.environ.get("JOBCTL_EMERGENCY_WAIT_S", "60"))
PEERS_WAIT_S = 60.0  # survivors that saw the loss later (a collective that had not failed,
# a checkpoint write to settle first: up to WRITER_WAIT_S, more on a loaded machine)
WRITER_WAIT_S = 20.0  # this rank's regular checkpoint write in flight
TORN = "torn down (SIGTERM) while handing over: the run falls back"


def epoch() -> int:
    """This process's epoch: how many times its group was re-formed in place
    (engine/worker/reform.py); a loss's keys in the run host's store are the epoch's."""
    return int(os.environ.get(EPOCH, "0"))


def lasting_store():
    """A client of the run host's store, or None where there is none."""
    endpoint = os.environ.get(RDZV_ENDPOINT)
    if not endpoint:
        return None
    from torch.distributed import TCPStore

    host, port = endpoint.rsplit(":", 1)
    return TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30))


def wait_key(store, key: str, timeout_s: float, torn=lambda: False) -> dict | None:
    """The JSON value of ``key`` once set, or None after ``timeout_s`` or once
    ``torn()`` says this rank is being torn down."""
    end = time.monotonic() + timeout_s
    while not store.check([key]):
        if time.monotonic() > end or torn():
            return None
        time.sleep(0.02)
    return json.loads(store.get(key))


def survive(trainer: Trainer, held: Held, run_dir: Path) -> Decision | None:
    """This rank's part (see the module docstring); the decision it acted on, or None
    when there is nothing to hand over (fall back)."""
    store = lasting_store()
    if store is None:
        return None
    with _teardown() as signalled:
        # A rank asked to stop before the failure was caught got its SIGTERM then.
        torn = lambda: signalled() or trainer.stop_requested  # noqa: E731
        try:
            decision = _hand_over(store, trainer, held, run_dir, torn)
        except Exception as e:  # noqa: BLE001 - the supervisor hears why, rather than waits
            decision = Decision(None, f"rank {trainer.rank}: {type(e).__name__}: {e}"[:300])
    if decision is not None:
        # Its records (the step's, the checkpoint's) are in the run's metrics before it
        # answers: the supervisor reads them as this attempt's, never the next one's.
        getattr(trainer.events, "flush", lambda timeout: True)(timeout=5.0)
        answer = {"step": decision.step, "why": decision.why}
        store.set(f"{KEY}{epoch()}/done/{trainer.rank}", json.dumps(answer))
    return decision


@contextlib.contextmanager
def _teardown():
    """Whether a SIGTERM came during the hand-over. The supervisor never signals a
    survivor before it answers, so one comes from this rank's own agent, tearing its
    node down (a local peer failed: a worker crashed and no node is lost) within its
    30 s grace, or from a stop or preemption of this very node: waiting for a word that
    will never be acted on would only delay the failure's report by that long."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: got.append(signum))
    try:
        yield lambda: bool(got)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _hand_over(store, trainer: Trainer, held: Held, run_dir: Path, torn) -> Decision | None:
    """Steps 1 to 4 of the module docstring; None when the supervisor said nothing."""
    rank, plan = trainer.rank, trainer.engine.plan
    if os.environ.get(SHARED_CKPT_DISK, "1") != "1":  # parts on separate disks: no one step
        return Decision(None, "the nodes do not share the checkpoint disk")
    if (why := trainer.engine.hand_over_refusal) is not None:  # T > 1, AvgPipe, Mobius
        return Decision(None, why)
    ckpt = next(h for h in trainer.hooks if isinstance(h, Checkpointing))
    _settle_writer(ckpt)
    if torn():  # leaving: the others must not count on this rank's blocks
        return Decision(None, f"rank {rank}: {TORN}")
    cut_peer_connections(_run_host_ports(store))  # a peer blocked on this rank fails now
    store.set(f"{KEY}{epoch()}/rank/{rank}", json.dumps(held.as_record()))
    word = wait_key(store, f"{KEY}{epoch()}/lost", WORD_WAIT_S, torn)
    if torn():
        return Decision(None, f"rank {rank}: {TORN}")
    if word is None:
        return None
    ranks = survivors_of(plan, word["nodes"], set(word.get("gone", [])))
    found = {r: wait_key(store, f"{KEY}{epoch()}/rank/{r}", PEERS_WAIT_S, torn) for r in ranks}
    if torn():
        return Decision(None, f"rank {rank}: {TORN}")
    decision = decide(plan, {r: h for r, h in found.items() if h is not None})
    if decision.step is not None and held.done < decision.step:
        held.apply_pending()
    if decision.step is not None:
        reporter = next(r.rank for r in plan.ranks if r.stage == plan.P - 1 and r.replica == 0)
        said = (found.get(reporter) or {}).get("reported", -1)  # its step record is out
        _write(trainer, ckpt, decision, run_dir, record=said < decision.step)
    return decision


def _run_host_ports(store) -> set[int]:
    """The run host's store and event channel ports: the connections a survivor keeps."""
    ports = {store.port}
    if os.environ.get(CHANNEL_URL):
        port = urlsplit(os.environ[CHANNEL_URL]).port
        ports |= {port} if port else set()
    return ports


def _settle_writer(ckpt: Checkpointing) -> None:
    """Let this rank's regular checkpoint write finish (its errors do not matter now)."""
    with contextlib.suppress(Exception):  # a failed regular write leaves only staging
        ckpt.manager.close(timeout=WRITER_WAIT_S)


def _write(
    trainer: Trainer, ckpt: Checkpointing, decision: Decision, run_dir: Path, record: bool
) -> None:
    """Write this rank's blocks of the decided step, and the step's record if needed."""
    rank, st = trainer.rank, trainer.state
    mine = decision.blocks.get(rank, [])
    if mine:
        masks = ckpt.masks() if ckpt.masks is not None else None
        snap = snapshot_blocks(st.stage, st.opt, mine, ckpt.ties, masks)
        root = local_root(ckpt.spec.checkpoint, run_dir)
        published = write_part(root, decision, rank, snap, ckpt.meta(st.plan, decision.step))
        if published is not None:
            trainer.events.write(Kind.CHECKPOINT, step=decision.step, path=str(published))
    if rank == decision.leader and record:
        # The reporter may have died before it wrote this step's record; its loss was
        # summed by the step's commit, so every survivor knows it.
        trainer.events.write(
            Kind.STEP,
            step=decision.step,
            loss=decision.loss,
            step_time_s=None,
            samples_per_s=0.0,
            emergency=True,
        )
