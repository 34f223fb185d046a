"""Output that fits the terminal (#47): a table drops whole columns rather than cut or
wrap a value, and prose lists (why an alternative lost) wrap at words, indented under
their label.

At 80 columns or in a pipe (where Rich assumes 80) a Rich table that is too wide
shrinks every column: values end in ``…`` or wrap one word per line. ``print_fitted``
measures the table's natural width (every cell on one line) and, while it is wider
than the console, removes the next column of ``drop``; what it removed is named on a
dim line after the table, with where the full figures are.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text


def natural_width(console: Console, table: Table) -> int:
    """The columns ``table`` takes with no cell wrapped or cut."""
    wide = console.options.update_width(10_000)  # a measurement is capped at the width
    return Measurement.get(console, wide, table).maximum


def fit_table(console: Console, table: Table, drop: Sequence[str]) -> list[str]:
    """Remove the columns headed ``drop``, in that order, while ``table`` is wider than
    the console; the headers removed. Every column left is kept on one line (no_wrap)
    once the table fits; a table that never fits is left to wrap rather than cut."""
    dropped: list[str] = []
    for header in drop:
        if natural_width(console, table) <= console.width:
            break
        col = next((c for c in table.columns if c.header == header), None)
        if col is not None:
            table.columns.remove(col)
            dropped.append(header)
    if natural_width(console, table) <= console.width:
        for col in table.columns:
            col.no_wrap = True
    return dropped


def print_fitted(
    console: Console, table: Table, drop: Sequence[str], where: str = "a wider terminal"
) -> list[str]:
    """``fit_table``, print the table, then a dim line naming the columns left out."""
    dropped = fit_table(console, table, drop)
    console.print(table)
    if dropped:
        cols = ", ".join(dropped)
        console.print(f"(not shown at {console.width} columns: {cols}; see {where})", style="dim")
    return dropped


def print_labelled(console: Console, rows: Sequence[tuple[str, str]], indent: int = 2) -> None:
    """One entry per ``(label, text)``, indented by ``indent``: the label, then the text
    wrapped at words to the console's width, continuation lines under the text's start
    (plain text: no markup)."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, justify="right")
    grid.add_column(overflow="fold")  # a word longer than the line folds, never an ellipsis
    for label, text in rows:
        grid.add_row(Text(label), Text(text))
    console.print(Padding(grid, (0, 0, 0, indent), expand=False))
