"""Helpers for tests that launch real runs through the local backend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from rich.console import Console

from jobctl.engine.checkpoint.blocks import load_full_state
from jobctl.engine.core.events import read_metrics
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.service import ApplyOptions, launch
from jobctl.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "jobs" / "quickstart.yaml"


def tiny_spec(**overrides):
    """The quickstart spec with dotted overrides (e.g. ``{"training.steps": 3}``)."""
    return load_spec(QUICKSTART, overrides=overrides)


def rebalancing_spec(**extra):
    """jobs/pruning.yaml as a 3-stage job of 7 blocks (3 processes on one node) that
    prunes at steps 2, 4, 6 and rebalances by parameters (partition) after each
    profiled step, with dotted overrides."""
    overrides = {
        "model.layers": 5,  # 7 blocks on 3 stages: pruning shifts the parameter balance
        "training.optimizer": "sgd",
        "training.lr": 0.3,
        "training.momentum": 0.9,
        "pruning.start_step": 2,
        "pruning.end_step": 6,
        "pruning.frequency": 2,
        "pruning.initial_sparsity": 0.2,
        "hardware.processes_per_node": 3,
        "parallelism.pipeline_stages": 3,
        "parallelism.data_parallel": 1,
        "rebalancing.enabled": True,
        "rebalancing.balancer": "partition",
        "rebalancing.by": "params",
        "rebalancing.tolerance": 0.0,
        **extra,
    }
    return load_spec(ROOT / "jobs" / "pruning.yaml", overrides=overrides)


def run_job(
    spec,
    home: Path,
    devices: int | None = None,
    resume_dir: Path | None = None,
    deadline_s: float = 240.0,
):
    """Plan and run ``spec`` to the end on local processes; returns (run, outcome)."""
    plan = make_plan(spec, devices)
    db = StateDB(home)
    opts = ApplyOptions(resume_dir=resume_dir, deadline_s=deadline_s, show_progress=False)
    return launch(spec, plan, db, None, opts, Console(quiet=True))


def step_losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in events(run_dir) if r["kind"] == "step"]


def final_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_full_state(run_dir / "checkpoints" / f"step-{step:08d}")


def write_spec(spec, path: Path) -> Path:
    """Write ``spec`` as YAML (for runs launched through the CLI)."""
    from jobctl.spec import dump_yaml

    path.write_text(dump_yaml(spec))
    return path


def start_apply(
    spec_file: Path, home: Path, output: bool = False, unset: tuple[str, ...] = ()
) -> subprocess.Popen:
    """``jobctl apply spec_file`` as its own process group (a supervisor tests can kill),
    with ``JOBCTL_HOME=home``; its output is captured as text with ``output``, else
    dropped. ``unset``: environment variables it must not inherit."""
    env = {**os.environ, "JOBCTL_HOME": str(home), "COLUMNS": "200"}
    for name in unset:
        env.pop(name, None)
    out = subprocess.PIPE if output else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, "-m", "jobctl.engine.cli.app", "apply", str(spec_file)],
        env=env,
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT if output else subprocess.DEVNULL,
        text=output,
        start_new_session=True,
    )


def events(run_dir: Path) -> list[dict]:
    """The run's complete events so far (a line still being appended is left out)."""
    return read_metrics(run_dir / "metrics.jsonl", 0)[0]


def wait_for(predicate, timeout: float = 180.0, what: str = "condition"):
    """Poll ``predicate()`` until it returns something truthy; fail after ``timeout``."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
