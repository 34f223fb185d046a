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
JOBCTL = [sys.executable, "-m", "jobctl.engine.cli.app"]
"""The jobctl command line, as a module of this interpreter."""
PRUNE_AND_REBALANCE_3 = {
    "pruning.start_step": 2,
    "pruning.end_step": 6,
    "pruning.frequency": 2,
    "pruning.initial_sparsity": 0.2,
    "hardware.processes_per_node": 3,
    "parallelism.pipeline_stages": 3,
    "parallelism.data_parallel": 1,
    "rebalancing.enabled": True,
    "rebalancing.tolerance": 0.0,
}
"""Overrides of jobs/pruning.yaml: 3 stages on one node that prune at steps 2, 4, 6 and
rebalance after each profiled step."""


def tiny_spec(**overrides):
    """The quickstart spec with dotted overrides (e.g. ``{"training.steps": 3}``)."""
    return load_spec(QUICKSTART, overrides=overrides)


def quickstart_with(path: Path, *edits: tuple[str, str]) -> Path:
    """Write jobs/quickstart.yaml with each ``(old, new)`` text edit (``old`` must be in it)
    to ``path``; returns ``path``."""
    text = QUICKSTART.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    path.write_text(text)
    return path


def rebalancing_spec(**extra):
    """jobs/pruning.yaml as a 3-stage job of 7 blocks (3 processes on one node) that
    prunes at steps 2, 4, 6 and rebalances by parameters (partition) after each
    profiled step, with dotted overrides."""
    overrides = {
        "model.layers": 5,  # 7 blocks on 3 stages: pruning shifts the parameter balance
        "training.optimizer": "sgd",
        "training.lr": 0.3,
        "training.momentum": 0.9,
        **PRUNE_AND_REBALANCE_3,
        "rebalancing.balancer": "partition",
        "rebalancing.by": "params",
        **extra,
    }
    return load_spec(ROOT / "jobs" / "pruning.yaml", overrides=overrides)


def run_job(spec, home: Path, devices: int | None = None, **options):
    """Plan and run ``spec`` to the end on local processes; returns (run, outcome).
    ``options``: ApplyOptions fields (``resume_dir``, ``deadline_s``, 240 s by default)."""
    plan = make_plan(spec, devices)
    db = StateDB(home)
    opts = ApplyOptions(**{"deadline_s": 240.0, **options}, show_progress=False)
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


def cli_env(home: Path) -> dict[str, str]:
    """The environment of a jobctl command on ``home``: ``JOBCTL_HOME`` and a wide terminal."""
    return {**os.environ, "JOBCTL_HOME": str(home), "COLUMNS": "200"}


def run_cli(home: Path, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    """``jobctl ARGS`` on ``home`` in its own process from the repository root, to the
    end (or ``timeout``), its output captured as text."""
    return subprocess.run(
        [*JOBCTL, *args],
        env=cli_env(home),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_apply(
    spec_file: Path, home: Path, output: bool = False, unset: tuple[str, ...] = ()
) -> subprocess.Popen:
    """``jobctl apply spec_file`` as its own process group (a supervisor tests can kill),
    with ``JOBCTL_HOME=home``; its output is captured as text with ``output``, else
    dropped. ``unset``: environment variables it must not inherit."""
    env = cli_env(home)
    for name in unset:
        env.pop(name, None)
    out = subprocess.PIPE if output else subprocess.DEVNULL
    return subprocess.Popen(
        [*JOBCTL, "apply", str(spec_file)],
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


def plain_eval(spec, weights: dict, data, m: int) -> float:
    """The mean loss of samples [0, B) of ``data`` under ``weights`` (by the unsplit
    model's names): one process, a plain forward in eval mode, micro-batches of ``m``
    weighted m / B -- what every layout's eval pass must equal."""
    import torch

    from jobctl.engine.model.blocks import Stage, model_def

    mdef = model_def(spec.model, spec.training.seed, m)
    model = Stage(mdef, range(mdef.num_blocks)).eval()
    B, total = spec.training.global_batch_size, 0.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weights[name])
        for first in range(0, B, m):
            x, y = data.batch(first, m)
            batch = model.batch(x, y, first)
            total += float(model.loss(model(x, batch), y, batch)) * m / B
    return total
