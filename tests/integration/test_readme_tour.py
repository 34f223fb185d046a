"""Every command of the README's CLI tour, as written (#24 item 4): each line of the
``## CLI tour`` block runs in order with the `jobctl` console script, from a folder
holding a copy of jobs/ (so `out/` and the state home `./.jobctl` land there), and
exits 0 with no traceback. The tour is the README's: a line added there runs here.
Its first quickstart run is checked as the end-to-end quickstart test did (one launch
of that job instead of two).

#47: each line runs as at a new user's terminal of 80 columns (Rich taken for a
terminal, colours off), where no line may be wider than 80 columns unless it is one
word, a path or a `command` alone (the terminal would otherwise cut it mid-word), and
the lines that start nothing run again in a pipe, where no value may be cut short. The
varuna run is driven while it trains: detached, scaled, stopped, resumed."""

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
from rich.cells import cell_len

from jobctl.engine.views.prose import breaks

from ..jobrun import ROOT
from .test_cli import _logged_steps

# What a line must print besides exiting 0, for the lines whose output proves the point.
EXPECT = {
    "jobctl plan jobs/quickstart.yaml --devices 2": "P and D re-planned for 2 device(s)",
    "jobctl logs quickstart --rank 3": "step 60 loss",
    "jobctl status": "quickstart-",
    "jobctl apply jobs/varuna.yaml --detach": "supervised in the background",
    "jobctl scale varuna 2": "scaling from 4 to 2 device(s)",
    "jobctl stop varuna": "stopped at step",
    "jobctl resume varuna --devices 4": "completed",
    "jobctl events varuna": "morph",
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
    terminal = {**env, "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "0", "NO_COLOR": "1"}
    try:
        for cmd in tour_commands():
            out = _run_line(jobctl, cmd, tmp_path, terminal)
            if cmd not in AS_IS:
                _assert_fits_80(cmd, out)
            if cmd in EXPECT:
                assert " ".join(EXPECT[cmd].split()) in " ".join(out.split()), f"{cmd}\n{out}"
            if not cmd.startswith(STARTS):  # the same line in a pipe: nothing cut
                _run_line(jobctl, cmd, tmp_path, env)
        _check_the_quickstart_run(jobctl, tmp_path, env)
    finally:  # a line that fails leaves a run supervised in the background: stop it
        _stop_all(jobctl, tmp_path, env)


# Lines that print a document as it is (JSON, the rendered scripts, worker logs).
AS_IS = {
    "jobctl schema",
    "jobctl apply jobs/quickstart.yaml --dry-run",
    "jobctl logs quickstart --rank 3",
}
# Lines that start, stop or change a run: run once, at the terminal.
STARTS = ("jobctl apply", "jobctl resume", "jobctl scale", "jobctl stop", "jobctl calibrate")


def _run_line(jobctl: str, cmd: str, cwd: Path, env: dict) -> str:
    """Run one tour line; its output, checked for exit 0, no traceback, no cut value."""
    print(f"{time.strftime('%H:%M:%S')} {cmd}", flush=True)  # shown on failure
    run = subprocess.run(
        [jobctl, *shlex.split(cmd)[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", run.stdout + run.stderr)  # bold, cursor
    assert run.returncode == 0, f"{cmd}: exit {run.returncode}\n{out[-3000:]}"
    assert "Traceback" not in out, f"{cmd}\n{out[-3000:]}"
    # #47: at 80 columns, at a terminal or in a pipe, no value is cut with an ellipsis
    assert "\u2026" not in out, f"{cmd}: a value cut with an ellipsis\n{out[-3000:]}"
    return out


def _assert_fits_80(cmd: str, out: str) -> None:
    """No line wider than 80 columns but one word, path or `command` alone (of a line
    redrawn with \\r, its last frame)."""
    for line in out.splitlines():
        line = line.split("\r")[-1]
        wide = cell_len(line) > 80
        assert not (wide and breaks(line.strip())), f"{cmd}: cut mid-word at 80:\n{line}"


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
