"""One attempt of a run: its processes (the run host, then the nodes) and its progress bar.

``ProcessLauncher`` is the supervisor's seam to the real world: ``start`` spawns the
detached run host (rendezvous store and event channel, engine/channel/host.py) and
submits the node scripts to the backend; ``ready`` waits until the host listens.
The supervisor's unit tests hand it a launcher whose backend replays node states
instead; the multi-process tests cover this one.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
)
from rich.table import Column

from jobctl.backends import get_backend
from jobctl.engine.channel.host import HOST_FILE, RunHost, spawn_run_host, wait_run_host
from jobctl.engine.core.events import Kind
from jobctl.engine.core.process import process_token
from jobctl.engine.pruning import events as pruning_events
from jobctl.engine.rebalance import events as rebalance_events
from jobctl.engine.supervise.figures import RATE_WINDOW, eta_s, recent_rate
from jobctl.engine.supervise.launch import Run


@dataclass
class Attempt:
    """A submitted attempt: the backend that started it, its node handles, its host."""

    run: Run
    backend: object  # status / cancel / logs, as in jobctl.backends.Backend
    handles: list[str]
    host_proc: subprocess.Popen | None = None
    host: RunHost | None = None
    start_step: int = 0  # the step it continues from
    # The node script each node runs under, after a re-formation in place (None: its own).
    script_nodes: list[int] | None = None

    def stop_host(self) -> None:
        """End the run host (the attempt is over: nobody joins its store any more)."""
        if self.host is not None:
            self.host.stop()
        elif self.host_proc is not None:
            self.host_proc.kill()


class ProcessLauncher:
    """Starts attempts for real: the run host, then the nodes on the backend."""

    def start(self, run: Run, backend: str, secret: str | None, channel_port: int) -> Attempt:
        impl = get_backend(backend)
        proc = spawn_run_host(run.dir, run.ctx.rdzv_endpoint, channel_port, secret)
        try:
            handles = impl.submit(run.rendered, run.ctx)
        except BaseException:
            proc.kill()
            raise
        return Attempt(run, impl, handles, host_proc=proc)

    def ready(self, attempt: Attempt) -> None:
        """Wait for the attempt's run host; on failure the nodes are ended too."""
        try:
            attempt.host = wait_run_host(attempt.run.dir, attempt.host_proc)
        except RuntimeError:
            attempt.backend.cancel(attempt.handles, 9)
            raise


def claim_host(run_dir: Path) -> None:
    """Record this process as the supervisor in the run's ``host.json`` (an adoption):
    a later ``jobctl resume`` then sees a live supervisor and refuses to start another."""
    path = Path(run_dir) / HOST_FILE
    with contextlib.suppress(FileNotFoundError):
        info = json.loads(path.read_text())
        info["supervisor"] = os.getpid()
        info["supervisor_token"] = process_token(os.getpid())
        tmp = path.with_name(f".{HOST_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(info))
        tmp.replace(path)


# The widest cells a value column of the progress line shows (its padding apart):
# ``loss 12.3456``, ``12345.6 samples/s``, ``ETA``, ``12:34:56``; the step count is
# sized to the run's total. Where the run id and a bar of BAR_MIN do not fit beside
# them, the line's label is SHORT_LABEL (the run id is printed above it), then the bar
# goes: a value is never cut.
VALUE_WIDTHS = (12, 17, 3, 7)
BAR_MIN = 10
SHORT_LABEL = "train"


def label_room(width: int, total: int) -> int:
    """The columns a ``width``-wide progress line leaves its label beside a bar."""
    steps = 2 * len(str(total)) + 1  # 18/300 at its widest: 300/300
    values = steps + sum(VALUE_WIDTHS) + len(VALUE_WIDTHS)  # cells and the spaces
    return width - values - BAR_MIN - 1


def progress_columns(width: int, label: str, total: int) -> list[ProgressColumn]:
    """The progress line's columns for a ``width``-column terminal, each value no
    narrower than its widest cell and never wrapped or cut (#47)."""

    def fixed(min_width: int) -> Column:
        return Column(no_wrap=True, min_width=min_width)

    out: list[ProgressColumn] = [
        TextColumn("{task.description}", style="bold", markup=False, table_column=fixed(len(label)))
    ]
    if label_room(width, total) >= len(label):
        out.append(BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=BAR_MIN)))
    return out + [
        MofNCompleteColumn(table_column=fixed(2 * len(str(total)) + 1)),
        TextColumn("loss {task.fields[loss]}", table_column=fixed(VALUE_WIDTHS[0])),
        TextColumn("{task.fields[sps]} samples/s", table_column=fixed(VALUE_WIDTHS[1])),
        TextColumn("ETA", table_column=fixed(VALUE_WIDTHS[2])),
        TextColumn("{task.fields[eta]}", table_column=fixed(VALUE_WIDTHS[3])),
    ]


# The training phases a run's output names as they happen (the bar shows only steps).
PHASE_NOTES = {
    Kind.PRUNING: ("pruned", pruning_events.note),
    **{k: ("rebalance", rebalance_events.note) for k in rebalance_events.KINDS},
}


class ProgressView:
    """The attempt's progress bar (steps, loss, throughput) and upload bar; into a
    non-terminal (a pipe, a log file) one line per ``log_every`` steps instead."""

    def __init__(
        self, console: Console, run_id: str, total: int, start: int, log_every: int = 1
    ) -> None:
        self.console, self.total, self.log_every = console, total, max(1, log_every)
        self.lines = not console.is_terminal
        fits = label_room(console.width, total) >= len(run_id)
        self.label = run_id if fits else SHORT_LABEL  # else the run id goes above the bar
        columns = progress_columns(console.width, self.label, total)
        self.bar = Progress(*columns, console=console, transient=False)
        self.task = self.bar.add_task(
            self.label, total=total, completed=start, loss="-", sps="-", eta="-:--:--"
        )
        self.steps: deque[dict] = deque(maxlen=RATE_WINDOW)  # the ETA's, as status's
        self.upload = self.bar.add_task(
            "upload", total=1, completed=0, loss="", sps="-", visible=False
        )
        if not self.lines:
            if not fits:
                console.print(f"run {run_id}", markup=False, highlight=False)
            self.bar.start()

    def on_event(self, rec: dict) -> None:
        if rec["kind"] in PHASE_NOTES:  # a pruning step, a rebalance: above the bar
            what, note = PHASE_NOTES[rec["kind"]]
            self.console.print(f"{what} {note(rec)}", markup=False, highlight=False)
        if self.lines:
            self._print_line(rec)
        elif rec["kind"] == Kind.STEP:
            self.steps.append(rec)
            self.bar.update(
                self.task,
                completed=rec["step"],
                loss=f"{rec['loss']:.4f}",
                sps=f"{rec['samples_per_s']:.1f}",
                eta=self._eta(rec["step"]),
            )
        elif rec["kind"] == Kind.UPLOAD:
            self.bar.update(
                self.upload,
                visible=True,
                total=max(rec["bytes_total"], 1),
                completed=rec["bytes_done"],
                description=f"upload step {rec['step']}" if self.label != SHORT_LABEL else "upload",
            )

    def _eta(self, step: int) -> str:
        """Time to the last step as `jobctl status` computes it (figures.eta_s over the
        newest RATE_WINDOW step records), not Rich's own estimate: one ETA, one way."""
        row = {"phase": "training", "total_steps": self.total, "step": step}
        left = eta_s(row, recent_rate(list(self.steps)))
        if left is None:
            return "-:--:--" if step < self.total else "0:00:00"
        s = round(left)
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"

    def _print_line(self, rec: dict) -> None:
        step = rec.get("step")
        if rec["kind"] != Kind.STEP or step % self.log_every and step != self.total:
            return
        self.console.print(
            f"step {step}/{self.total} loss {rec['loss']:.4f} samples/s {rec['samples_per_s']:.1f}",
            markup=False,
            highlight=False,
        )

    def stop(self) -> None:
        if not self.lines:
            self.bar.stop()
