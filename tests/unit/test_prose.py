"""Prose at a terminal's width (#47, engine/views/prose.py): at 80 columns a line wraps
between words and never inside a word, a path or a `command`; in a pipe it stays whole."""

from __future__ import annotations

import io

import pytest
from rich.cells import cell_len
from rich.text import Text
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.views.markup import styled
from jobctl.engine.views.prose import ProseConsole, breaks, wrapped

from ..jobrun import ROOT

RUN = "pruning-20261207-142825-570a"
DONE = styled(
    "[green]run {} completed[/green] in {:.1f} s, final loss {:.4f}; checkpoints in {}",
    RUN,
    4.4,
    2.743,
    f"/tmp/nu/home/runs/{RUN}/checkpoints",
)


def _words(lines: list[str]) -> list[str]:
    return " ".join(lines).split()


def test_a_line_wraps_between_words_and_keeps_its_styles():
    lines = wrapped(DONE, 80)
    plain = [t.plain for t in lines]
    assert plain == [
        f"run {RUN} completed in 4.4 s, final loss 2.7430;",
        f"  checkpoints in /tmp/nu/home/runs/{RUN}/checkpoints",
    ]
    assert _words(plain) == DONE.plain.split()  # every word, none cut
    assert lines[0].spans[0].style == "green" and lines[0].spans[0].end == len(
        f"run {RUN} completed"
    )


def test_a_backquoted_command_is_never_broken_and_a_long_word_stands_alone():
    cmd = f"`jobctl status {RUN}`"
    path = "/very/" + "long/" * 20 + "file.log"
    text = f"see {cmd}, or its log {path} now"
    plain = [t.plain for t in wrapped(text, 40)]
    assert f"  {cmd}," in plain and f"  {path}" in plain
    assert all(cell_len(line) <= 40 or not breaks(line.strip()) for line in plain)
    assert _words(plain) == text.split()


def test_several_lines_keep_their_indentation_and_continue_two_further():
    text = "error: x.yaml: invalid job spec\n  fix: valid keys: " + ", ".join(["name"] * 30)
    plain = [t.plain for t in wrapped(text, 60)]
    assert plain[0] == "error: x.yaml: invalid job spec" and plain[1].startswith("  fix: ")
    assert all(line.startswith("    name") for line in plain[2:]) and len(plain) > 3
    assert all(cell_len(line) <= 60 for line in plain)


@pytest.mark.parametrize("terminal", [True, False])
def test_the_console_wraps_prose_at_a_terminal_only(terminal):
    out = io.StringIO()
    console = ProseConsole(  # as engine/cli/common.py makes it
        file=out, width=80, force_terminal=terminal, color_system=None, soft_wrap=True
    )
    console.print(DONE)
    console.print("#" * 30 + " as is " + "#" * 60, soft_wrap=True)  # a script's line
    lines = out.getvalue().splitlines()
    if terminal:
        assert [cell_len(x) <= 80 for x in lines] == [True, True, False]
    else:
        assert lines[0] == DONE.plain and len(lines) == 2


def test_a_fleet_file_given_to_plan_says_so_with_the_fleet_commands(monkeypatch):
    monkeypatch.chdir(ROOT)
    for command in ("validate", "plan"):
        r = CliRunner().invoke(app, [command, "jobs/fleet-sweep.yaml"])
        assert r.exit_code == 2
        assert r.output.splitlines() == [
            "error: jobs/fleet-sweep.yaml: a fleet file, not a job spec",
            "  fix: `jobctl fleet plan jobs/fleet-sweep.yaml`, then "
            "`jobctl fleet apply jobs/fleet-sweep.yaml`",
        ]


def test_text_is_never_parsed_as_markup():
    lines = wrapped(Text("[red]not markup[/red] " * 8), 40)
    assert all("[red]" in t.plain or "[/red]" in t.plain for t in lines)
