"""Real jobctl runs on the remote backends (Slurm, ssh), launched as ``apply`` does.

``run_on`` goes through ``jobctl.engine.supervise.service.launch`` unchanged: ``run_context``
hands the backends the spec's hardware and elasticity sections and the run inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.service import ApplyOptions, launch

from .jobrun import tiny_spec


def service_fixture(name: str, start: Callable[[], object], unavailable: type[Exception], why: str):
    """A module-scoped fixture ``name``: the private service (Slurm cluster, sshd) that
    ``start()`` returns, stopped after the module; the tests skip with ``why`` and the
    error when it raises ``unavailable``."""

    @pytest.fixture(scope="module", name=name)
    def service():
        try:
            running = start()
        except unavailable as e:
            pytest.skip(f"{why}: {e}")
        yield running
        running.stop()

    return service


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


def run_on(spec, home: Path, deadline_s: float = 180.0):
    """Plan and run ``spec`` on its backend to the end; returns (run, outcome)."""
    plan = make_plan(spec)
    opts = ApplyOptions(deadline_s=deadline_s, show_progress=False)
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
