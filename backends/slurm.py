"""Slurm backend: one sbatch job per run; srun starts a torchrun agent on every node.

The batch script (``job.sbatch``) asks for the allocation (nodes, CPUs, memory, GPUs,
time limit, partition, account, requeue for spot capacity, SIGTERM before the time
limit so every rank checkpoints and exits) and runs ``scripts/node-<SLURM_NODEID>.sh``
on each node: the same per-node script the local backend runs, joining the rendezvous
the supervisor hosts. The run folder must be on a file system every node sees (as
Slurm's own output files are).

The handle is the Slurm job id. Status comes from ``squeue`` while slurmctld still
remembers the job (MinJobAge), then from ``sacct``.
"""

from __future__ import annotations

import os
import re
import signal
import time

from jobctl.templates import render

from .base import (
    STOPPED_EXIT,
    BackendError,
    Cause,
    NodeStatus,
    Phase,
    Released,
    Rendered,
    RunContext,
)
from .nodes import node_scripts
from .remote import RemoteBackend, run_command
from .rendezvous import require_reachable

# Slurm job states (squeue %T / sacct State) in jobctl's terms. A job that is requeued
# after preemption waits again, so it is pending, not done.
SLURM_PHASES: dict[str, Phase] = {
    "PENDING": "pending",
    "CONFIGURING": "pending",
    "REQUEUED": "pending",
    "REQUEUE_HOLD": "pending",
    "REQUEUE_FED": "pending",
    "RESV_DEL_HOLD": "pending",
    "RUNNING": "running",
    "COMPLETING": "running",
    "SIGNALING": "running",
    "STAGE_OUT": "running",
    "SUSPENDED": "running",
    "STOPPED": "running",
    "RESIZING": "running",
    "COMPLETED": "succeeded",
    "CANCELLED": "stopped",
    "PREEMPTED": "stopped",
    "TIMEOUT": "stopped",
    "DEADLINE": "stopped",
    "NODE_FAIL": "stopped",  # the node died under the job: not the code's fault
    "FAILED": "failed",
    "BOOT_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "SPECIAL_EXIT": "failed",
    "REVOKED": "failed",
}
# Why a stopped job stopped, from Slurm's own view.
SLURM_CAUSES: dict[str, Cause] = {
    "CANCELLED": "cancelled",
    "PREEMPTED": "preempted",
    "NODE_FAIL": "preempted",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
}


class SlurmBackend(RemoteBackend):
    """Submits a run as one Slurm batch job."""

    name = "slurm"
    RELEASE_TIMEOUT_S = 30.0  # a freed node's workers are gone: its agent ends in ~1 s

    def render(self, ctx: RunContext) -> Rendered:
        """``job.sbatch`` plus one ``node-<k>.sh`` per node (run by srun on node k)."""
        require_reachable(ctx, self.name, "Slurm's nodes", loopback_ok_if_set=True)
        files = {"job.sbatch": render("job.sbatch.j2", **sbatch_context(ctx))}
        files.update(node_scripts(ctx))
        return Rendered(self.name, files)

    def submit(self, rendered: Rendered, ctx: RunContext) -> list[str]:
        """``sbatch --parsable`` from the run folder; returns the job id."""
        rendered.write(ctx.run_dir / "scripts")
        (ctx.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        # sbatch exports the submitting environment (--export=ALL): the channel secret
        # reaches the nodes that way and is never written into a script.
        env = {**os.environ, **ctx.secret_env}
        out = run_command(["sbatch", "--parsable", "scripts/job.sbatch"], cwd=ctx.run_dir, env=env)
        job_id = out.strip().split(";")[0]  # "<id>" or "<id>;<cluster>"
        if not job_id.isdigit():
            raise BackendError(f"sbatch printed {out!r}, not a job id")
        self._cache.clear()
        return [job_id]

    def status(self, handles: list[str]) -> list[NodeStatus]:
        """Each job's phase, from squeue, or sacct once squeue has forgotten it."""
        return self._cache.get(handles, lambda: [_job_status(h) for h in handles])

    def cancel(self, handles: list[str], sig: int = signal.SIGTERM) -> None:
        """``scancel``: TERM and KILL end the job (Slurm escalates to KILL after
        KillWait); any other signal is only delivered, to every step and the batch shell."""
        if not handles:
            return
        if sig in (signal.SIGTERM, signal.SIGKILL):
            run_command(["scancel", *handles])
        else:
            run_command(["scancel", f"--signal={int(sig)}", "--full", *handles])
        self._cache.clear()

    def release(self, handles: list[str], nodes: list[int]) -> Released:
        """Shrink the job to the nodes still training (``scontrol update NodeList=``).

        Slurm kills a step's tasks on nodes a job gives up, and ``--kill-on-bad-exit``
        would then end the whole step, so each freed node's script is first told to
        leave (SIGUSR1 through ``srun --overlap`` on that node; it ends its agent, which
        waits in torchrun's exit barrier, and exits 0). The shrunk job is no longer
        requeued in place: its node scripts were rendered for the full allocation, so a
        preemption now ends it and the supervisor resumes the run as a new job."""
        if not handles or not nodes:
            return Released([], "nothing to release")
        job = handles[0]
        info = job_fields(job)
        hosts = run_command(["scontrol", "show", "hostnames", info["NodeList"]]).split()
        pairs = _freed_nodes(info, hosts, nodes)
        freed = [host for _, host in pairs]
        kept = [h for h in hosts if h not in freed]
        if not freed or not kept:
            asked, batch = [hosts[k] for k in nodes if k < len(hosts)], info.get("BatchHost")
            why = f" ({batch} runs its batch script)" if batch in asked else ""
            return Released([], f"Slurm job {job} keeps {info['NodeList']}{why}")
        for pid_file, host in pairs:
            _tell_to_leave(job, host, pid_file)
        self._wait_left(job, nodes, [pid_file for pid_file, _ in pairs])
        # (Requeue first: slurmctld refuses job updates for a while after a resize.)
        run_command(["scontrol", "update", f"JobId={job}", "Requeue=0"])
        run_command(["scontrol", "update", f"JobId={job}", f"NodeList={','.join(kept)}"])
        self._cache.clear()
        note = f"Slurm job {job} gave back {','.join(freed)}; it runs on {','.join(kept)}"
        return Released([], note)

    def _wait_left(self, job: str, nodes: list[int], pid_files: list[str]) -> None:
        """Wait until every released node script has exited: it removes its pid file as
        it exits 0 (a task that Slurm killed instead would fail the step)."""
        deadline = time.monotonic() + self.RELEASE_TIMEOUT_S
        while any(os.path.exists(f) for f in pid_files):
            if time.monotonic() > deadline:
                raise BackendError(
                    f"node(s) {nodes} of Slurm job {job} did not leave within "
                    f"{self.RELEASE_TIMEOUT_S:.0f} s of their release; the job keeps them"
                )
            time.sleep(0.2)


def _freed_nodes(info: dict[str, str], hosts: list[str], nodes: list[int]) -> list[tuple[str, str]]:
    """(pid file, host) of each node of ``nodes`` the job can give up: not the batch
    host, which runs the batch script and which Slurm cannot drop."""
    scripts = os.path.join(info["WorkDir"], "scripts")  # each node script's pid is there
    batch = info.get("BatchHost")
    return [
        (os.path.join(scripts, f"node-{k}.pid"), hosts[k])
        for k in nodes
        if k < len(hosts) and hosts[k] != batch
    ]


def _tell_to_leave(job: str, host: str, pid_file: str) -> None:
    """SIGUSR1 to the node script on ``host`` (its pid in ``pid_file``), through a step
    that overlaps the job's: the script ends its agent and exits 0."""
    with open(pid_file) as f:
        pid = int(f.read().strip())
    run_command(
        [
            "srun",
            f"--jobid={job}",
            "--overlap",
            f"--nodelist={host}",
            "--nodes=1",
            "--ntasks=1",
            "--output=/dev/null",
            "kill",
            "-USR1",
            str(pid),
        ],
        timeout=60,
    )


def job_fields(job_id: str) -> dict[str, str]:
    """``scontrol show job -o``'s ``Key=Value`` fields of one job."""
    out = run_command(["scontrol", "show", "job", "-o", job_id])
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def sbatch_context(ctx: RunContext) -> dict:
    """Values of ``job.sbatch.j2``: the allocation the plan needs, and the spec's options."""
    hw, opts = ctx.hardware, ctx.hardware.slurm
    nproc = max(ctx.nproc_per_node)
    return {
        "run_id": ctx.run_id,
        "job_name": job_name(ctx.run_id),
        "nnodes": ctx.nnodes,
        "cpus_per_node": nproc * ctx.threads,
        "mem_mb": int(hw.memory_gb * 1024 * nproc),
        "gpus_per_node": nproc if hw.device == "cuda" else 0,
        "time_limit": opts.time_limit_minutes,
        "options": [
            (name, value)
            for name, value in (
                ("partition", opts.partition),
                ("account", opts.account),
                ("qos", opts.qos),
            )
            if value
        ],
        "requeue": hw.spot if opts.requeue is None else opts.requeue,
        "signal_before_s": opts.signal_before_s,
        "sbatch_args": opts.sbatch_args,
    }


def job_name(run_id: str) -> str:
    """The run id as a Slurm job name: one word of safe characters."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:128] or "jobctl"


def _job_status(job_id: str) -> NodeStatus:
    row = _squeue(job_id) or _sacct(job_id)
    if row is None:
        return NodeStatus("failed", 1, f"job {job_id} is unknown to squeue and sacct")
    return node_status(*row)


def node_status(state: str, code: int = 0, sig: int = 0, reason: str = "") -> NodeStatus:
    """A Slurm state (``CANCELLED by 0`` included), exit code, signal and pending reason
    in jobctl's terms; a job stopped by a signal gets -signal, a failed one 128 + signal."""
    word = state.split()[0].rstrip("+") if state.strip() else "UNKNOWN"
    phase = SLURM_PHASES.get(word, "failed")
    if phase == "pending":  # why it waits: Resources, Priority, BeginTime (requeued), ...
        shown = reason if reason and reason not in ("None", "(null)") else ""
        return NodeStatus(phase, None, f"{word} ({shown})" if shown else word)
    if phase == "running":
        return NodeStatus(phase, None, word)
    if phase == "succeeded":
        return NodeStatus(phase, 0, word)
    if phase == "stopped":
        return NodeStatus(phase, -sig if sig else STOPPED_EXIT, word, SLURM_CAUSES[word])
    return NodeStatus(phase, 128 + sig if sig else code or 1, word)


def _squeue(job_id: str) -> tuple[str, int, int, str] | None:
    """(state, exit code, signal, reason) while slurmctld holds the job record, else None."""
    try:
        out = run_command(
            [
                "squeue",
                "--noheader",
                "--states=all",
                f"--jobs={job_id}",
                "--Format=JobID:32|,State:32|,exit_code:16|,Reason:128",
            ],
            timeout=30,
        )
    except BackendError as e:
        if "Invalid job id" in str(e):
            return None  # the record aged out of slurmctld's memory (MinJobAge)
        raise
    for line in out.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) == 4 and fields[0] == job_id:
            return fields[1], *wait_status(fields[2]), fields[3]
    return None


def _sacct(job_id: str) -> tuple[str, int, int, str] | None:
    """(state, exit code, signal, "") from the accounting database, or None without one."""
    try:
        out = run_command(
            [
                "sacct",
                "--noheader",
                "--parsable2",
                "--allocations",
                f"--jobs={job_id}",
                "--format=JobID,State,ExitCode",
            ],
            timeout=30,
        )
    except BackendError:
        return None
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) == 3 and fields[0] == job_id:
            code, _, sig = fields[2].partition(":")  # "exit:signal"
            return fields[1], int(code or 0), int(sig or 0), ""
    return None


def wait_status(raw: str) -> tuple[int, int]:
    """(exit code, signal) of squeue's exit_code, a raw wait status."""
    status = int(raw) if raw.strip().isdigit() else 0
    return status >> 8, status & 0x7F
