"""Process identity helpers: whether a process runs, which one it is, its descendants;
and a free TCP port for a process group to meet on (``free_port``).

A pid alone may be reused after its process ends; with its start time
(``process_token``) it names one process, so the supervisor, the run host and the
scheduler recognise their own processes after a restart. Linux reads ``/proc``;
without it the signal check is all there is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket


def kill_tree(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Signal a process group; torchrun workers start their own sessions, so also
    signal every descendant found through /proc.

    Only a session leader outside this process's own ancestry is signalled: every tree
    jobctl kills was started in a session of its own, and a recorded pid whose process
    ended may since name another (pid 1 or an unrelated shell: never kill those)."""
    if not _own_session_leader(pgid):
        return
    for pid in [pgid, *descendants(pgid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _own_session_leader(pid: int) -> bool:
    """Whether ``pid`` leads its own session and is neither this process nor one of its
    ancestors."""
    if pid <= 1:
        return False
    try:
        if os.getsid(pid) != pid:
            return False
    except (ProcessLookupError, PermissionError):
        return False
    return pid not in _ancestors()


def _ancestors() -> set[int]:
    """This process and its ancestors (Linux /proc; just this process without it)."""
    out, pid = {os.getpid()}, os.getppid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            pid = int(_stat_fields(pid)[1])
        except (OSError, IndexError, ValueError):
            break
    return out


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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on this machine, for a server that listens for ``host``.

    ``host`` may be no address of this machine (a NAT or load-balancer address the
    nodes dial, or a supervisor's name while rendering elsewhere): the port is then
    one free on all of this machine's interfaces, and ``host`` is never bound.
    """
    for address in (host, ""):
        with socket.socket() as s:
            try:
                s.bind((address, 0))
            except OSError:  # not this machine's address, or a name it cannot resolve
                continue
            return s.getsockname()[1]
    raise OSError(f"no free TCP port on this machine for {host}")
