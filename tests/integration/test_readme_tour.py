"""Every command of the README's CLI tour, as written (#24 item 4): each line of the
``## CLI tour`` block runs in order with the `jobctl` console script, from a folder
holding a copy of jobs/ (so `out/` and the state home `./.jobctl` land there), and
exits 0 with no traceback. The tour is the README's: a line added there runs here.
Its first quickstart run is checked as the end-to-end quickstart test did (one launch
of that job instead of two)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..jobrun import ROOT
from .test_cli import _logged_steps

# What a line must print besides exiting 0, for the lines whose output proves the point.
EXPECT = {
    "jobctl plan jobs/quickstart.yaml --devices 2": "P and D re-planned for 2 device(s)",
    "jobctl logs quickstart --rank 3": "step 60 loss",
    "jobctl status": "quickstart-",
    "jobctl resume quickstart --devices 2": "already complete",
    "jobctl apply jobs/quickstart.yaml": "completed",
    "jobctl apply jobs/hf-llama.yaml": "completed",
    "jobctl export hf-llama --format hf --out hf/": "from step 20",
}


def tour_commands() -> list[str]:
    """The commands of the README's CLI tour, comments cut, in order."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## CLI tour\s+```bash\n(.*?)```", text, re.S)
    assert block, "README.md has no ## CLI tour bash block"
    lines = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line]


def test_the_tour_parses():
    cmds = tour_commands()
    assert len(cmds) >= 15 and all(c.startswith("jobctl ") for c in cmds)
    assert set(EXPECT) <= set(cmds)


@pytest.mark.multiproc
@pytest.mark.timeout(3600)  # calibrate and four training runs, on a shared machine
def test_every_tour_command_runs_as_written(tmp_path):
    shutil.copytree(ROOT / "jobs", tmp_path / "jobs")
    jobctl = shutil.which("jobctl") or str(Path(sys.executable).with_name("jobctl"))
    env = {k: v for k, v in os.environ.items() if k not in ("JOBCTL_HOME", "JOBCTL_DB_URL")}
    env["COLUMNS"] = "80"  # a new user's terminal
    try:
        for cmd in tour_commands():
            args = shlex.split(cmd)
            print(f"{time.strftime('%H:%M:%S')} {cmd}", flush=True)  # shown on failure
            run = subprocess.run(
                [jobctl, *args[1:]],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            out = run.stdout + run.stderr
            assert run.returncode == 0, f"{cmd}: exit {run.returncode}\n{out[-3000:]}"
            assert "Traceback" not in out, f"{cmd}\n{out[-3000:]}"
            # #47: at 80 columns in a pipe, no value is cut short with an ellipsis
            assert "\u2026" not in out, f"{cmd}: a value cut with an ellipsis\n{out[-3000:]}"
            if cmd in EXPECT:
                assert EXPECT[cmd] in out, f"{cmd}\n{out[-3000:]}"
        _check_the_quickstart_run(jobctl, tmp_path, env)
    finally:  # the --detach line leaves a run supervised in the background: stop it
        _stop_all(jobctl, tmp_path, env)


def _check_the_quickstart_run(jobctl: str, cwd: Path, env: dict) -> None:
    """The tour's first `jobctl apply jobs/quickstart.yaml` trained what the README says:
    60 steps, the loss down by more than 1, the final checkpoint, a log per rank in which
    every rank logs every step (the last stage's ranks the loss, the others "-"), every
    rank started warm (forked from its node's agent, engine/worker/agent.py)."""
    run_dir = min((cwd / ".jobctl" / "runs").glob("quickstart-*"))  # ids sort by time
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [s["loss"] for s in steps if s["kind"] == "step"]
    assert len(losses) == 60 and losses[-1] < losses[0] - 1.0
    assert (run_dir / "checkpoints" / "step-00000060" / "manifest.json").exists()
    logs = sorted((run_dir / "logs").glob("rank-*.log"))
    assert [p.name for p in logs] == [f"rank-{r}.log" for r in range(4)]
    shown = [_logged_steps(p.read_text()) for p in logs]
    assert all(sorted(lines) == list(range(1, 61)) for lines in shown)
    assert sorted(lines[60] == "-" for lines in shown) == [False, False, True, True]
    assert "rank 3: done" in logs[3].read_text()
    assert all("warm start: forked from agent" in p.read_text() for p in logs)
    st = subprocess.run(
        [jobctl, "status", run_dir.name], cwd=cwd, env=env, capture_output=True, text=True
    )
    for field, value in (("phase", "completed"), ("step", "60"), ("total_steps", "60")):
        assert re.search(rf"\b{field}\s+│ {value} ", st.stdout), st.stdout


def _stop_all(jobctl: str, cwd: Path, env: dict) -> None:
    """Stop every run that has not ended, and wait (bounded) until they have."""
    deadline = time.monotonic() + 300
    asked = set()
    while time.monotonic() < deadline:
        st = subprocess.run(
            [jobctl, "status", "--json"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        live = [
            r["id"]
            for r in json.loads(st.stdout or "[]")
            if r["phase"] not in ("completed", "failed", "stopped")
        ]
        if not live:
            return
        for rid in set(live) - asked:
            subprocess.run(
                [jobctl, "stop", rid], cwd=cwd, env=env, capture_output=True, timeout=120
            )
            asked.add(rid)
        time.sleep(2)
