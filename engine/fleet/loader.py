"""Loading a fleet file: validate it, render every member's job spec, report all issues.

Every problem is collected before anything is raised: the fleet file's own (positioned
like a job spec's), the template's jinja2 errors, and each member's spec errors, which
name the member and the field and point into the template (the fleet file's lines for
an inline ``template: |``, the base file's otherwise) or at the ``set`` override.
"""

from __future__ import annotations

import itertools
import re
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml
from jinja2.sandbox import SandboxedEnvironment
from pydantic import ValidationError

from jobctl.engine.fleet.spec import FleetSpec, fleet_issues
from jobctl.spec import JobSpec, SpecError, SpecIssue, load_spec_text
from jobctl.spec.files import read_regular, read_regular_text
from jobctl.spec.loader import decode_text
from jobctl.spec.source import Source, parse_yaml

# Sandboxed: a template is data from a fleet file; `{{ cycler.__init__.__globals__.os }}`
# and the like must not reach Python objects (fleets are trusted code only as far as
# their member specs name model.import factories).
_ENV = SandboxedEnvironment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


@dataclass(frozen=True)
class MemberIssue(SpecIssue):
    """A spec issue of one fleet member."""

    member: str = ""

    def __str__(self) -> str:
        text = super().__str__()
        where, sep, rest = text.partition(": ")
        return f"{where}: member {self.member}{sep}{rest}"


@dataclass(frozen=True)
class Member:
    """One rendered, validated member of a fleet."""

    index: int
    name: str
    params: dict[str, Any]
    spec: JobSpec


@dataclass
class Fleet:
    """A loaded fleet: its file, its members and the base spec they are compared with."""

    spec: FleetSpec
    path: Path
    members: list[Member]
    base: JobSpec
    base_label: str = "base"


@dataclass(frozen=True)
class _Template:
    """The template text and where its line 1, column 1 sit in a file."""

    text: str
    filename: str
    line_offset: int = 0
    column_offset: int = 0


def load_fleet(path: str | Path) -> Fleet:
    """Load ``path`` and render its members; raises :class:`SpecError` with every issue."""
    path = Path(path)
    try:
        raw = read_regular(path)
    except OSError as e:
        issue = SpecIssue(
            str(path), None, None, "", f"cannot read: {e}", fix=getattr(e, "fix", None)
        )
        raise SpecError([issue]) from None
    text = decode_text(raw, str(path))  # bad bytes: a SpecError at their line:column
    source = parse_yaml(text, str(path))
    if source.issues or not isinstance(source.data, dict):
        raise SpecError(source.issues or [_issue(source, (), "a fleet file must be a mapping")])
    try:
        spec = FleetSpec.model_validate(source.data)
    except ValidationError as e:
        raise SpecError(fleet_issues(e, source)) from None
    template = _template(spec, path, source, text)
    compiled = _compile(template, spec, source)
    members, issues = _render_members(spec, compiled, template, source)
    issues += _duplicates(members, source)
    if issues:
        raise SpecError(issues)
    base, label = _base(spec, compiled, members)
    return Fleet(spec, path, members, base, label)


def _issue(source: Source, key: tuple, message: str, member: str = "") -> SpecIssue:
    line, column = source.positions[key].key if key in source.positions else (None, None)
    if member:
        return MemberIssue(source.filename, line, column, ".".join(key), message, member=member)
    return SpecIssue(source.filename, line, column, ".".join(key), message)


def _template(spec: FleetSpec, path: Path, source: Source, text: str) -> _Template:
    if spec.base is not None:
        base = (path.parent / spec.base).resolve()
        try:
            return _Template(read_regular_text(base), str(base))
        except (OSError, UnicodeDecodeError) as e:
            raise SpecError([_issue(source, ("base",), f"cannot read base spec: {e}")]) from None
    line, column = source.positions[("template",)].value
    lines = text.splitlines()
    if not lines[line - 1][column - 1 :].startswith("|"):  # only a literal block keeps lines
        return _Template(spec.template, f"{source.filename} (template)")
    body = next((x for x in lines[line:] if x.strip()), "")
    return _Template(spec.template, source.filename, line, len(body) - len(body.lstrip()))


def _compile(template: _Template, spec: FleetSpec, source: Source) -> dict[str, Any]:
    """Compile the spec template, the name pattern and the ``set`` strings."""
    texts = {"template": template.text, "member_name": spec.member_name}
    texts.update({f"set.{k}": v for k, v in spec.set_.items() if isinstance(v, str)})
    compiled, issues = {}, []
    for key, text in texts.items():
        try:
            compiled[key] = _ENV.from_string(text)
        except jinja2.TemplateSyntaxError as e:
            if key == "template":
                line, column = _map(template, e.lineno, None)
                issues.append(SpecIssue(template.filename, line, column, "", f"jinja2: {e}"))
            else:
                issues.append(_issue(source, tuple(key.split(".", 1)), f"jinja2: {e}"))
    if issues:
        raise SpecError(issues)
    return compiled


def _map(template: _Template, line: int | None, column: int | None) -> tuple[int | None, ...]:
    if line is None:
        return None, None
    return line + template.line_offset, (column or 1) + template.column_offset


def parameter_sets(spec: FleetSpec) -> list[dict[str, Any]]:
    """Members' parameters: matrix product x zip rows, then the explicit runs."""
    sets: list[dict[str, Any]] = []
    if spec.matrix or spec.zip_:
        grid = itertools.product(*spec.matrix.values())  # no lists: one empty combination
        crossed = [dict(zip(spec.matrix, combo, strict=True)) for combo in grid]
        rows = zip(*spec.zip_.values(), strict=True)
        zipped = [dict(zip(spec.zip_, row, strict=True)) for row in rows] if spec.zip_ else [{}]
        sets = [{**c, **z} for c in crossed for z in zipped]
    return [{**spec.params, **s} for s in [*sets, *spec.runs]]


def sanitise(name: str) -> str:
    """A job name from free text: lowercase, runs of other characters become '-'."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.strip().lower())
    return re.sub(r"^[^a-z0-9]+", "", slug)[:63].rstrip("-")


def _render_members(
    spec: FleetSpec, compiled: dict, template: _Template, source: Source
) -> tuple[list[Member], list[SpecIssue]]:
    members, issues = [], []
    for index, params in enumerate(parameter_sets(spec)):
        context = {**params, "fleet": spec.name, "index": index}
        label = f"#{index}"
        try:
            name = sanitise(compiled["member_name"].render(context))
            label = name or label
            overrides = _overrides(spec, compiled, context)
            text = compiled["template"].render(context)
        except jinja2.TemplateError as e:
            issues.append(_render_issue(e, label, template))
            continue
        except yaml.YAMLError as e:  # a `set` value that renders to broken YAML
            issues.append(_issue(source, ("set",), f"rendered override is not YAML: {e}", label))
            continue
        if not name:
            issues.append(_issue(source, ("member_name",), "renders to an empty name", label))
            continue
        try:
            overrides["name"] = name
            member_spec = load_spec_text(text, template.filename, overrides=overrides)
        except SpecError as e:
            issues += [_member_issue(i, name, template, source) for i in e.errors]
            continue
        members.append(Member(index, name, params, member_spec))
    return members, issues


def _overrides(spec: FleetSpec, compiled: dict, context: dict) -> dict[str, Any]:
    out = dict(spec.set_)
    for key, value in spec.set_.items():
        if isinstance(value, str):
            out[key] = yaml.safe_load(compiled[f"set.{key}"].render(context))
    return out


def _render_issue(e: jinja2.TemplateError, member: str, template: _Template) -> SpecIssue:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == "<template>"]
    line = frames[-1].lineno if frames else None
    message = f"cannot render: {e.message or e}"
    if line is None:
        return MemberIssue(template.filename, None, None, "", message, member=member)
    mapped_line, mapped_column = _map(template, line, 1)
    return MemberIssue(template.filename, mapped_line, mapped_column, "", message, member=member)


def _member_issue(issue: SpecIssue, member: str, template: _Template, source: Source) -> SpecIssue:
    """A member's spec issue, placed in the template (or at its ``set`` override)."""
    fields = {k: getattr(issue, k) for k in ("path", "message", "suggestion", "fix")}
    if issue.line is None:
        key = next((k for k in source.data.get("set", {}) if issue.path.startswith(k)), None)
        if key is not None:
            line, column = source.positions[("set", key)].value
            fields["message"] = fields["message"].split(" (from override")[0]
            return MemberIssue(source.filename, line, column, member=member, **fields)
        return MemberIssue(issue.file, None, None, member=member, **fields)
    line, column = _map(template, issue.line, issue.column)
    return MemberIssue(template.filename, line, column, member=member, **fields)


def _duplicates(members: list[Member], source: Source) -> list[SpecIssue]:
    seen: dict[str, int] = {}
    issues = []
    for m in members:
        if m.name in seen:
            message = f"members #{seen[m.name]} and #{m.index} are both named '{m.name}'"
            issues.append(_issue(source, ("member_name",), message, m.name))
        seen.setdefault(m.name, m.index)
    return issues


def _base(spec: FleetSpec, compiled: dict, members: list[Member]) -> tuple[JobSpec, str]:
    """The spec rendered with ``params`` alone; else the first member (the template needs
    per-member parameters)."""
    context = {**spec.params, "fleet": spec.name, "index": 0}
    try:
        text = compiled["template"].render(context)
        overrides = {**_overrides(spec, compiled, context), "name": spec.name}
        return load_spec_text(text, "<base>", overrides=overrides), "base"
    except (jinja2.TemplateError, SpecError, yaml.YAMLError):
        return members[0].spec, f"member {members[0].name}"
