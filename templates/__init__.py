"""Jinja2 templates for launch scripts and manifests.

Every template is rendered with ``StrictUndefined`` (a missing value is an error, not
an empty string) and every value that reaches a shell goes through the ``q`` filter
(``shlex.quote``), so names, paths and environment values are always inert data.
Values in lines a shell never reads but another parser does (``#SBATCH`` directives)
go through the ``word`` filter, which refuses anything but one plain word; values in
comments go through ``oneline``, so a newline cannot end the comment early.
"""

from __future__ import annotations

import re
import shlex
from importlib import resources

import jinja2

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WORD = re.compile(r"^[^\s'\"\\]+$")


def shell_quote(value: object) -> str:
    """Quote any value for POSIX shells."""
    return shlex.quote(str(value))


def env_name(value: object) -> str:
    """An environment variable name, refused unless it is a plain identifier."""
    text = str(value)
    if not _ENV_NAME.match(text):
        raise ValueError(f"invalid environment variable name {text!r}")
    return text


def word(value: object) -> str:
    """A value for a directive line: one printable word without quotes or backslashes
    (a newline would end the comment and start a shell command)."""
    text = str(value)
    if not (_WORD.match(text) and text.isprintable()):
        raise ValueError(f"{text!r} cannot go into a directive line: use one plain word")
    return text


def oneline(value: object) -> str:
    """A value for a comment: control characters (newlines) written as escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))


def environment() -> jinja2.Environment:
    """The jinja2 environment all jobctl templates are rendered with."""
    loader = jinja2.FunctionLoader(_load)
    env = jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = shell_quote
    env.filters["env_name"] = env_name
    env.filters["word"] = word
    env.filters["oneline"] = oneline
    return env


def _load(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text()


def render(name: str, **context: object) -> str:
    """Render template ``name`` (e.g. ``node.sh.j2``) with ``context``."""
    return environment().get_template(name).render(**context)
