"""Every command's ``--help`` at 80 columns (#47): completion options on the root
alone, on/off flags without a ``<bool>`` value, no reST double backquotes, arguments
in capitals on the usage line (SPEC_FILE, not ``{spec_file}``), paragraphs wrapped by
the terminal rather than at the docstring's line breaks, and ``render --home``."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.cli.lazy import COMMANDS, load_command, plain_text


def _help(*args: str) -> str:
    got = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
    assert got.exit_code == 0, got.output
    return got.output


def _every_command() -> list[tuple[str, ...]]:
    out = []
    for name in COMMANDS:
        cmd = load_command(name)
        subs = getattr(cmd, "commands", {})
        out += [(name, sub) for sub in subs] if subs else [(name,)]
    return out


def _read_as_help(text: str) -> None:
    assert "<bool>" not in text and "``" not in text
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    assert not re.search(r"\{\w+\}", usage), usage
    assert all(len(line) <= 80 for line in text.splitlines())


@pytest.mark.parametrize("args", _every_command(), ids=" ".join)
def test_every_subcommand_help_reads_plainly(args):
    text = _help(*args)
    assert "--install-completion" not in text and "--show-completion" not in text
    _read_as_help(text)


def test_the_root_alone_offers_completion():
    text = _help()
    assert "--install-completion" in text and "The jobctl command line." in text
    _read_as_help(text)


def test_plan_help_names_its_argument_and_wraps_its_paragraph():
    text = _help("plan")
    assert "plan [OPTIONS] SPEC_FILE" in text and "SPEC_FILE" in text.split("Arguments")[1]
    assert not any(line.strip("│ ") == "one" for line in text.splitlines())  # was cut there


def test_render_plans_with_the_calibration_under_home():
    assert "--home" in _help("render")


def test_plain_text_joins_lines_and_keeps_paragraphs():
    doc = "The ``jobctl`` command\nline.\n\nSecond\n  paragraph."
    assert plain_text(doc) == "The jobctl command line.\n\nSecond paragraph."
