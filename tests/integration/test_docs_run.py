"""Every command in the documentation runs as written (#48): each line of every ```bash
block of README.md and docs/*.md that tests/unit/test_docs_commands.py selects (not the
set-up commands, not the CLI tour's lines, not a `# needs: gpu|cluster` line) runs, in
order per page, from a folder holding a copy of jobs/ (its own state home ./.jobctl),
at 80 columns, and exits 0 with no traceback. The pages' benchmark commands, in their
smallest real form, cost this a few minutes: an integration test, not the developer
loop's."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobctl.engine.cli.app import app

from ..jobrun import ROOT
from ..unit.test_docs_commands import IN_PROCESS, SHELL, pages, split


def _in_process(args: list[str]) -> bool:
    if args[0] != "jobctl" or len(args) < 2:
        return False
    return args[1] in IN_PROCESS or (args[1] == "apply" and "--dry-run" in args)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_every_docs_command_runs_as_written(page, tmp_path, monkeypatch):
    commands, _ = split(page)
    if not commands:
        return
    shutil.copytree(ROOT / "jobs", tmp_path / "jobs")
    env = {k: v for k, v in os.environ.items() if k not in ("JOBCTL_HOME", "JOBCTL_DB_URL")}
    env["COLUMNS"] = "80"  # a new user's terminal
    env["JOBCTL_HOME"] = str(tmp_path / ".jobctl")  # what ./.jobctl is, made explicit
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)  # `python -m benchmarks`, run from the repository root
    env["BENCHMARKS_RESULTS"] = str(tmp_path / "results")  # every run writes one: not the tree's
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JOBCTL_HOME", env["JOBCTL_HOME"])
    runner = CliRunner()
    for cmd in commands:
        args = shlex.split(cmd, comments=True)
        if not SHELL.search(cmd.split("#", 1)[0]) and _in_process(args):
            r = runner.invoke(app, args[1:], env={"COLUMNS": "80"})
            out = r.output
            crashed = r.exception is not None and not isinstance(r.exception, SystemExit)
            assert r.exit_code == 0 and not crashed, f"{page.name}: {cmd}: {r.exit_code}\n{out}"
        else:
            done = subprocess.run(
                ["bash", "-c", cmd],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            out = done.stdout + done.stderr
            assert done.returncode == 0, f"{page.name}: {cmd}: exit {done.returncode}\n{out}"
        assert "Traceback" not in out, f"{page.name}: {cmd}\n{out[-3000:]}"
