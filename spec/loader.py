"""Loading a job spec from YAML: overrides, relative paths, validation, all issues at once."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .diagnostics import validation_issues
from .errors import SpecError, SpecIssue, closest, dotted
from .files import read_regular
from .job import JobSpec
from .paths import is_free_mapping, keys_of, section_model, yaml_key
from .source import Path as KeyPath
from .source import Source, parse_yaml


def load_spec(path: str | Path, overrides: Mapping[str, Any] | None = None) -> JobSpec:
    """Load and validate the job spec at ``path``, after applying dotted ``overrides``.

    ``overrides`` maps dotted keys to values, e.g. ``{"training.steps": 3}``; a relative
    ``data.path`` resolves against the spec file's folder. Raises :class:`SpecError`
    listing every problem found.
    """
    filename = str(path)
    try:
        raw = read_regular(path)
    except OSError as err:
        fix = getattr(err, "fix", None)
        issue = SpecIssue(filename, None, None, "", f"cannot read job spec: {err}", fix=fix)
        raise SpecError([issue]) from None
    return load_spec_text(decode_text(raw, filename), filename, overrides=overrides)


def decode_text(raw: bytes, filename: str) -> str:
    """``raw`` as UTF-8 text; else a SpecError at the line and column of the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = len(raw[raw.rfind(b"\n", 0, err.start) + 1 : err.start].decode("utf-8", "replace"))
        message = f"not UTF-8 text: byte 0x{raw[err.start]:02x} cannot start a character here"
        fix = "save the file as UTF-8"
        raise SpecError([SpecIssue(filename, line, column + 1, "", message, fix=fix)]) from None


def load_spec_text(
    text: str, filename: str = "<string>", *, overrides: Mapping[str, Any] | None = None
) -> JobSpec:
    """Load and validate a job spec from YAML ``text``; ``filename`` is used in messages.

    A relative ``data.path`` (or ``model.huggingface`` path) resolves against the folder
    of ``filename``, or against the current directory when ``filename`` is a
    placeholder such as ``<string>``.
    """
    source = parse_yaml(text, filename)
    if not isinstance(source.data, dict):
        raise SpecError(source.issues or [_not_a_mapping(source)])
    data, applied, issues = _apply_overrides(source.data, overrides or {}, filename)
    issues = source.issues + issues
    base = _base_dir(filename)
    data = _resolve_model_paths(_resolve_data_path(data, base), base)
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as err:
        placed = {(i.line, i.column) for i in source.issues}  # a value YAML could not read
        found = [
            i for i in validation_issues(err, source, applied) if (i.line, i.column) not in placed
        ]
        raise SpecError(issues + found) from None
    if issues:
        raise SpecError(issues)
    return spec


def _not_a_mapping(source: Source) -> SpecIssue:
    line, column = source.positions[()].value
    kind = "a list" if isinstance(source.data, list) else repr(source.data)
    return SpecIssue(
        source.filename,
        line,
        column,
        "",
        f"a job spec must be a mapping of sections, got {kind}",
        fix="start with keys such as 'name:', 'model:' and 'training:'",
    )


def _apply_overrides(
    data: dict[str, Any], overrides: Mapping[str, Any], filename: str
) -> tuple[dict[str, Any], dict[KeyPath, Any], list[SpecIssue]]:
    """Set each dotted override in a copy of ``data``; unknown override keys are issues."""
    data = copy.deepcopy(data)
    applied: dict[KeyPath, Any] = {}
    issues: list[SpecIssue] = []
    for key, value in overrides.items():
        path = _override_path(key, filename)
        if isinstance(path, SpecIssue):
            issues.append(path)
            continue
        _set(data, path, value)
        applied[path] = value
    return data, applied, issues


def _override_path(key: str, filename: str) -> KeyPath | SpecIssue:
    """The key path an override names, in YAML spelling, or the issue why it names none."""
    model: Any = section_model(JobSpec)
    free = False
    path: list[str] = []
    for part in key.split("."):
        if free:
            path.append(part)
            continue
        if model is None:
            message = f"override '{key}': '{dotted(path)}' is a value, not a section"
            return SpecIssue(filename, None, None, key, message)
        found = yaml_key(model, part)
        if found is None:
            where = dotted(path) or "the top level"
            near = closest(part, keys_of(model))
            suggestion = dotted([*path, near]) if near else None
            message = f"unknown override: no key '{part}' in '{where}'"
            return SpecIssue(filename, None, None, key, message, suggestion)
        path.append(found)
        annotation = model.model_fields[keys_of(model)[found]].annotation
        free, model = is_free_mapping(annotation), section_model(annotation)
    return tuple(path)


def _set(data: dict[str, Any], path: KeyPath, value: Any) -> None:
    """Set ``value`` at ``path``, creating (or replacing non-mapping) sections on the way."""
    node = data
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def _base_dir(filename: str) -> Path:
    if filename.startswith("<"):
        return Path.cwd()
    return Path(filename).parent.resolve()


def _resolve_data_path(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Make relative ``data.path``, ``data.tokenizer`` and ``data.eval`` paths absolute
    against ``base``, the spec file's folder; URLs (``s3://...``) stay as written."""
    section = data.get("data")
    if not isinstance(section, dict):
        return data
    resolved = {}
    for key in ("path", "tokenizer", "eval"):
        value = section.get(key)
        if isinstance(value, str) and "://" not in value:
            path = Path(value).expanduser()
            resolved[key] = os.path.abspath(path if path.is_absolute() else base / path)
    return {**data, "data": {**section, **resolved}} if resolved else data


def _resolve_model_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Make relative ``model.huggingface.config_path`` and ``pretrained`` absolute
    against ``base``, as ``data.path`` is, so every process reads the same files; and
    ``hardware.ssh``'s key and known-hosts files, which the rendered start.sh passes to
    ssh from the run folder (a relative key was checked here, then not found there)."""
    data = _resolved_in(data, base, ("model", "huggingface"), ("config_path", "pretrained"))
    ssh = ("identity_file", "known_hosts_file")  # ~ stays: ssh expands it itself
    return _resolved_in(data, base, ("hardware", "ssh"), ssh, expand=False)


def _resolved_in(
    data: dict[str, Any],
    base: Path,
    where: tuple[str, str],
    keys: tuple[str, ...],
    expand: bool = True,
) -> dict[str, Any]:
    """``data`` with each of ``keys`` of the section at ``where`` absolute against
    ``base`` (``~`` expanded, or with ``expand=False`` left as written; URLs and blank
    values too, for the validators to judge)."""
    outer = data.get(where[0])
    inner = outer.get(where[1]) if isinstance(outer, dict) else None
    if not isinstance(inner, dict):
        return data
    resolved = {}
    for key in keys:
        value = inner.get(key)
        if not isinstance(value, str) or not value.strip() or "://" in value:
            continue
        if not expand and value.startswith("~"):
            continue
        path = Path(value).expanduser()
        resolved[key] = os.path.abspath(path if path.is_absolute() else base / path)
    if not resolved:
        return data
    return {**data, where[0]: {**outer, where[1]: {**inner, **resolved}}}
