"""Packing on Slurm gives the freed node back: the job shrinks while the run goes on.

A private three-node cluster (tests/slurm_cluster.py: three slurmd daemons on this
machine, nodes n0-n2) runs a pruned 3-stage job, one stage per node. Packing onto 2
devices frees rank 2 and its node; the supervisor tells Slurm
(``srun --overlap`` to end that node's agent, then ``scontrol update NodeList=``) and
the job finishes on the other two.
"""

from __future__ import annotations

import functools
import json
import subprocess
import threading
import time

import pytest

from jobctl.engine.state.db import StateDB

from .. import slurm_cluster
from ..backend_jobs import run_on, service_fixture
from ..jobrun import events, rebalancing_spec

cluster3 = service_fixture(
    "cluster3",
    functools.partial(slurm_cluster.start, nodes=3),
    slurm_cluster.ClusterUnavailable,
    "no Slurm cluster here",
)


def _job_nodes(job_id: str) -> str:
    out = subprocess.run(
        ["squeue", "--noheader", "--jobs", job_id, "--format=%N"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.strip()


@pytest.mark.multiproc
@pytest.mark.slurm
def test_packing_gives_the_freed_node_back_to_slurm(cluster3, tmp_path, monkeypatch):
    for name, value in cluster3.env.items():
        monkeypatch.setenv(name, value)
    steps = 800  # ~15 s after packing; a release (srun, ~1 s agent wait, scontrol) takes ~2
    spec = rebalancing_spec(
        **{
            "training.steps": steps,
            "hardware.backend": "slurm",
            "hardware.rendezvous_host": "127.0.0.1",
            "hardware.nodes": 3,
            "hardware.processes_per_node": 1,
            "hardware.memory_gb": 1,
            "rebalancing.pack": True,
            "rebalancing.target_devices": 2,
            "rebalancing.hold_steps": 1,
            "checkpoint.interval": steps,
        }
    )
    home = tmp_path / "home"
    db = StateDB(home)
    result, seen = {}, []
    thread = threading.Thread(target=lambda: result.update(out=run_on(spec, home, 300)))
    thread.start()
    deadline = time.monotonic() + 300
    while thread.is_alive() and time.monotonic() < deadline:  # the job's nodes as it runs
        runs = db.list_runs()
        job = runs[0]["pids"] if runs and runs[0]["pids"] else None
        if job:
            nodes = _job_nodes(job)
            if nodes and (not seen or seen[-1] != nodes):
                seen.append(nodes)
        time.sleep(0.3)
    thread.join(timeout=30)
    run, outcome = result["out"]
    assert outcome.ok, outcome.message
    assert len([r for r in events(run.dir) if r["kind"] == "step"]) == steps
    recs = events(run.dir)
    (freed,) = [r for r in recs if r["kind"] == "freed"]
    # Rank 2 runs under node-2.sh whatever order torchrun's rendezvous gave the agents.
    node = freed["host_node"]
    assert node == 2, freed
    released = [e for e in db.events(run.id) if e["kind"] == "released"]
    assert len(released) == 1, [e["kind"] for e in db.events(run.id)]
    assert json.loads(released[0]["data"])["nodes"] == [node]
    assert f"gave back n{node}" in released[0]["message"]
    # The job shrank from three nodes to the two still training while it ran.
    kept = ",".join(f"n{k}" for k in range(3) if k != node)
    two = {"n0,n1": "n[0-1]", "n0,n2": "n[0,2]", "n1,n2": "n[1-2]"}[kept]
    assert seen[0] == "n[0-2]" and two in seen, seen
    log = (run.dir / "logs" / f"node-{node}.log").read_text()
    assert f"node {node} released after packing" in log
    # No longer requeued in place: its node scripts were rendered for three nodes.
    job = db.get_run(run.id)["pids"]
    info = subprocess.run(
        ["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30
    )
    assert "Requeue=0" in info.stdout, info.stdout


@pytest.mark.slurm
def test_the_batch_host_is_never_given_back(cluster3, tmp_path, monkeypatch):
    """Slurm cannot drop the node running a job's batch script: a release of it keeps
    the whole allocation, and says why."""
    from jobctl.backends.slurm import SlurmBackend

    for name, value in cluster3.env.items():
        monkeypatch.setenv(name, value)
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=3",
            f"--chdir={tmp_path}",
            "--output=/dev/null",
            "--wrap",
            "sleep 120",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    job = out.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 60
        while _job_nodes(job) != "n[0-2]" and time.monotonic() < deadline:
            time.sleep(0.3)
        released = SlurmBackend().release([job], [0])
        assert released.handles == [] and "(n0 runs its batch script)" in released.note
        assert _job_nodes(job) == "n[0-2]"
    finally:
        subprocess.run(["scancel", job], timeout=30, check=False)
