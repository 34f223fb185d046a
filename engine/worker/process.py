"""Entry point of one worker process, launched by torchrun on every node.

torchrun matches abbreviations of its own flags even after the script name, so the
worker takes no arguments: everything comes from the run folder named by
``JOBCTL_RUN_DIR`` (the spec, the plan) and torchrun's own environment (RANK, ...).
The worker's stdout and stderr go to ``logs/rank-<RANK>.log`` in the run folder.
"""

from __future__ import annotations

import os
import signal
import sys
import time

STARTED = time.time()  # this process's start, for its start-up timeline
_early_sigterm: list[int] = []
_forked_from: list[int] = []  # the warm agent this worker was forked from, if it was


def _note_sigterm(signum: int, _frame) -> None:
    _early_sigterm.append(signum)


# Installed before torch is imported: a preemption notice that arrives while the worker
# is still starting must mean "checkpoint at the first step end", not sudden death.
signal.signal(signal.SIGTERM, _note_sigterm)

import gc  # noqa: E402
import logging  # noqa: E402
import traceback  # noqa: E402
import uuid  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from jobctl.engine.core.env import (  # noqa: E402
    IN_PLACE,
    NODE,
    RDZV_ENDPOINT,
    RESUME_DIR,
    RUN_DIR,
    THREADS,
    TORCHRUN_RANK,
)
from jobctl.engine.worker.timeline import mark  # noqa: E402

if TYPE_CHECKING:
    from jobctl.engine.core.plan import Plan
    from jobctl.engine.runtime.trainer import Trainer
    from jobctl.engine.worker.reform import Reform
    from jobctl.spec.job import JobSpec


def _redirect_output(run_dir: Path, rank: int) -> None:
    log_dir = run_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_dir / f"rank-{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _device(kind: str) -> torch.device:
    if kind == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def plan_rank(plan, env: dict) -> int:
    """This process's rank in the plan: the plan's rank at (node script, local rank).

    torchrun's c10d rendezvous numbers the agents in its own order (sorted host, then
    agent pid), so its RANK need not fall on the node the plan placed that rank on; the
    plan's placement (stages spread so allreduce stays intra-node, which node a
    heartbeat, a loss or a straggler is on, which node packing releases) holds only if
    each worker takes the plan's rank for the node script it runs under (JOBCTL_NODE).
    torch.distributed ranks are labels in the store, so any permutation works (see
    ``_store`` for who hosts it). Without JOBCTL_NODE (pods), or when the launch does
    not match the plan, RANK stands.
    """
    rank = int(env["RANK"])
    node, local = env.get(NODE), int(env.get("LOCAL_RANK", "0"))
    if node is None or not node.isdigit() or int(env.get("WORLD_SIZE", "0")) != plan.world_size:
        return rank
    mine = [r for r in plan.ranks if r.node == int(node)]
    if len(mine) != int(env.get("LOCAL_WORLD_SIZE", "0")):
        return rank
    return next((r.rank for r in mine if r.local_rank == local), rank)


_KEEP: list = []


def _store(env: dict, timeout: timedelta) -> dist.Store:
    """The store the process group meets in.

    As ``env://`` does, torchrun's rank 0 (the worker on MASTER_ADDR's host, whichever
    plan rank it took) hosts a store at MASTER_ADDR:MASTER_PORT. That store dies with
    its worker, and packing may free exactly that worker while the ranks left still
    create groups, so with the run host's store at hand (JOBCTL_RDZV_ENDPOINT, which
    outlives every worker) the group meets there instead, under a prefix fresh for
    this worker group: a nonce that torchrun's rank 0 hands out through its own store.
    """
    host, port, world = env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"])
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return dist.TCPStore(host, port, world, is_master=False, timeout=timeout)
    first = env.get(TORCHRUN_RANK, env["RANK"]) == "0"
    boot = dist.TCPStore(host, port, world, is_master=first, timeout=timeout, multi_tenant=True)
    lasting = env.get(RDZV_ENDPOINT)
    if not lasting:
        return boot
    _KEEP.append(boot)  # rank 0's server must outlive the other workers' reads
    if first:
        boot.set("jobctl/group", f"{env.get('TORCHELASTIC_RUN_ID', '')}/{uuid.uuid4().hex}")
    prefix = boot.get("jobctl/group").decode()
    rdzv_host, rdzv_port = lasting.rsplit(":", 1)
    store = dist.TCPStore(rdzv_host, int(rdzv_port), is_master=False, timeout=timeout)
    return dist.PrefixStore(f"jobctl/pg/{prefix}/", store)


def _join_group(plan: Plan, rank: int) -> None:
    """Join the run's process group as ``rank`` (see ``_store`` for where it meets)."""
    from jobctl.engine.runtime.p2p.gloo import join_world, pg_timeout_s

    store = _store(os.environ, timedelta(seconds=pg_timeout_s()))
    join_world(store, rank, int(os.environ["WORLD_SIZE"]), plan.device)


def _train(
    spec: JobSpec,
    plan: Plan,
    run_dir: Path,
    rank: int,
    resume: Path | None,
    reformed: Reform | None = None,
) -> tuple[Trainer, Reform | None]:
    """Build the trainer and train; a failure is written to ``errors/rank-<RANK>.txt``.
    Returns the trainer and, where a lost peer's survivors re-form in place
    (engine/worker/reform.py), the word this rank trains on under."""
    from jobctl.engine.runtime.failure import StepFailure
    from jobctl.engine.worker.assembly import build_trainer

    try:
        device = _device(plan.device)
        trainer = _build(build_trainer, (spec, plan, run_dir, rank, device, resume), reformed)
        mark("built")
        # SIGTERM (preemption notice, `jobctl stop`): checkpoint at the end of this step.
        signal.signal(signal.SIGTERM, lambda *_: trainer.request_stop())
        if _early_sigterm:
            trainer.request_stop()
        trainer.run()
    except BaseException as e:
        if isinstance(e, StepFailure):  # a lost peer: hand the held step over, or fall back
            reform = _survive(trainer, e, run_dir)
            if reform is not None:
                return trainer, reform
        traceback.print_exc()
        (run_dir / "errors").mkdir(exist_ok=True)
        (run_dir / "errors" / f"rank-{rank}.txt").write_text(traceback.format_exc())
        raise
    return trainer, None


def _build(build, args: tuple, reformed: Reform | None) -> Trainer:
    """``build(*args)``; after a re-formation in place, said to the supervisor, and a
    failure there ends this process without an error report: the supervisor then
    relaunches from the same checkpoint (a bug shows again there, and is reported)."""
    if reformed is None:
        return build(*args)
    from jobctl.engine.worker.reform import answer
    from jobctl.engine.worker.survival import lasting_store

    gc.collect()  # the old trainer (its hooks refer back to it) before the new one
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    store = lasting_store()
    try:
        trainer = build(*args)
    except BaseException as e:
        _unbuilt(store, reformed, e)
    answer(store, reformed)
    return trainer


def _unbuilt(store, reform: Reform, e: BaseException) -> None:
    """A re-formation failed in this rank: say why, and end (no error report: the
    supervisor relaunches from the same checkpoint, where a bug shows and is reported)."""
    from jobctl.engine.worker.reform import answer

    traceback.print_exc()
    answer(store, reform, f"rank {reform.rank}: {type(e).__name__}: {e}")
    sys.stdout.flush()
    os._exit(1)


def _survive(trainer: Trainer, failure: BaseException, run_dir: Path) -> Reform | None:
    """A lost peer: hand the held step over (engine/worker/survival.py), then train on
    in place (the word returned) or leave with exit status 0, so this node's agent
    tears down no local peer that still writes; returns None (the failure is raised as
    before) when there is nothing to hand over."""
    from jobctl.engine.worker.survival import survive

    try:
        decision = survive(trainer, failure.held, run_dir)
    except Exception:  # noqa: BLE001 - the original failure is what the logs must show
        traceback.print_exc()
        decision = None
    if decision is None or decision.step is None:
        return None
    print(f"rank {trainer.rank}: lost a peer; handed over step {decision.step}", flush=True)
    reform = _await_reform(trainer)
    if reform is None:
        _leave(trainer)
    return reform


def _stopped_by_peer(trainer: Trainer) -> bool:
    """Did this rank stop (checkpointed) before the end because other ranks were told
    to (preemption notices), not itself?"""
    asked = trainer.stop_requested or _early_sigterm or trainer.freed
    if asked:
        return False
    return trainer.ledger.done < trainer.training.steps


def _await_reform(trainer: Trainer) -> Reform | None:
    """The supervisor's word to re-form in place (engine/worker/reform.py), this rank
    already in its new group, or None (leave; at once where no word can come). A
    SIGTERM from here on is a stop the new trainer honours at its first step, or,
    before the word, a reason to leave."""
    from jobctl.engine.worker.reform import await_word, rejoin, release
    from jobctl.engine.worker.survival import lasting_store

    if os.environ.get(IN_PLACE) != "1":
        return None
    signal.signal(signal.SIGTERM, _note_sigterm)
    store = lasting_store()
    word = await_word(store, trainer.rank, lambda: bool(_early_sigterm))
    if word is None or _early_sigterm:
        return None
    mark("reform")
    try:
        release(trainer)
        rejoin(store, word)
    except Exception as e:  # noqa: BLE001 - said to the supervisor, which relaunches
        _unbuilt(store, word, e)
    print(
        f"rank {trainer.rank}: re-formed in place as rank {word.rank} of {word.plan.summary()}",
        flush=True,
    )
    _redirect_output(Path(os.environ[RUN_DIR]), word.rank)  # its log is the new rank's
    mark("group")
    return word


def _leave(trainer: Trainer) -> None:
    """Exit 0 at once, once this rank's events are delivered (interpreter teardown,
    with peers gone, can hang in the process group's destructor)."""
    close = getattr(trainer.events, "close", None)
    if close is not None:
        close()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _finish(trainer: Trainer) -> None:
    """Leave a rank that trained to the end without the interpreter's teardown of
    torch, which took 1-3 s per worker on a busy 2-core host after every attempt (the
    run ends only once every worker has). First wait for the work interpreter exit
    would have waited for: a checkpoint upload still running (a stopped run's, past
    its grace). Not for every non-daemon thread: an idle pool's workers (the data
    readers') wait for work forever; interpreter exit shuts their pools down first."""
    from jobctl.engine.checkpoint.upload import wait_for_uploads

    wait_for_uploads()
    _leave(trainer)


def main() -> int:
    run_dir = Path(os.environ[RUN_DIR])
    from jobctl.engine.core.plan import Plan
    from jobctl.spec import load_spec

    plan = Plan.model_validate_json((run_dir / "plan.json").read_text())
    rank = plan_rank(plan, os.environ)
    # Code that reads RANK (user models do) sees the rank torch.distributed will use.
    os.environ[TORCHRUN_RANK], os.environ["RANK"] = os.environ["RANK"], str(rank)
    _redirect_output(run_dir, rank)
    node = os.environ.get(NODE, "?")
    print(f"rank {rank} on node {node} (torchrun rank {os.environ[TORCHRUN_RANK]})")
    if _forked_from:
        print(f"warm start: forked from agent {_forked_from[0]}")
    mark("process", STARTED)
    mark("imported")
    torch.set_num_threads(int(os.environ.get(THREADS, "1")))
    spec = load_spec(run_dir / "spec.yaml")
    _join_group(plan, rank)
    mark("group")
    resume = os.environ.get(RESUME_DIR)
    trainer, reform = _train(spec, plan, run_dir, rank, Path(resume) if resume else None)
    while True:
        if reform is None and _stopped_by_peer(trainer):  # another node's notice
            reform = _await_reform(trainer)
        if reform is None:
            break
        plan, rank = reform.plan, reform.rank  # re-formed in place: train on
        trainer = None  # the old trainer's tensors go before the new one is built
        trainer, reform = _train(spec, plan, run_dir, rank, reform.resume, reform)
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)
    if trainer.freed:
        # Packed away: nothing of this rank is left to finish once its events are
        # delivered. Leave at once (interpreter teardown took seconds at times), so the
        # supervisor can hand this node back to the backend while the others train.
        _leave(trainer)
    _finish(trainer)
    return 0


def forked_main() -> int:
    """``main`` in a worker forked from a warm agent (engine/worker/agent.py): this
    module was imported there, so its start time and early SIGTERM note are this
    process's own only once reset."""
    global STARTED
    STARTED = time.time()
    _early_sigterm.clear()
    signal.signal(signal.SIGTERM, _note_sigterm)
    _forked_from.append(os.getppid())
    return main()


if __name__ == "__main__":
    sys.exit(main())
