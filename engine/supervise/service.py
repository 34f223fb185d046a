"""``jobctl apply`` and ``jobctl resume``: plan, launch and supervise a run to its end.

A run continues from its newest complete checkpoint (local or remote) whenever it has
one, re-planned for the devices available now with the same global batch (Varuna's
job morphing): the new layout loads the layout-independent checkpoint and training
goes on from the exact next sample. The state machine that does it, one transition
per step, is engine/supervise/supervisor.py; ``launch`` runs it to the end.

The command line asks this layer what to do and prints the answer: which earlier run
an ``apply`` continues, what becomes of a run whose backend refused it; the stop and
scale requests are in engine/supervise/run_requests.py.
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from jobctl.engine.core.plan import Plan
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.launch import Run
from jobctl.engine.supervise.monitor import Outcome
from jobctl.engine.supervise.supervisor import Supervisor
from jobctl.spec import JobSpec


@dataclass
class ApplyOptions:
    """Knobs of one ``apply``."""

    backend: str | None = None
    resume_dir: Path | None = None
    deadline_s: float | None = None  # per attempt; then it is killed and the run failed
    show_progress: bool = True
    run_id: str | None = None  # continue this existing run instead of creating one
    devices: int | None = None  # plan for this many devices when no plan is given


def launch(
    spec: JobSpec,
    plan: Plan | None,
    db: StateDB,
    spec_path: str | None,
    opts: ApplyOptions,
    console: Console,
    launcher=None,
) -> tuple[Run, Outcome]:
    """Run ``plan`` for ``spec`` in the foreground until it completes, fails or stops.

    With ``elasticity.enabled``, losing nodes (killed, a worker process killed, silent,
    or told to leave by SIGTERM after a checkpoint) morphs the run onto the devices
    left: re-plan with the same global batch, resume from the newest complete
    checkpoint, keep going. A scale request (``jobctl scale``, capacity returning)
    morphs it the same way (engine/supervise/scaling.py). ``launcher`` replaces the process
    launcher (engine/supervise/attempt.py) in tests.
    """
    return Supervisor(spec, plan, db, spec_path, opts, console, launcher).run_to_end()


def unfinished_run(db: StateDB, name: str, fresh: bool, resume_dir: Path | None) -> str | None:
    """The id of the unfinished earlier run of job ``name`` that an ``apply`` continues
    from its newest checkpoint; None for a new run (asked for with ``fresh``, or
    starting from the checkpoint folder ``resume_dir``, or no unfinished run)."""
    previous = db.get_run(name)
    if previous and previous["phase"] != "completed" and not fresh and resume_dir is None:
        return previous["id"]
    return None


def fail_refused(db: StateDB, name: str, run_id: str | None) -> None:
    """Mark the run whose submission the backend refused as failed (not left launching)."""
    row = db.get_run(run_id or name)
    if row is not None and row["phase"] not in ("completed", "failed", "stopped"):
        db.set_phase(row["id"], "failed", "the backend refused the run", exit_code=2)


def credentials_problem(spec: JobSpec) -> str | None:
    """Why the run could not reach its object store (``checkpoint.remote``, an s3:// URL)
    for want of credentials, with the fix; None when it can or needs none.

    Checked before launch, without contacting S3: botocore resolves credentials the way
    the workers will (environment, shared files, profiles, SSO, a container or instance
    role, whose metadata endpoint answers or times out within about a second).
    """
    url = spec.checkpoint.remote or ""
    if not url.startswith(("s3://", "s3a://")):
        return None
    import botocore.session

    try:
        found = botocore.session.get_session().get_credentials()
    except Exception as e:  # a broken profile or config file: the workers would fail too
        return f"checkpoint.remote {url}: the AWS configuration cannot be read: {e}"
    if found is not None:
        return None
    return (
        f"checkpoint.remote {url} needs AWS credentials and none were found (checked the "
        "environment, ~/.aws/credentials and config, profiles, container and instance "
        "roles). Fix: export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
        "AWS_ENDPOINT_URL for an S3-compatible server) or AWS_PROFILE, or remove "
        "checkpoint.remote from the spec to keep checkpoints local"
    )


def fail_launch(db: StateDB, name: str, run_id: str | None, error: BaseException) -> str | None:
    """Mark the run whose launch raised ``error`` as failed, with the reason, so no run is
    left ``launching`` with nothing behind it; its traceback goes to ``launch-error.txt``
    in the run folder. The file's path, or None when no run was recorded."""
    row = db.get_run(run_id or name)
    if row is None or row["phase"] in ("completed", "failed", "stopped"):
        return None
    reason = f"launch failed: {type(error).__name__}: {error}".splitlines()[0]
    db.set_phase(row["id"], "failed", reason, exit_code=1, message=reason)
    path = Path(row["run_dir"]) / "launch-error.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(traceback.format_exception(error)))
    return str(path)


class CtrlC:
    """Ctrl-C on a foreground ``apply``/``resume`` (the nodes run in sessions of their
    own, so the terminal's SIGINT reaches this process only).

    The first asks every rank to checkpoint and stop, through the same request as
    ``jobctl stop`` (the supervisor signals the nodes running then), records it as a
    ``stop`` event and says so; the run ends ``stopped``. The second raises
    KeyboardInterrupt: the supervisor detaches (a ``detach`` event) and the nodes go on
    with their run host, to be adopted by ``jobctl resume``. ``interrupted`` says
    whether the first came.
    """

    def __init__(self, db: StateDB, ref: str, console: Console) -> None:
        self.db, self.ref, self.console = db, ref, console
        self.interrupted = False
        self._previous = None
        self._request: threading.Thread | None = None
        self._nothing_to_stop = False

    def __enter__(self) -> CtrlC:
        self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc) -> None:
        if self._request is not None:
            self._request.join()  # the stop request is on record before apply returns
        signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self, signum, frame) -> None:
        # No database I/O here: the signal lands between two bytecodes of the main
        # thread, which may hold the SQLite write lock mid-transaction, and a write from
        # the handler would wait on its own thread until the busy timeout (a CI run
        # failed so). A thread of its own waits for that lock like any other writer.
        if self.interrupted or self._nothing_to_stop:  # a second Ctrl-C: detach
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self.interrupted = True
        self._request = threading.Thread(target=self._ask_stop, name="ctrl-c", daemon=False)
        self._request.start()

    def _ask_stop(self) -> None:
        """Record the stop request (the first Ctrl-C), or, with no live run of this apply
        to stop, interrupt the main thread as a plain Ctrl-C would."""
        row = self.db.get_run(self.ref)
        if row is None or row["phase"] in ("completed", "failed", "stopped"):
            self._nothing_to_stop = True
            _thread.interrupt_main(signal.SIGINT)  # runs _on_sigint on the main thread
            return
        note = f"Ctrl-C on jobctl apply (pid {os.getpid()}): every rank checkpoints and stops"
        self.db.request_stop(row["id"], note)  # its "stop" event too: listed once (#47)
        self.console.print(
            f"Ctrl-C: asking every rank of {row['id']} to checkpoint and stop; "
            "Ctrl-C again detaches (the nodes go on; `jobctl resume` adopts them)",
            markup=False,
            highlight=False,
        )
