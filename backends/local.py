"""Local backend: one torchrun agent per logical node, as real processes on this host.

Each node script runs in its own session (process group), so "losing a node" is
killing one process tree, exactly as on separate machines. Node output (torchrun's own
messages) goes to ``logs/node-<k>.log``; workers write ``logs/rank-<r>.log``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from jobctl.engine.core.process import kill_tree, pid_alive

from .base import BackendBase, NodeStatus, Released, Rendered, RunContext
from .nodes import node_scripts


class LocalBackend(BackendBase):
    """Runs each node's launch script as a local process tree."""

    name = "local"

    def __init__(self) -> None:
        super().__init__()
        self._procs: dict[str, subprocess.Popen] = {}

    def render(self, ctx: RunContext) -> Rendered:
        return Rendered(self.name, node_scripts(ctx))

    def submit(self, rendered: Rendered, ctx: RunContext) -> list[str]:
        """Start every node script; returns their pids (= process group ids)."""
        scripts = rendered.write(ctx.run_dir / "scripts")
        (ctx.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        pids = []
        for node, script in enumerate(scripts):
            log = open(ctx.run_dir / "logs" / f"node-{node}.log", "ab")  # noqa: SIM115
            proc = subprocess.Popen(
                ["bash", str(script)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **ctx.secret_env},
            )
            log.close()
            self._procs[str(proc.pid)] = proc
            pids.append(str(proc.pid))
        return pids

    def status(self, handles: list[str]) -> list[NodeStatus]:
        """Each node's process: running, or its exit code (stopped if cancelled here)."""
        out = []
        for pid in handles:
            proc = self._procs.get(pid)
            code = proc.poll() if proc is not None else _poll_foreign(int(pid))
            ended = code is not None
            out.append(self._ended(pid, code, f"exit {code}") if ended else NodeStatus("running"))
        return out

    def cancel(self, handles: list[str], sig: int = signal.SIGTERM) -> None:
        """Signal every node's whole process tree."""
        for pid in handles:
            self._cancelled.add(pid)
            kill_tree(int(pid), sig)

    def release(self, handles: list[str], nodes: list[int]) -> Released:
        """Tell each freed node's script (SIGUSR1, to the script alone) to end its agent,
        which waits in torchrun's exit barrier, and exit 0."""
        for node in nodes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(handles[node]), signal.SIGUSR1)
        return Released(list(nodes), f"the processes of node(s) {nodes} were told to end")


def _poll_foreign(pid: int) -> int | None:
    """Exit state of a process this object did not start: None while alive. A zombie
    has ended: the node scripts of a supervisor that was killed are reparented to a
    process that may never reap them."""
    return None if pid_alive(pid) else -1
