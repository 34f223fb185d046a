"""A new user's first hour (#24 items 1, 4, 7): every shipped example validates and
dry-runs; a run that cannot reach its object store is refused before launch; a launch
that fails leaves a failed run with its reason (and `stop` clears any such run);
`--devices` re-plans P and D; resuming a completed run says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.state.db import StateDB
from jobctl.spec import dump_yaml, load_spec

JOBS = Path(__file__).resolve().parents[2] / "jobs"
SPECS = sorted(p for p in JOBS.glob("*.yaml") if p.name != "fleet-sweep.yaml")


def _run(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})


@pytest.fixture
def no_aws(monkeypatch, tmp_path):
    """No AWS credentials anywhere botocore looks, and no instance metadata lookups."""
    for var in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_ENDPOINT_URL",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.name)
def test_every_shipped_example_validates_and_dry_runs(spec):
    r = _run("validate", str(spec))
    assert r.exit_code == 0, r.output
    r = _run("apply", str(spec), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "plan" in r.output and "error" not in r.output


def test_missing_object_store_credentials_refused_before_launch(no_aws, tmp_path):
    r = _run("apply", str(JOBS / "gpt-small-spot.yaml"), "--home", str(tmp_path / "h"))
    assert r.exit_code == 2, r.output
    assert "checkpoint.remote s3://my-bucket" in r.output and "AWS_ACCESS_KEY_ID" in r.output
    assert StateDB(tmp_path / "h").list_runs() == []  # nothing recorded, nothing started


def test_failed_launch_leaves_a_failed_run_with_its_reason(monkeypatch, tmp_path):
    """Credentials, but an endpoint nobody answers: the launch raises while looking for
    checkpoints to resume from; the run is failed with the reason, not left launching."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    spec = load_spec(JOBS / "quickstart.yaml", {"checkpoint.remote": "s3://b/quick"})
    path = tmp_path / "quick.yaml"
    path.write_text(dump_yaml(spec))
    home = tmp_path / "h"
    r = _run("apply", str(path), "--home", str(home))
    assert r.exit_code == 1, r.output
    assert "the launch failed" in r.output and "Traceback" not in r.output
    (row,) = StateDB(home).list_runs()
    assert row["phase"] == "failed" and "launch failed" in row["message"]
    assert (Path(row["run_dir"]) / "launch-error.txt").exists()


def test_stop_clears_a_run_nobody_runs(tmp_path):
    """A run left launching with no supervisor and no node: `stop` stops it."""
    db = StateDB(tmp_path)
    db.create_run("ghost-1", "ghost", tmp_path / "ghost-1", total_steps=10)
    db.set_phase("ghost-1", "launching", "P=1 D=1")
    r = _run("stop", "ghost-1", "--home", str(tmp_path))
    assert r.exit_code == 0 and "stopped" in r.output, r.output
    assert db.get_run("ghost-1")["phase"] == "stopped"


def test_devices_replans_fixed_p_and_d():
    r = _run("plan", str(JOBS / "quickstart.yaml"), "--devices", "2")
    assert r.exit_code == 0, r.output
    assert "P and D re-planned for 2 device(s)" in r.output
    assert "on 2 device(s)" in r.output


def test_devices_above_the_pool_are_said_not_silent():
    """#47: `plan --devices 8` on the quickstart's pool of 4 planned without a word."""
    r = _run("plan", str(JOBS / "quickstart.yaml"), "--devices", "8")
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert "--devices 8: more than the pool's 4 (hardware.nodes x processes_per_node)" in said
    assert "planned for 8 as asked" in said


def test_resume_of_a_completed_run_says_so(tmp_path):
    db = StateDB(tmp_path)
    db.create_run("done-1", "done", tmp_path / "done-1", total_steps=10)
    for phase in ("launching", "training", "completed"):
        db.set_phase("done-1", phase, "")
    db.update_run("done-1", step=10, loss=2.5)
    r = _run("resume", "done-1", "--home", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert "already complete (step 10/10, loss 2.5000)" in r.output
    assert "plan" not in r.output.split("already")[0] and "nan" not in r.output


def test_apply_into_a_pipe_prints_a_line_per_log_every_steps():
    """#24 item 6: no progress bar into a non-terminal; one line per log_every steps
    (and the last), with step, loss and samples/s."""
    import io

    from rich.console import Console

    from jobctl.engine.supervise.attempt import ProgressView

    out = io.StringIO()
    view = ProgressView(Console(file=out, width=80), "run-1", total=7, start=0, log_every=3)
    for step in range(1, 8):
        view.on_event(
            {"kind": "step", "step": step, "loss": 5.0 - step / 10, "samples_per_s": 100.0 + step}
        )
    view.stop()
    assert out.getvalue().splitlines() == [
        "step 3/7 loss 4.7000 samples/s 103.0",
        "step 6/7 loss 4.4000 samples/s 106.0",
        "step 7/7 loss 4.3000 samples/s 107.0",
    ]


PRUNED = {
    "kind": "pruning",
    "step": 4,
    "achieved_sparsity": 0.3,
    "target_sparsity": 0.3,
    "stage_sparsity": [0.25, 0.35],
}
REBALANCED = {
    "kind": "rebalanced",
    "step": 5,
    "balancer": "partition",
    "by": "params",
    "imbalance_before": 0.4,
    "imbalance_after": 0.1,
    "predicted_step_s_before": 0.2,
    "predicted_step_s_after": 0.15,
    "moves": [[3, 1, 0]],
}


@pytest.mark.parametrize("terminal", [False, True])
def test_apply_names_each_pruning_step_and_rebalance_as_it_happens(terminal):
    """#47: `apply jobs/pruning.yaml` never mentioned pruning or sparsity; each pruning
    step (the sparsity reached, per stage) and each rebalance is now a line of its own,
    in a pipe and above a terminal's bar."""
    import io

    from rich.console import Console

    from jobctl.engine.supervise.attempt import ProgressView

    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=terminal, color_system=None)
    view = ProgressView(console, "run-1", total=8, start=0)
    for rec in (PRUNED, REBALANCED):
        view.on_event(rec)
    view.stop()
    text = out.getvalue()
    assert "pruned step 4: 30.0 % sparse (target 30.0 %); per stage 25.0 %, 35.0 %" in text
    assert "rebalance step 5: partition by params, imbalance 40.0 % -> 10.0 %" in text
    assert "block 3: 1->0" in text


def test_apply_continuing_a_run_predicts_the_steps_left(tmp_path):
    """#47: `apply` that continues an unfinished run predicted all its steps; it counts
    from the run's newest checkpoint now, as `resume` does."""
    from jobctl.engine.cli.apply import _continued_from
    from jobctl.engine.state.db import StateDB

    db = StateDB(tmp_path)
    db.create_run("q-1", "quickstart", tmp_path / "runs" / "q-1", total_steps=300, devices=4)
    assert _continued_from(db, None) == 0 and _continued_from(db, "q-1") == 0
    db.update_run("q-1", last_checkpoint=72)
    assert _continued_from(db, "q-1") == 72
