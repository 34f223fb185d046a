"""The ``jobctl`` command line.

Exit codes: 0 success, 1 the run failed, 2 bad input (spec, plan or arguments: nothing
was started).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from jobctl.engine.cli.lazy import LazyGroup, plain_text

app = typer.Typer(cls=LazyGroup, no_args_is_help=True, help=plain_text(__doc__))


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"jobctl {version('jobctl')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="print jobctl's version and exit",
        ),
    ] = False,
) -> None:
    """The commands live in jobctl.engine.cli.lazy.COMMANDS, imported when they run."""


def main() -> None:
    """Console-script entry point; a state DB that cannot be read or written (locked) is
    one line, exit 2."""
    try:
        sys.exit(app())
    except Exception as e:
        # StateDBError, without importing the state DB before it is needed: a command
        # that never imported it cannot have raised it.
        db = sys.modules.get("jobctl.engine.state.reader")
        if db is None:
            raise
        locked = db.write_error(e)  # a write that gave up on another process's lock
        if locked is None and not isinstance(e, db.StateDBError):
            raise
        print(f"error: {locked or e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
