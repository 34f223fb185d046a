"""Remote backends' shared machinery: running their commands, caching their status.

Slurm, Kubernetes and ssh ask a remote daemon about their nodes (squeue, kubectl, an
ssh round trip); ``run_command`` / ``run_bytes`` run such a command (an argv, never a
shell) and turn a failure into a ``BackendError`` naming it, and ``RemoteBackend``
answers ``status`` from a ``StatusCache`` between queries.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

from .base import BackendBase, BackendError, NodeStatus


class RemoteBackend(BackendBase):
    """A backend whose status is a slow remote query, cached for ``status_ttl_s``."""

    def __init__(self, status_ttl_s: float = 2.0) -> None:
        super().__init__()
        self._cache = StatusCache(status_ttl_s)


class StatusCache:
    """Remembers the last answer of a remote status query for ``ttl`` seconds.

    The supervisor polls several times a second; squeue, kubectl and ssh round trips
    are slow and load shared daemons, so remote backends answer from here in between.
    A query that fails (slurmctld restarting, an API server blip) is answered with the
    last good answer for up to ``max_stale`` seconds before the error is raised.
    """

    def __init__(
        self, ttl: float, clock: Callable[[], float] = time.monotonic, max_stale: float = 120.0
    ) -> None:
        self.ttl, self.clock, self.max_stale = ttl, clock, max_stale
        self._key: tuple[str, ...] | None = None
        self._value: list[NodeStatus] = []
        self._at = 0.0

    def get(
        self, handles: Sequence[str], fetch: Callable[[], list[NodeStatus]]
    ) -> list[NodeStatus]:
        """The cached answer for ``handles``, or a fresh ``fetch()`` once it is stale."""
        key, now = tuple(handles), self.clock()
        if key == self._key and now - self._at < self.ttl:
            return self._value
        try:
            value = fetch()
        except BackendError:
            if key != self._key or now - self._at > self.max_stale:
                raise
            return self._value
        self._key, self._value, self._at = key, value, now
        return value

    def clear(self) -> None:
        self._key = None


def run_command(argv: Sequence[str], **options: Any) -> str:
    """``run_bytes(argv, **options)`` (``timeout``, ``stdin``, ``cwd``, ``env``), its
    stdout as text."""
    return run_bytes(argv, **options).decode(errors="replace")


def run_bytes(
    argv: Sequence[str],
    *,
    timeout: float = 60.0,
    stdin: bytes | None = None,
    cwd=None,
    env: dict[str, str] | None = None,
) -> bytes:
    """Run a backend command (argv, never a shell) and return its stdout.

    Raises BackendError naming the command and its stderr when it fails or hangs.
    """
    shown = shlex.join(argv)
    try:
        proc = subprocess.run(
            list(argv), input=stdin, capture_output=True, timeout=timeout, cwd=cwd, env=env
        )
    except FileNotFoundError:
        raise BackendError(f"{argv[0]}: command not found") from None
    except subprocess.TimeoutExpired:
        raise BackendError(f"{shown}: no answer after {timeout:.0f} s") from None
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise BackendError(f"{shown} exited {proc.returncode}: {err}")
    return proc.stdout
