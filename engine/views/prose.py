"""Prose at a terminal's width: wrapped between words, never inside one (#47).

At 80 columns "run X completed in 4.4 s, final loss 2.7430; checkpoints in PATH" ran
past the edge and the terminal cut it wherever the edge fell ("checkpoi" / "nts").
Rich's own wrapping would instead fold a path or a command longer than the line, and a
user copies those. ``wrapped`` breaks at the spaces between words only: a word, a path
and a `backquoted command` (its spaces included) each stay whole on one line, longer
than the width if they must be; a continuation line keeps its line's indentation plus
two. ``ProseConsole`` (the CLI's console) wraps its prose so at a terminal, and leaves
each line whole in a pipe. Text is taken as it is (``Text`` keeps jobctl's own styles;
a ``str`` is never parsed as markup), so user text prints unchanged.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

#: continuation lines are indented this much more than the line they continue
HANG = 2


def breaks(plain: str) -> list[int]:
    """Offsets of the spaces ``plain`` may break at: outside every `backquoted` span."""
    out, inside = [], False
    for i, ch in enumerate(plain):
        if ch == "`":
            inside = not inside
        elif ch == " " and not inside:
            out.append(i)
    return out


def wrap_spans(plain: str, width: int) -> list[tuple[int, int]]:
    """(start, end) of each line of ``plain`` (one line, no newline) wrapped at
    ``width`` cells, greedily, at the spaces of ``breaks`` (dropped where it breaks);
    a word longer than a line stands on a line of its own."""
    indent = len(plain) - len(plain.lstrip(" "))
    cuts = [i for i in breaks(plain) if i > indent] + [len(plain)]
    spans, start, lead, last = [], 0, 0, None  # lead: the indent a line is printed with
    for cut in cuts:
        if cut <= start:  # a run of spaces just broken at
            continue
        if last is not None and lead + cell_len(plain[start:cut]) > width:
            spans.append((start, last))
            start, lead = _next_word(plain, last), indent + HANG
        last = cut
    spans.append((start, len(plain)))
    return spans


def _next_word(plain: str, at: int) -> int:
    while at < len(plain) and plain[at] == " ":
        at += 1
    return at


def wrapped(text: str | Text, width: int) -> list[Text]:
    """``text``'s lines, each wrapped at ``width`` as ``wrap_spans`` says."""
    whole = text if isinstance(text, Text) else Text(text)
    out = []
    for line in whole.split("\n", allow_blank=True):
        plain = line.plain.rstrip()
        indent = len(plain) - len(plain.lstrip(" "))
        for k, (a, b) in enumerate(wrap_spans(plain, width)):
            piece = line[a:b]
            out.append(Text(" " * (indent + HANG)) + piece if k else piece)
    return out


def say(console: Console, text: str | Text, **kw) -> None:
    """Print ``text`` on any console as ``ProseConsole`` prints prose: at a terminal
    wrapped by ``wrapped`` at its width, in a pipe each line whole."""
    lines = wrapped(text, console.width) if console.is_terminal else [text]
    for line in lines:
        console.print(line, soft_wrap=True, **kw)


class ProseConsole(Console):
    """The CLI's console: at a terminal, a ``print`` of one string or ``Text`` without
    an explicit ``soft_wrap`` is prose, wrapped by ``wrapped`` at the terminal's width.
    In a pipe every line stays whole, one value per line for grep and the like (the
    reader's own tool wraps it, if anything). What must print as it is even at a
    terminal (a script, a log line) says ``soft_wrap=True``; a renderable (a table)
    keeps Rich's own layout."""

    def print(self, *objects, **kw) -> None:
        prose = len(objects) == 1 and isinstance(objects[0], str | Text)
        if not prose or "soft_wrap" in kw:
            super().print(*objects, **kw)
        else:
            say(self, objects[0], **kw)  # back here with soft_wrap: to Console.print
