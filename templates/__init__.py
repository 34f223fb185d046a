"""Jinja2 templates for launch scripts and manifests.

Every template is rendered with ``StrictUndefined`` (a missing value is an error, not
an empty string) and every value that reaches a shell goes through the ``q`` filter
(``shlex.quote``), so names, paths and environment values are always inert data.
"""

from __future__ import annotations

import re
import shlex
from importlib import resources

import jinja2

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def shell_quote(value: object) -> str:
    """Quote any value for POSIX shells."""
    return shlex.quote(str(value))


def env_name(value: object) -> str:
    """An environment variable name, refused unless it is a plain identifier."""
    text = str(value)
    if not _ENV_NAME.match(text):
        raise ValueError(f"invalid environment variable name {text!r}")
    return text


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
    return env


def _load(name: str) -> str:
    return resources.files(__name__).joinpath(name).read_text()


def render(name: str, **context: object) -> str:
    """Render template ``name`` (e.g. ``local_node.sh.j2``) with ``context``."""
    return environment().get_template(name).render(**context)
