"""Fault injection for the chaos tests: a rank SIGKILLs its whole node mid-step.

``JOBCTL_CHAOS=RANK:STEP:WHERE`` makes rank RANK of a run's first attempt (not one
resumed from a checkpoint, which would kill again) watch its own threads' stacks from
loop step STEP on, and SIGKILL every process of its node (the node script, the torchrun
agent, every worker; itself last) the moment one of them is inside WHERE:

* ``forward``: the executor's forward of a micro-batch;
* ``allreduce``: the gradient sum over data-parallel replicas;
* ``optimizer``: the optimizer's update (inside ``torch.optim``);
* ``checkpoint``: the background writer writing this rank's checkpoint blocks.

It is the real thing a spot machine does to a run, aimed at one phase of a step: the
rest of the run (peers, supervisor) is not told and finds out as it would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

from jobctl.engine.core.process import descendants
from jobctl.engine.runtime.hook import StepHook

WHERE = {
    "forward": lambda code: code.co_name in ("_forward", "_graph_forward"),
    "allreduce": lambda code: code.co_name == "allreduce_grads",
    "optimizer": lambda code: "torch/optim/" in code.co_filename and code.co_name == "step",
    "checkpoint": lambda code: code.co_name == "write_snapshot",
}


def parse(value: str, rank: int) -> tuple[int, str] | None:
    """(step, where) when ``value`` aims at ``rank``, else None."""
    who, step, where = value.split(":")
    if int(who) != rank:
        return None
    if where not in WHERE:
        raise ValueError(f"JOBCTL_CHAOS: where must be one of {sorted(WHERE)}, not {where!r}")
    return int(step), where


def kill_my_node() -> None:
    """SIGKILL this worker's node: the process group of its torchrun agent (the node
    script's) and all of its descendants, this process last."""
    root = os.getpgid(os.getppid())
    me = os.getpid()
    for pid in [root, *descendants(root)]:
        if pid != me:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    os.kill(me, signal.SIGKILL)


class ChaosKill(StepHook):
    """Arms a watcher thread at loop step ``step`` (see the module docstring)."""

    def __init__(self, step: int, where: str):
        self.step, self.where, self.match = step, where, WHERE[where]
        self.armed = False

    def before_step(self, step: int) -> None:
        if step >= self.step and not self.armed:
            self.armed = True
            if self.where == "checkpoint":
                _arm_writer()
            else:
                threading.Thread(target=self._watch, name="chaos", daemon=True).start()

    def _inside(self) -> bool:
        me = threading.get_ident()
        for ident, frame in sys._current_frames().items():
            while frame is not None and ident != me:
                if self.match(frame.f_code):
                    return True
                frame = frame.f_back
        return False

    def _watch(self) -> None:
        while not self._inside():
            time.sleep(0.0002)
        kill_my_node()


def _arm_writer() -> None:
    """Kill this node as the background writer starts writing its blocks. Not by
    watching stacks: the writer holds the GIL for most of a small write, so the watcher
    missed every write but the run's final one at times (its survivors had finished)."""
    from jobctl.engine.checkpoint import manager

    write = manager.write_snapshot

    def killing(snap, out_dir):
        kill_my_node()
        return write(snap, out_dir)

    manager.write_snapshot = killing
