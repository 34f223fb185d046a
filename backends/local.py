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
    """Exit state of a process this object did not start: None while alive. A zombie
    has ended: the node scripts of a supervisor that was killed are reparented to a
    process that may never reap them."""
    return None if pid_alive(pid) else -1


def _stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command name (the state first); OSError without it."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def process_token(pid: int) -> str | None:
    """The process' start time in clock ticks since boot (Linux), or None if unknown:
    with its pid, it names one process (a pid alone may be reused)."""
    try:
        return _stat_fields(pid)[19]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int | None, token: str | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, given a token, is the same process."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but another user's
        return token is None
    try:
        fields = _stat_fields(pid)
    except OSError:  # no /proc (macOS): the signal check is all we have
        return True
    return fields[0] != "Z" and (token is None or fields[19] == token)
