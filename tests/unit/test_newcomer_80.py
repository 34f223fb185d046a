"""#47's done-when, for the commands a newcomer runs that start nothing: `plan` of every
shipped job (the alternatives and their reasons, the stage and rank tables, the
prediction), `validate` of each, a fleet file given as a job, a text file given as
tokens and `plan --devices` above the pool, each at an 80-column terminal and in a
pipe: no value cut with an ellipsis, no line wider than 80 columns at the terminal
unless it is one word, path or `command` alone (the terminal would cut it mid-word),
and in the pipe every line whole. The tour's own lines: tests/integration/test_readme_tour.py."""

from __future__ import annotations

import re
from pathlib import Path

from rich.cells import cell_len
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.views.prose import breaks

JOBS = Path(__file__).resolve().parents[2] / "jobs"
TERMINAL = {"COLUMNS": "80", "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "0", "NO_COLOR": "1"}
PIPE = {"COLUMNS": "80", "TTY_COMPATIBLE": "0"}


def _out(args: list[str], env: dict, code: int = 0) -> str:
    got = CliRunner().invoke(app, args, env=env)
    assert got.exit_code == code, got.output
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", got.output)


def _fits_80(text: str) -> None:
    assert "\u2026" not in text, text
    for line in text.splitlines():
        wide = cell_len(line) > 80
        assert not (wide and breaks(line.strip())), f"cut mid-word at 80:\n{line}"


def _cases(tmp_path: Path) -> list[tuple[list[str], int]]:
    text = tmp_path / "notes.txt"
    text.write_text("def f(x):\n    return x + 1\n" * 200)
    as_tokens = (
        (JOBS / "quickstart.yaml").read_text().replace("source: synthetic", "source: tokens")
    )
    as_tokens = as_tokens.replace("data:\n", f"data:\n  path: {text}\n", 1)
    (tmp_path / "tokens.yaml").write_text(as_tokens)
    cases = [(["plan", str(job)], 0) for job in sorted(JOBS.glob("*.yaml"))]
    cases[[a[1] for a, _ in cases].index(str(JOBS / "fleet-sweep.yaml"))] = (
        ["plan", str(JOBS / "fleet-sweep.yaml")],
        2,
    )
    return cases + [
        (["validate", str(tmp_path / "tokens.yaml")], 2),
        (["plan", str(JOBS / "pruning.yaml"), "--devices", "4"], 0),
        (["plan", str(JOBS / "quickstart.yaml"), "--explain"], 0),
    ]


def test_a_newcomers_commands_fit_80_columns_at_a_terminal_and_in_a_pipe(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path / "home"))
    for args, code in _cases(tmp_path):
        _fits_80(_out(args, TERMINAL, code))
        piped = _out(args, PIPE, code)
        assert "\u2026" not in piped, piped
    said = _out(["validate", str(tmp_path / "tokens.yaml")], PIPE, 2)
    assert "looks like text" in said, said  # the fix names source: text, not a vocab size
