"""Text from a spec, a worker or the state DB is printed as it is (#46 item 4).

Before, an event message holding ``[/x]`` made ``jobctl events RUN`` raise Rich's
``MarkupError`` on every call, and a schedule named ``[/x]`` did the same to
``jobctl schedule list``: their table cells were parsed as markup. Now the CLI's
consoles never parse markup; jobctl's own colours go through ``views.markup.styled``,
which escapes the values it is given.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.cli.common import console, err
from jobctl.engine.recurring.book import ScheduleBook
from jobctl.engine.state.db import StateDB
from jobctl.engine.views.markup import plain, styled
from jobctl.spec import ScheduleSpec

runner = CliRunner()
HOSTILE = ["[/x]", "[bold]not bold", "[/]", "[red", "a\\[b]", "[link=x]y[/link]"]


def _out(result) -> str:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    return result.output


@pytest.mark.parametrize("text", HOSTILE)
def test_an_event_with_markup_prints_in_events(tmp_path, text):
    db = StateDB(tmp_path / "home")
    db.create_run("r-1", "r", tmp_path / "r", total_steps=4)
    db.add_event("r-1", "upload_error", text)
    result = runner.invoke(app, ["events", "r-1", "--home", str(tmp_path / "home")])
    assert result.exit_code == 0, _out(result)
    assert text in result.output


@pytest.mark.parametrize("name", ["[/x]", "[bold]job"])
def test_a_schedule_named_with_markup_prints_in_schedule_list(tmp_path, name):
    db = StateDB(tmp_path / "home")
    with ScheduleBook(db) as book:
        book.add(name, ScheduleSpec(cron="0 * * * *"), None)
    result = runner.invoke(app, ["schedule", "list", "--home", str(tmp_path / "home")])
    assert result.exit_code == 0, _out(result)
    assert name in result.output
    events = runner.invoke(app, ["events", name, "--home", str(tmp_path / "home")])
    assert events.exit_code == 0 and "added: cron" in events.output, _out(events)


def test_the_cli_consoles_never_parse_markup():
    # the one mechanism: every table cell or line of data prints as it is
    assert console._markup is False and err._markup is False  # noqa: SLF001


@pytest.mark.parametrize("text", HOSTILE)
def test_styled_escapes_its_fields_and_plain_is_never_parsed(text):
    out = io.StringIO()
    c = Console(file=out, width=200, markup=True)  # even a console that parses markup
    c.print(styled("[red]error:[/red] {}: {n:.1f}", text, n=2.25))
    c.print(plain(text))
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(f"error: {text}") and lines[1] == text
