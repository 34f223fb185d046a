"""Backend errors at the command line: exit 2, one clear paragraph, no traceback."""

from __future__ import annotations

from typer.testing import CliRunner

from jobctl.engine.cli import app
from jobctl.engine.state import StateDB

from .jobrun import QUICKSTART

runner = CliRunner()


def _assert_clear(r, *phrases: str) -> None:
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    for phrase in phrases:
        assert phrase in r.output, r.output
    assert "Fix:" in r.output and "valid: local, slurm, kubernetes, ssh" in r.output


def test_render_refused_by_the_backend_exits_2(tmp_path):
    args = ["render", str(QUICKSTART), "--out", str(tmp_path / "out"), "--backend", "kubernetes"]
    r = runner.invoke(app, args)
    _assert_clear(r, "the kubernetes backend cannot render", "hardware.kubernetes", "image")
    assert not (tmp_path / "out").exists()


def test_dry_run_refused_by_the_backend_exits_2(tmp_path):
    args = ["apply", str(QUICKSTART), "--dry-run", "--backend", "ssh", "--home", str(tmp_path)]
    r = runner.invoke(app, args)
    _assert_clear(r, "the ssh backend cannot render", "hardware.hosts", "0 host(s) for 2 node(s)")
    assert not (tmp_path / "runs").exists()


def test_unknown_backend_exits_2(tmp_path):
    args = ["render", str(QUICKSTART), "--out", str(tmp_path), "--backend", "nomad"]
    r = runner.invoke(app, args)
    _assert_clear(r, "unknown backend 'nomad'")


def test_submission_refused_exits_2_and_marks_the_run_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no sbatch on this PATH
    args = ["apply", str(QUICKSTART), "--backend", "slurm", "--home", str(tmp_path)]
    r = runner.invoke(app, args)
    _assert_clear(r, "the slurm backend cannot start", "sbatch: command not found")
    (row,) = StateDB(tmp_path).list_runs()
    assert (row["phase"], row["exit_code"]) == ("failed", 2)
