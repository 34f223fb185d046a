"""Turning pydantic validation errors into positioned, friendly spec issues."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from .base import RULE_ERROR_TYPE
from .errors import SpecIssue, closest, dotted
from .paths import keys_of, model_at, sections_with_key
from .source import Path, Source

Anchor = Literal["key", "value", "parent"]
_MISSING = object()


def validation_issues(
    err: ValidationError, source: Source, overrides: Mapping[Path, Any]
) -> list[SpecIssue]:
    """One issue per pydantic error, and one per violation inside a rule error."""
    issues: list[SpecIssue] = []
    for error in err.errors():
        path = _clean_loc(error["loc"], source.data)
        if error["type"] == RULE_ERROR_TYPE:
            for violation in error.get("ctx", {})["violations"]:
                where = (*path, *violation["path"].split("."))
                message, fix = violation["message"], violation["fix"]
                issues.append(_place(source, overrides, where, "key", message, fix=fix))
        else:
            issues.append(_describe(error, path, source, overrides))
    return issues


def _describe(
    error: ErrorDetails, path: Path, source: Source, overrides: Mapping[Path, Any]
) -> SpecIssue:
    kind, ctx = error["type"], error.get("ctx", {})
    if kind == "extra_forbidden":
        message, suggestion, fix = _unknown_key(path)
        return _place(source, overrides, path, "key", message, suggestion, fix)
    if kind == "missing":
        parent = dotted(path[:-1])
        fix = f"add '{path[-1]}:' " + (f"under '{parent}'" if parent else "at the top level")
        message = f"missing required key '{path[-1]}'"
        return _place(source, overrides, path, "parent", message, fix=fix)
    message = _with_input(error["msg"], error["input"])
    suggestion = ctx.get("suggestion") or _literal_suggestion(error)
    fix = ctx.get("fix") or _bound_fix(kind, ctx)
    return _place(source, overrides, path, "value", message, suggestion, fix)


_BOUND_FIXES = {
    "less_than_equal": ("le", "use a value of at most {}"),
    "less_than": ("lt", "use a value below {}"),
}


def _bound_fix(kind: str, ctx: dict[str, Any]) -> str | None:
    """How to bring a number under its field's upper bound (lower bounds explain
    themselves: pydantic's message shows the value and the bound)."""
    if kind == "finite_number":
        return "write a finite number (not .inf or .nan)"
    if kind in _BOUND_FIXES and _BOUND_FIXES[kind][0] in ctx:
        key, text = _BOUND_FIXES[kind]
        return text.format(ctx[key])
    return None


def _place(
    source: Source,
    overrides: Mapping[Path, Any],
    path: Path,
    anchor: Anchor,
    message: str,
    suggestion: str | None = None,
    fix: str | None = None,
) -> SpecIssue:
    """Position an issue at ``path`` in the file, or name the override that set it."""
    for set_path, value in overrides.items():
        if path[: len(set_path)] == set_path:
            message += f" (from override {dotted(set_path)}={value!r})"
            return SpecIssue(source.filename, None, None, dotted(path), message, suggestion, fix)
    line, column = _locate(source, path, anchor)
    return SpecIssue(source.filename, line, column, dotted(path), message, suggestion, fix)


def _locate(source: Source, path: Path, anchor: Anchor) -> tuple[int, int]:
    """The key or value at ``path``; else the key of its nearest ancestor in the file."""
    positions = source.positions
    if anchor != "parent" and path in positions:
        return positions[path].key if anchor == "key" else positions[path].value
    target = path[:-1] if path else path
    while target and target not in positions:
        target = target[:-1]
    return positions[target].key if target else positions[()].value


def _unknown_key(path: Path) -> tuple[str, str | None, str | None]:
    """Message, suggestion and fix for an unknown key."""
    key, section = str(path[-1]), path[:-1]
    message = f"unknown key '{key}'"
    model = model_at(section)
    if model is None:
        return message, None, None
    valid = list(keys_of(model))
    homes = [home for home in sections_with_key(key) if home != section]
    if homes:  # a real key, just in the wrong section: say where it goes
        names = [f"'{dotted(home)}'" if home else "the top level" for home in homes]
        where = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        return message, None, f"'{key}' belongs under {where}"
    suggestion = closest(key, valid)
    if suggestion is not None:
        return message, suggestion, None
    where = dotted(section) or "the top level"
    return message, None, f"valid keys in '{where}': " + ", ".join(valid)


def _literal_suggestion(error: ErrorDetails) -> str | None:
    """For a value outside a fixed set of choices, the nearest choice."""
    if error["type"] != "literal_error" or not isinstance(error["input"], str):
        return None
    choices = re.findall(r"'([^']*)'", str(error.get("ctx", {}).get("expected", "")))
    return closest(error["input"], choices)


def _with_input(message: str, value: Any) -> str:
    """Append the offending value to pydantic's message unless it already shows it."""
    if isinstance(value, dict):
        return f"{message}, got a mapping"
    if isinstance(value, list):
        return f"{message}, got a list"
    shown = repr(value)
    if shown in message:
        return message
    return f"{message}, got {shown if len(shown) <= 60 else shown[:57] + '...'}"


def _clean_loc(loc: tuple[str | int, ...], data: Any) -> Path:
    """Drop the parts of a pydantic ``loc`` that name union branches rather than keys."""
    path: list[str | int] = []
    current = data
    for part in loc:
        if isinstance(current, dict):
            current = current.get(part, _MISSING)
        elif isinstance(current, list) and isinstance(part, int):
            current = current[part] if 0 <= part < len(current) else _MISSING
        elif current is not _MISSING:
            continue  # below a scalar value, parts are type tags such as 'int'
        path.append(part)
    return tuple(path)
