"""The jobctl command line running real jobs (tests/unit/test_cli.py: exit codes,
messages and files, in this process)."""

from __future__ import annotations

import json
import re

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
    # training.log_every defaults to 1: every rank logs every step; last-stage ranks
    # show the loss, the others "-".
    shown = [_logged_steps((run_dir / "logs" / f"rank-{r}.log").read_text()) for r in range(4)]
    assert all(sorted(lines) == list(range(1, 61)) for lines in shown)
    losses = [lines[60] for lines in shown]
    assert sorted(x == "-" for x in losses) == [False, False, True, True]


def _logged_steps(log: str) -> dict[int, str]:
    """The training lines of a rank's log (as ``logs -f`` shows them too, after the
    file's name): step -> the loss it shows."""
    found = re.findall(
        r"^(?:rank-\d+: )?step (\d+) loss (\S+) samples/s \d+\.\d$", log, re.MULTILINE
    )
    return {int(step): loss for step, loss in found}


@pytest.mark.multiproc
def test_detach_then_follow_logs(tmp_path):
    spec = quickstart_with(tmp_path / "job.yaml", ("  steps: 60", "  steps: 8\n  log_every: 4"))
    r = run_cli(tmp_path, "apply", str(spec), "--detach", timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "supervised in the background" in r.stdout
    # The id, not the first word after "run " (the plan's start-up line says "the first
    # run measures it" when this machine has no start-up time yet).
    run_id = re.search(r"\brun (\S+-\d{8}-\d{6}-[0-9a-f]+)", r.stdout).group(1)
    lg = run_cli(tmp_path, "logs", run_id, "--rank", "0", "-f", timeout=240)
    assert lg.returncode == 0 and "rank 0: done" in lg.stdout
    st = run_cli(tmp_path, "status", run_id)
    assert "completed" in st.stdout
    assert sorted(_logged_steps(lg.stdout)) == [4, 8]
