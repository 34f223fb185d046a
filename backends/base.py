"""The interface every backend implements, and what rendering produces.

A backend turns a run (spec + plan + where things live) into ``Rendered`` artifacts
that print exactly what would be submitted (the dry run is part of the interface),
then submits, reports status, cancels and finds logs. jobctl never manages a cluster
itself: backends hand processes to torchrun, Slurm, Kubernetes or ssh.

Handles are opaque printable strings that go into the state DB as they are: a pid,
a Slurm job id, ``host:pid@run-folder`` (ssh), ``namespace/kind/name`` (Kubernetes).
Slurm, Kubernetes and ssh handles are complete on their own (an ssh handle names the
run folder whose record holds the node's ssh settings), so any process can ask about,
stop or fetch the logs of them; the local backend also remembers its processes.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from jobctl.spec import ElasticitySpec, HardwareSpec

Phase = Literal["pending", "running", "succeeded", "failed", "stopped"]
Cause = Literal["", "preempted", "cancelled", "timeout"]
DONE: frozenset[str] = frozenset({"succeeded", "failed", "stopped"})
# Exit code of a handle stopped from outside when the backend cannot tell the signal:
# negative, as subprocess reports "killed by signal N" (-N).
STOPPED_EXIT = -signal.SIGTERM


@dataclass(frozen=True)
class RunContext:
    """Everything a backend needs to render a run's launch artifacts."""

    run_id: str
    run_dir: Path
    nnodes: int
    nproc_per_node: list[int]
    rdzv_endpoint: str
    env: dict[str, str] = field(default_factory=dict)
    threads: int = 1
    python: str = sys.executable
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    elasticity: ElasticitySpec = field(default_factory=ElasticitySpec)
    # Run-folder files every node reads (spec.yaml, plan.json), shipped by backends whose
    # nodes do not share the supervisor's disk (Kubernetes, ssh).
    inputs: dict[str, str] = field(default_factory=dict)
    # Secrets for the node processes (the channel secret): handed to them through the
    # environment of the submitting command, never rendered into a script.
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def rdzv_host(self) -> str:
        return self.rdzv_endpoint.rsplit(":", 1)[0]

    @property
    def rdzv_port(self) -> int:
        return int(self.rdzv_endpoint.rsplit(":", 1)[1])

    @property
    def max_restarts(self) -> int:
        """In-place restarts of a failed node (torchrun's, a JobSet's), from the spec."""
        return self.hardware.max_restarts


@dataclass(frozen=True)
class Rendered:
    """Files a backend would write and submit: name -> content."""

    backend: str
    files: dict[str, str]

    def write(self, out_dir: Path) -> list[Path]:
        """Write every artifact into ``out_dir`` (scripts made executable)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, text in self.files.items():
            path = out_dir / name
            path.write_text(text)
            if name.endswith((".sh", ".sbatch")):
                path.chmod(0o755)
            paths.append(path)
        return paths


@dataclass(frozen=True)
class NodeStatus:
    """Where one handle stands, in jobctl's terms.

    ``stopped`` means ended from outside (cancelled, preempted, out of time, its process
    tree killed): not the code's fault, and resumable from the last checkpoint.
    ``exit_code`` is None until the handle is done, then 0 (succeeded), positive
    (failed; 128 + N when signal N ended it on its own account) or negative (stopped;
    -N for signal N, as subprocess reports it). ``poll`` hands out exactly these codes,
    so a reader of exit codes alone tells stopped (< 0) from failed (> 0).
    ``detail`` is the backend's own word for the state (with a pending job's reason).
    ``cause`` says, from the backend's own view, why a stopped handle stopped:
    ``preempted`` (capacity taken away or a node lost: resumable on what is left),
    ``cancelled`` (a person or jobctl stopped it), ``timeout`` (its time limit ran out)
    or ``""`` when the backend cannot tell.
    """

    phase: Phase
    exit_code: int | None = None
    detail: str = ""
    cause: Cause = ""

    @property
    def done(self) -> bool:
        return self.phase in DONE


class BackendError(RuntimeError):
    """A backend command failed; the message carries the command and its output."""


class Backend(Protocol):
    """What jobctl asks of a place that runs processes."""

    name: str

    def render(self, ctx: RunContext) -> Rendered: ...

    def submit(self, rendered: Rendered, ctx: RunContext) -> list[str]: ...

    def status(self, handles: list[str]) -> list[NodeStatus]: ...

    def poll(self, handles: list[str]) -> list[int | None]: ...

    def cancel(self, handles: list[str], sig: int = signal.SIGTERM) -> None: ...

    def logs(self, handles: list[str], run_dir: Path) -> list[Path]: ...

    def release(self, handles: list[str], nodes: list[int]) -> Released: ...


@dataclass(frozen=True)
class Released:
    """What a backend did with nodes a packed run no longer uses.

    ``handles``: indices of handles that now end on their own, exit 0 (a node's own
    process tree); their end is expected, not a loss. ``note``: what happened to the
    machines, for the run's events (released to the scheduler, or kept and why).
    """

    handles: list[int]
    note: str


class BackendBase:
    """What every backend shares: ``poll`` derived from ``status``, logs read from the
    run folder, and the rule that a handle jobctl cancelled is stopped, not failed."""

    def __init__(self) -> None:
        self._cancelled: set[str] = set()  # handles this object was asked to stop

    def status(self, handles: list[str]) -> list[NodeStatus]:
        raise NotImplementedError

    def _ended(self, handle: str, code: int | None, detail: str) -> NodeStatus:
        """A finished handle: succeeded on exit 0; stopped when jobctl cancelled it or a
        signal killed it (a negative code, or None: its process tree vanished without
        one); failed on any other code."""
        if code == 0:
            return NodeStatus("succeeded", 0, detail)
        if handle in self._cancelled or code is None or code < 0:
            stopped_code = code if code is not None and code < 0 else STOPPED_EXIT
            cause = "cancelled" if handle in self._cancelled else "preempted"
            return NodeStatus("stopped", stopped_code, detail, cause)
        return NodeStatus("failed", code, detail)

    def poll(self, handles: list[str]) -> list[int | None]:
        """Exit code of each handle, None while it runs (what the supervisor's monitor reads)."""
        return [s.exit_code for s in self.status(handles)]

    def release(self, handles: list[str], nodes: list[int]) -> Released:
        """Hand back ``nodes`` once packing freed them (their workers have exited 0).

        Where the backend cannot give part of a run's machines back, they stay held until
        the run ends; the note says so."""
        return Released([], f"{self.name} keeps node(s) {nodes} until the run ends")

    def logs(self, handles: list[str], run_dir: Path) -> list[Path]:
        """The run's log files, written straight into ``run_dir/logs`` (local disk, or a
        file system the nodes share); backends whose nodes write elsewhere fetch them."""
        folder = run_dir / "logs"
        return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
