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

from jobctl.templates import render

from .base import Rendered, RunContext


class LocalBackend:
    """Runs each node's launch script as a local process tree."""

    name = "local"

    def render(self, ctx: RunContext) -> Rendered:
        files = {}
        for node in range(ctx.nnodes):
            files[f"node-{node}.sh"] = render(
                "node.sh.j2",
                run_id=ctx.run_id,
                node=node,
                nnodes=ctx.nnodes,
                nproc=ctx.nproc_per_node[node],
                rdzv_endpoint=ctx.rdzv_endpoint,
                python=ctx.python,
                max_restarts=ctx.max_restarts,
                env=node_env(ctx),
            )
        return Rendered(self.name, files)

    def submit(self, rendered: Rendered, ctx: RunContext) -> list[int]:
        """Start every node script; returns their pids (= process group ids)."""
        scripts = rendered.write(ctx.run_dir / "scripts")
        (ctx.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._procs: dict[int, subprocess.Popen] = getattr(self, "_procs", {})
        pids = []
        for node, script in enumerate(scripts):
            log = open(ctx.run_dir / "logs" / f"node-{node}.log", "ab")  # noqa: SIM115
            proc = subprocess.Popen(
                ["bash", str(script)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            log.close()
            self._procs[proc.pid] = proc
            pids.append(proc.pid)
        return pids

    def poll(self, handles: list[int]) -> list[int | None]:
        """Exit code of each node (None while running)."""
        out = []
        for pid in handles:
            proc = getattr(self, "_procs", {}).get(pid)
            out.append(proc.poll() if proc is not None else _poll_foreign(pid))
        return out

    def cancel(self, handles: list[int], sig: int = signal.SIGTERM) -> None:
        """Signal every node's whole process tree."""
        for pid in handles:
            kill_tree(pid, sig)


def node_env(ctx: RunContext) -> dict[str, str]:
    """Environment every node script exports."""
    return {
        "JOBCTL_RUN_DIR": str(ctx.run_dir),
        "JOBCTL_THREADS": str(ctx.threads),
        "OMP_NUM_THREADS": str(ctx.threads),
        # Restarted workers otherwise time out in gloo init on stale addresses.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        **ctx.env,
    }


def kill_tree(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process group; torchrun workers start their own sessions, so also
    signal every descendant found through /proc."""
    for pid in [pgid, *descendants(pgid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def descendants(root: int) -> list[int]:
    """All descendant pids of ``root`` (Linux /proc walk)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _poll_foreign(pid: int) -> int | None:
    """Exit state of a process this object did not start: None while alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return -1
    return None
