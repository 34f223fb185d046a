"""A failing worker fails the run: non-zero outcome, the rank's log shown, state marked."""

from __future__ import annotations

import pytest

from jobctl.engine.state.db import StateDB

from ..jobrun import run_job, tiny_spec


@pytest.mark.multiproc
def test_worker_crash_fails_run_with_its_log(tmp_path):
    # Rank 0 traps its neighbour's end as a lost peer; its own agent's SIGTERM (the
    # node is torn down: no node is lost) ends its wait for the supervisor's word on
    # lost nodes, so the run fails on the crash at once, not after the 30 s grace.
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
