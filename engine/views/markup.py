"""Rich markup only where jobctl writes it (#46 item 4).

The CLI's consoles are made with ``markup=False``: a table cell or a line holding text
from a spec, a worker, the state DB or the environment (an event message ``[/x]``, a
schedule named ``[bold]``) prints as it is and can never raise ``MarkupError``. The
few lines jobctl colours itself go through ``styled``, the one place markup is parsed,
which escapes every value filled into its template.
"""

from __future__ import annotations

import string

from rich.markup import escape
from rich.text import Text


class _Escaping(string.Formatter):
    """``str.format`` that escapes each formatted field's markup."""

    def format_field(self, value: object, format_spec: str) -> str:
        return escape(format(value, format_spec))


def styled(template: str, *args: object, **fields: object) -> Text:
    """``template``'s own markup (``[red]error:[/red] {}``) with escaped fields."""
    return Text.from_markup(_Escaping().format(template, *args, **fields))


def plain(value: object) -> Text:
    """``value`` as text that no console parses as markup (a table cell of user text)."""
    return Text(str(value))
