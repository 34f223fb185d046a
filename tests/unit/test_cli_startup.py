"""`jobctl` starts without torch for the commands that neither plan nor train (#24
item 9): the command table is lazy, and --help lists every command without loading
it; `--version` and shell completion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.cli.lazy import COMMANDS, load_command

QUICKSTART = Path(__file__).resolve().parents[2] / "jobs" / "quickstart.yaml"

# Runs `jobctl ARGS` in this interpreter, then reports which heavy modules it imported.
PROBE = """
import json, sys
from jobctl.engine.cli.app import app
try:
    app(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
heavy = json.loads(HEAVY)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy
                        or any(m.startswith(h + ".") for h in heavy))))
"""
# The planner, and Mobius's planning beside it in its own room (engine.mobius.planning).
HEAVY = [
    "torch",
    "jobctl.engine.planner",
    "jobctl.engine.mobius.planning",
    "jobctl.engine.calibration.cache",
]
# What the commands that only read the state DB leave out besides (#24 item 9): the
# SQLAlchemy state DB (a SQLite file is read through sqlite3), the backends (jinja2)
# and the token files (numpy).
READ_ONLY_HEAVY = [
    *HEAVY,
    "sqlalchemy",
    "jobctl.backends",
    "jobctl.engine.data.tokens",
    "numpy",
    "jobctl.engine.recurring",
]


def _imported(args: list[str], heavy: list[str] = HEAVY) -> list[str]:
    probe = PROBE.replace("HEAVY", repr(json.dumps(heavy)))
    out = subprocess.run(
        [sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["validate", str(QUICKSTART)],
        ["schema"],
        ["status"],
        ["status", "--json"],
        ["logs", "nope"],
        ["events", "nope"],
        ["plan", "--help"],
    ],
)
def test_light_commands_never_import_torch(args, tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path))
    assert _imported(args) == []


@pytest.mark.parametrize("command", [["plan"], ["apply"], ["apply", "--dry-run"]])
def test_a_bad_spec_is_refused_before_the_planner_loads(command, tmp_path, monkeypatch):
    """The spec is checked first: a broken one is refused in half a second, without
    torch (the planner and the supervisor loaded first took 2.7-3 s to say the same)."""
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path))
    bad = tmp_path / "job.yaml"
    bad.write_text(QUICKSTART.read_text().replace("source: synthetic", "source: tokens"))
    assert "source: tokens" in bad.read_text()
    assert _imported([*command, str(bad)], [*HEAVY, "jobctl.engine.supervise"]) == []


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["status", "q-1"],
        ["status", "--json"],
        ["logs", "q-1"],
        ["events", "q"],
        ["validate", str(QUICKSTART)],
    ],
)
def test_reading_commands_import_neither_sqlalchemy_nor_backends(args, tmp_path, monkeypatch):
    """On a (current) SQLite state DB with a run, status, logs and events read it
    through sqlite3; validate of a synthetic-data spec never opens token files."""
    from jobctl.engine.state.db import StateDB

    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path))
    monkeypatch.delenv("JOBCTL_DB_URL", raising=False)
    run_dir = tmp_path / "runs" / "q-1"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "rank-0.log").write_text("step 1\n")
    (run_dir / "spec.yaml").write_text(QUICKSTART.read_text())
    StateDB(tmp_path).create_run("q-1", "q", run_dir, total_steps=4)
    assert _imported(args, READ_ONLY_HEAVY) == []
    assert "sqlalchemy" in _imported(["stop", "q-1"], ["sqlalchemy"])  # the probe sees it


def test_plan_does_import_the_planner(tmp_path, monkeypatch):
    """The probe can see an import: plan needs the planner (and torch)."""
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path))
    assert "torch" in _imported(["plan", str(QUICKSTART)])


def test_help_lines_match_each_commands_own_docstring():
    for name, (_, _, short) in COMMANDS.items():
        assert load_command(name).get_short_help_str(1000) == short, name


def test_help_lists_every_command_and_version_prints():
    r = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    for name in COMMANDS:
        assert f" {name} " in r.output
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.startswith("jobctl ")
    assert "--show-completion" in CliRunner().invoke(app, ["--help"]).output


def test_shell_completion_names_commands_and_options():
    def complete(words: str) -> str:
        env = {
            **os.environ,
            "_JOBCTL_COMPLETE": "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(words.split()) - 1),
        }
        cmd = "from jobctl.engine.cli.app import app; app(prog_name='jobctl')"
        run = subprocess.run(
            [sys.executable, "-c", cmd], capture_output=True, text=True, env=env, timeout=120
        )
        return run.stdout

    assert complete("jobctl sta").split() == ["status"]
    assert "--watch" in complete("jobctl status --w").split()
