"""The jobctl command line running real jobs (tests/unit/test_cli.py: exit codes,
messages and files, in this process)."""

from __future__ import annotations

import re

import pytest

from ..jobrun import quickstart_with, run_cli


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
