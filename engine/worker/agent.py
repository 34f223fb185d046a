"""Warm start: a node's torchrun agent whose workers start from an interpreter that has
already imported them.

A worker started the torchrun way is a fresh ``python -u -m jobctl.engine.worker.process``
that imports torch (1.5-2 CPU s), then ``torch._dynamo`` (``torch.optim`` imports it at
the first optimizer, 1.5 CPU s more), then jobctl's runtime. With two agents and four
workers on a 2-core machine that was about 8 s of every launch's 12 s from "launching"
to the first step, and it is paid again at every relaunch after a preemption, on every
backend (``benchmarks/runtime/launch_time.py`` measures both ways).

``python -m jobctl.engine.worker.agent ARGS`` is torchrun (``torch.distributed.run``,
unchanged: its flags, rendezvous, monitoring, restarts and signal forwarding) with one
difference. The call with which torch's elastic ``SubprocessContext`` starts one worker
(``get_subprocess_handler``) forks this agent, which imported the worker's modules
before its rendezvous, instead of exec'ing a new interpreter; the child is then made
what a fresh one would be (``_as_fresh``): its own session, as torchrun starts workers;
torchrun's environment for that rank; default signal handlers; none of the agent's
atexit or root log handlers; unbuffered stdout and stderr (torchrun's ``-u``) on the
files torchrun asked for; torch's CPU generator and numpy's global generator reseeded
from the OS, as a new interpreter's are (Python's ``random`` reseeds itself at a fork).

Why a fork is safe here: the agent has run no tensor operation, so no OpenMP or
intra-op thread pool exists to be left broken in the child, and its own threads (the
rendezvous keep-alive) own nothing the child touches. CUDA runs are not forked
(``JOBCTL_WARM_START=0`` is rendered for them): a CUDA driver initialised before a fork
cannot be used after it, and a device query during the agent's imports would do that.
Any other entry point, a NUMA binding, or a torch without the hook starts the torchrun
way.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable

from jobctl.engine.core.env import WARM_START

WORKER_MODULE = "jobctl.engine.worker.process"
WORKER_ARGS = ("-u", "-m", WORKER_MODULE)
"""torchrun's arguments to the interpreter for ``-m jobctl.engine.worker.process``."""
PRELOAD = (WORKER_MODULE, "jobctl.engine.worker.assembly", "torch._dynamo")
"""What a worker imports before its first step, imported once per agent instead."""
SIGNALS = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCHLD")


def main(argv: list[str] | None = None) -> None:
    """torchrun with ``argv``; its workers forked warm where ``JOBCTL_WARM_START=1``."""
    if os.environ.get(WARM_START) == "1":
        _preload()
        if not _install():
            print("jobctl agent: this torch has no worker hook; workers start fresh")
    from torch.distributed.run import main as torchrun

    torchrun(argv)


def _preload() -> None:
    """Import the worker's modules, keeping this agent's signal handlers (the worker
    module installs its own SIGTERM note on import). The signals are held back until
    the handlers are the agent's again: a SIGTERM (a `jobctl stop` just after launch)
    that reached the worker's note during the seconds of importing was lost, and the
    node trained on to the end."""
    held = {getattr(signal, s) for s in SIGNALS + ("SIGINT",)}
    kept = {sig: signal.getsignal(sig) for sig in held}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one held back arrives now


def _install() -> bool:
    """Route the worker module's start through ``ForkedHandler``; False where this torch
    has no ``get_subprocess_handler`` to route."""
    from torch.distributed.elastic.multiprocessing import api

    fresh = getattr(api, "get_subprocess_handler", None)
    if fresh is None:
        return False

    def start(entrypoint, args, env, stdout, stderr, local_rank_id, numa_options=None):
        worker = entrypoint == os.getenv("PYTHON_EXEC", sys.executable)
        if worker and numa_options is None and tuple(map(str, args)) == WORKER_ARGS:
            return ForkedHandler(env, stdout, stderr, local_rank_id)
        return fresh(entrypoint, args, env, stdout, stderr, local_rank_id, numa_options)

    api.get_subprocess_handler = start
    return True


class ForkedProcess:
    """What torchrun uses of a worker's ``subprocess.Popen``, for a forked child."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)  # -N: signal N
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(WORKER_MODULE, timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkedHandler:
    """torch's ``SubprocessHandler`` (the same attributes and ``close``) for a worker
    forked from this agent: returns once the child leads its own session, as a Popen
    with ``start_new_session`` returns once the child has exec'd."""

    def __init__(
        self,
        env: dict,
        stdout: str | None,
        stderr: str | None,
        local_rank_id: int,
        main: Callable[[], int | None] | None = None,
    ):
        """``main``: what the child runs (the worker's ``forked_main`` unless given)."""
        self.local_rank_id = local_rank_id
        self._stdout = open(stdout, "w") if stdout else None  # noqa: SIM115 (closed in close)
        self._stderr = open(stderr, "w") if stderr else None  # noqa: SIM115
        environ = {**os.environ, **env}
        sys.stdout.flush()
        sys.stderr.flush()
        ready, told = os.pipe()
        with warnings.catch_warnings():
            # Python 3.12+ warns at every fork of a threaded process; why this one is
            # safe is in the module's docstring (the child touches no thread's state).
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os.close(ready)
            _child(environ, self._stdout, self._stderr, told, main)
        os.close(told)
        with contextlib.suppress(OSError):
            os.read(ready, 1)  # the child's setsid is done (or it died trying)
        os.close(ready)
        self.proc = ForkedProcess(pid)

    def close(self, death_sig: signal.Signals | None = None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, death_sig or signal.SIGTERM)
        for f in (self._stdout, self._stderr):
            if f is not None:
                f.close()


def _child(environ: dict, stdout, stderr, told: int, main) -> None:
    """The forked worker: made fresh, then the worker's main; never returns."""
    code = 1
    try:
        os.setsid()
        os.write(told, b"1")
        os.close(told)
        _as_fresh(environ, stdout, stderr)
        if main is None:
            from jobctl.engine.worker import process

            main = process.forked_main
        code = _exit_code(main())
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:  # as a fresh interpreter would: the traceback, exit 1
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _exit_code(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives a fresh interpreter."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _as_fresh(environ: dict, stdout, stderr) -> None:
    """Undo in the child what this agent's interpreter holds that a new one would not."""
    # The worker module is preloaded in an agent (a no-op here); imported first so
    # that the SIGTERM note its import installs is reset with the rest below.
    sys.argv = [importlib.import_module(WORKER_MODULE).__file__]
    for name in SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()
    logging.root.handlers.clear()
    logging.root.setLevel(logging.WARNING)
    os.environ.clear()
    os.environ.update(environ)
    for fd, target in ((1, stdout), (2, stderr)):
        if target is not None:
            os.dup2(target.fileno(), fd)
    sys.stdout = sys.__stdout__ = _unbuffered(1, sys.stdout)
    sys.stderr = sys.__stderr__ = _unbuffered(2, sys.stderr)
    _fresh_generators()


def _unbuffered(fd: int, old: io.TextIOWrapper) -> io.TextIOWrapper:
    """A text stream on ``fd`` as ``python -u`` makes one: every write goes out at once
    (a SIGKILLed worker's last lines are in its log)."""
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors, write_through=True)


def _fresh_generators() -> None:
    import numpy as np
    import torch

    # A new interpreter's torch (2.13) and numpy seed themselves from the OS: without
    # this, every worker of a node would draw the agent's one stream.
    torch.seed()
    np.random.seed()


if __name__ == "__main__":
    main()
