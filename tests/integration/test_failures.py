"""A failing worker fails the run: non-zero outcome, the rank's log shown, state marked."""

from __future__ import annotations

import pytest

from jobctl.engine.state.db import StateDB

from ..jobrun import run_job, tiny_spec


@pytest.mark.multiproc
def test_worker_crash_fails_run_with_its_log(tmp_path, monkeypatch):
    # Rank 0 traps its neighbour's end as a lost peer and, as a survivor, waits for the
    # supervisor's word on lost nodes (60 s by default; none comes: no node is lost)
    # until its agent kills it 30 s after the crash. The wait is worker config; a short
    # one ends the run on the same failure, 30 s sooner.
    monkeypatch.setenv("JOBCTL_EMERGENCY_WAIT_S", "2")
    spec = tiny_spec(
        **{
            "model.import": "tests.crashmodel:factory",
            "model.import_args": {"after": 5, "hidden": 32, "seq_len": 32},
            "model.family": None,
            "training.steps": 5,
            "parallelism.pipeline_stages": 2,
            "parallelism.data_parallel": 1,
            "hardware.nodes": 1,
        }
    )
    run, outcome = run_job(spec, tmp_path, deadline_s=120)
    assert not outcome.ok
    assert outcome.exit_code != 0
    assert "rank 1 failed" in outcome.message  # the block that explodes lives on stage 1
    assert "boom: this block fails on purpose" in outcome.message
    row = StateDB(tmp_path).get_run(run.id)
    assert row["phase"] == "failed"
    assert "boom" in row["message"]
