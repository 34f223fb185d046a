"""Real jobctl runs on the remote backends (Slurm, ssh), launched as ``apply`` does.

``run_context`` in ``jobctl.engine.launch`` does not yet pass the spec's hardware and
elasticity sections or the run inputs to backends (see the issue 8 report), so
``launching`` adds them around it; once the engine passes them this is a no-op.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from jobctl.engine import launch as launch_module
from jobctl.engine.apply import ApplyOptions, launch
from jobctl.engine.planner import make_plan
from jobctl.engine.state import StateDB
from jobctl.spec import dump_yaml

from .jobrun import tiny_spec


def two_process_spec(backend: str, steps: int = 4, **overrides):
    """The quickstart on one node with 2 processes (P=2, D=1), for ``backend``."""
    return tiny_spec(
        **{
            "hardware.backend": backend,
            "hardware.nodes": 1,
            "hardware.processes_per_node": 2,
            "parallelism.pipeline_stages": 2,
            "parallelism.data_parallel": 1,
            "training.steps": steps,
            "checkpoint.interval": steps,
            **overrides,
        }
    )


@contextmanager
def launching() -> Iterator[None]:
    """Make ``prepare_run`` hand backends the spec's sections and the run inputs."""
    original = launch_module.run_context

    def run_context(spec, plan, *args, **kwargs):
        ctx = original(spec, plan, *args, **kwargs)
        extra = {
            "hardware": spec.hardware,
            "elasticity": spec.elasticity,
            "inputs": {"spec.yaml": dump_yaml(spec), "plan.json": plan.model_dump_json(indent=2)},
        }
        defaults = {f.name: f.default_factory() for f in dataclasses.fields(ctx) if f.name in extra}
        unset = {k: v for k, v in extra.items() if getattr(ctx, k) == defaults[k]}
        return dataclasses.replace(ctx, **unset)

    launch_module.run_context = run_context
    try:
        yield
    finally:
        launch_module.run_context = original


def run_on(spec, home: Path, deadline_s: float = 180.0):
    """Plan and run ``spec`` on its backend to the end; returns (run, outcome)."""
    plan = make_plan(spec)
    opts = ApplyOptions(deadline_s=deadline_s, show_progress=False)
    with launching():
        return launch(spec, plan, StateDB(home), None, opts, Console(quiet=True))


def wait_done(backend, handles: list[str], timeout: float = 60.0) -> list:
    """Poll ``backend.status`` until every handle is done (bounded); returns the statuses."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = backend.status(handles)
        if all(s.done for s in statuses):
            return statuses
        time.sleep(0.3)
    raise AssertionError(f"{handles} not done after {timeout:.0f} s")
