"""Re-forming an attempt in place after a lost node (issue #25): the supervisor's side.

engine/worker/reform.py is the survivors' side. When the survivors have handed a step
over (engine/supervise/handover.py) and the run morphs onto them, fresh processes would
spend seconds on torchrun, imports and ``torch._dynamo`` before their first step. So
the supervisor keeps them: it re-plans for the devices left (the same morph a relaunch
makes), lays the new plan's nodes on the surviving nodes in order (new node i on the
i-th surviving node, with as many ranks as that node has processes; a plan that does
not fit them so is relaunched instead), writes the plan, and posts its word: each
survivor's new rank, a fresh process-group prefix, the emergency checkpoint. Every
survivor then says its new trainer is built, or why not; the same processes are the
next attempt. A failure, or no answer within ``WAIT_S``, falls back to the relaunch
from the same checkpoint (the survivors are ended first).

Only where the nodes are processes jobctl runs itself (``local``): there the surviving
agents are released from torchrun's exit barrier at the end (it would wait for the
lost node's agent), as packing releases a freed node.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from jobctl.engine.checkpoint.resume import ResumePoint
from jobctl.engine.core.plan import Plan
from jobctl.engine.supervise.attempt import Attempt
from jobctl.engine.supervise.handover import connect_store
from jobctl.engine.supervise.launch import Run, run_context, write_plan
from jobctl.spec import JobSpec

KEY = "jobctl/reform/"  # engine/worker/reform.py's
EPOCH_KEY = "jobctl/epoch"  # the epoch a re-formed run is in
WAIT_S = float(os.environ.get("JOBCTL_REFORM_SETTLE_S", "60"))
BACKENDS = ("local",)  # where the surviving nodes' agents can be released at the end


def survivor_layout(old: Plan, new: Plan, lost: list[int]) -> tuple[list[int], dict[int, int]]:
    """The surviving nodes the new plan's nodes run on (in order) and each survivor's
    new rank (old rank -> new rank); empty when the new plan does not fit them."""
    nodes = [n for n in range(old.nodes) if n not in lost]
    sizes = old.node_sizes()
    if [sizes[n] for n in nodes] != new.node_sizes():
        return [], {}
    at = {(r.node, r.local_rank): r.rank for r in old.ranks}
    return nodes, {at[(nodes[r.node], r.local_rank)]: r.rank for r in new.ranks}


@dataclass
class Reformation:
    """One re-formation: the word posted, the survivors' answers awaited."""

    store: object
    epoch: int
    ranks: dict[int, int]  # old rank -> new rank
    step: int  # the step the survivors continue from
    offset: int  # where the new attempt's records start in metrics.jsonl
    deadline: float
    clock: Callable[[], float]

    def settled(self) -> str | None:
        """None while answers are due; "" once every survivor built its trainer; else
        why the re-formation failed (a survivor's failure, or the bound passed)."""
        ok = 0
        for new in self.ranks.values():
            failed = f"{KEY}{self.epoch}/failed/{new}"
            if self.store.check([failed]):
                return json.loads(self.store.get(failed))
            ok += self.store.check([f"{KEY}{self.epoch}/ok/{new}"])
        if ok == len(self.ranks):
            return ""
        if self.clock() > self.deadline:
            return f"{len(self.ranks) - ok} survivor(s) did not re-form in {WAIT_S:.0f} s"
        return None


def stored_epoch(run_dir) -> int:
    """The run's epoch as its run host's store says (0: none, or no store)."""
    store = connect_store(run_dir)
    if store is None or not store.check([EPOCH_KEY]):
        return 0
    return int(store.get(EPOCH_KEY))


def begin(
    spec: JobSpec,
    attempt: Attempt,
    plan: Plan,
    lost: list[int],
    point: ResumePoint,
    epoch: int,
    clock: Callable[[], float],
) -> tuple[Attempt, Reformation] | None:
    """Re-form ``attempt``'s survivors of ``lost`` as ``plan`` from ``point``: the next
    attempt (the same processes) and the re-formation to wait for; None where the plan
    does not fit the surviving nodes or there is no store to speak through."""
    old = attempt.run
    nodes, ranks = survivor_layout(old.plan, plan, lost)
    store = connect_store(old.dir)
    if not ranks or store is None:
        return None
    write_plan(old.dir, plan)
    port = int(old.ctx.rdzv_endpoint.rsplit(":", 1)[1])  # the same run host
    ctx = run_context(spec, plan, old.id, old.dir, old.ctx.env, port, old.ctx.secret_env)
    run = Run(old.id, old.dir, ctx, old.rendered, plan)
    handles = [attempt.handles[n] for n in nodes]
    after = Attempt(run, attempt.backend, handles, attempt.host_proc, attempt.host, point.step)
    scripts = attempt.script_nodes or list(range(len(attempt.handles)))
    after.script_nodes = [scripts[n] for n in nodes]
    metrics = old.dir / "metrics.jsonl"  # the new attempt's records start after the word
    offset = metrics.stat().st_size if metrics.exists() else 0
    word = {
        "plan": str(old.dir / "plan.json"),
        "ranks": {str(o): n for o, n in ranks.items()},
        "prefix": f"reform-{epoch}-{uuid.uuid4().hex}",
        "resume": str(point.path),
    }
    # The next epoch is the run's from the word on: the survivors move to it as they read
    # it, and a supervisor that adopts the run meanwhile must not use this one's keys.
    store.set(EPOCH_KEY, str(epoch + 1))
    store.set(f"{KEY}{epoch}", json.dumps(word))
    return after, Reformation(store, epoch, ranks, point.step, offset, clock() + WAIT_S, clock)
