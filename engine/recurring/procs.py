"""Child ``jobctl`` processes of the scheduler and the fleet runner, and their liveness.

Each run is its own ``python -m jobctl.engine.cli.app ...`` process in its own session, so
neither the scheduler daemon nor the fleet runner dies with a run, and a run outlives
them. A process is identified by its pid plus a token (its start time on Linux), so a
pid the kernel reused for something else is not mistaken for our child.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from jobctl.engine.core.process import kill_tree, pid_alive


class Child(Protocol):
    """What the scheduler and the fleet runner need of a child process."""

    pid: int

    def poll(self) -> int | None: ...


@dataclass
class ForeignChild:
    """A process someone else started (an orphan we adopt): alive or not, no exit code."""

    pid: int
    token: str | None

    def poll(self) -> int | None:
        return None if pid_alive(self.pid, self.token) else -1


Spawn = Callable[[Sequence[str], Path], Child]


def hostname() -> str:
    return socket.gethostname()


def jobctl_argv(*args: str) -> list[str]:
    """The command line of a ``jobctl`` subcommand run with this interpreter."""
    return [sys.executable, "-m", "jobctl.engine.cli.app", *args]


def spawn_logged(argv: Sequence[str], log_path: Path) -> subprocess.Popen:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "COLUMNS": os.environ.get("COLUMNS", "160")}
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        return subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )


def stop_tree(
    pid: int,
    grace_s: float = 10.0,
    wait: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """SIGTERM a process and its descendants; SIGKILL what is left after ``grace_s``."""
    kill_tree(pid, signal.SIGTERM)
    deadline = clock() + grace_s
    while pid_alive(pid) and clock() < deadline:
        wait(0.2)
    if pid_alive(pid):
        kill_tree(pid, signal.SIGKILL)


def stop_child(child: Child) -> None:
    """Stop a child process and everything it started."""
    stop_tree(child.pid)
