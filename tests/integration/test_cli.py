"""The jobctl command line running real jobs (tests/unit/test_cli.py: exit codes,
messages and files, in this process)."""

from __future__ import annotations

import json

import pytest

from ..jobrun import QUICKSTART, quickstart_with, run_cli


@pytest.mark.multiproc
def test_quickstart_end_to_end(tmp_path):
    r = run_cli(tmp_path, "apply", str(QUICKSTART), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "completed" in r.stdout
    run_dir = next((tmp_path / "runs").iterdir())
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [s["loss"] for s in steps if s["kind"] == "step"]
    assert len(losses) == 60 and losses[-1] < losses[0] - 1.0
    assert (run_dir / "checkpoints" / "step-00000060" / "manifest.json").exists()
    assert sorted(p.name for p in (run_dir / "logs").glob("rank-*.log")) == [
        f"rank-{r}.log" for r in range(4)
    ]
    st = run_cli(tmp_path, "status")
    assert "completed" in st.stdout and "60/60" in st.stdout
    lg = run_cli(tmp_path, "logs", "quickstart", "--rank", "3")
    assert lg.returncode == 0 and "rank 3: done" in lg.stdout


@pytest.mark.multiproc
def test_detach_then_follow_logs(tmp_path):
    spec = quickstart_with(tmp_path / "job.yaml", ("  steps: 60", "  steps: 8"))
    r = run_cli(tmp_path, "apply", str(spec), "--detach", timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "supervised in the background" in r.stdout
    run_id = r.stdout.split("run ")[1].split()[0]
    lg = run_cli(tmp_path, "logs", run_id, "--rank", "0", "-f", timeout=240)
    assert lg.returncode == 0 and "rank 0: done" in lg.stdout
    st = run_cli(tmp_path, "status", run_id)
    assert "completed" in st.stdout
