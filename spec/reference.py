"""The job spec reference page (docs/spec.md), rendered from the spec's pydantic models.

Every field of ``JobSpec`` and of the sections below it gets a row: its dotted YAML
path, its type as written in YAML (read from the model's JSON schema), its default, its
description (the field's ``description=``) and a one-line YAML example. Each section
gets a heading, its docstring, its alternative forms and an example block
(``reference_examples``). Regenerate the page with ``REGENERATE``; a unit test fails
while the page and the models differ.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Iterator
from functools import cache
from typing import Any, NamedTuple

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from .job import JobSpec
from .paths import section_model
from .reference_examples import FIELD_EXAMPLES, FORMS, MINIMAL, SECTION_EXAMPLES, Block

REGENERATE = "jobctl schema --markdown > docs/spec.md"
WIDTH = 88
NO_EXAMPLE = object()  # a field nothing gives an example for (null is a real value)


class Entry(NamedTuple):
    """One field: where it sits, the model declaring it and its JSON schema."""

    path: str  # dotted YAML path, e.g. hardware.slurm.partition
    key: str  # its YAML key (the alias where there is one)
    owner: type[BaseModel]
    info: FieldInfo
    section: type[BaseModel] | None  # the nested section model, for a section field
    schema: dict[str, Any]
    defs: dict[str, Any]


class Section(NamedTuple):
    """One model of the tree: its dotted path ('' for the root) and its fields."""

    path: str
    model: type[BaseModel]
    description: str  # the description of the field holding it
    entries: tuple[Entry, ...]


@cache
def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(by_alias=True)


def sections(root: type[BaseModel] = JobSpec) -> list[Section]:
    """Every section below ``root`` (itself first), depth first, fields as declared."""
    found: list[Section] = []

    def walk(path: str, model: type[BaseModel], description: str) -> None:
        schema = _schema(model)
        entries = []
        for name, info in model.model_fields.items():
            key = info.alias or name
            sub = f"{path}.{key}" if path else key
            props = schema["properties"][key]
            nested = section_model(info.annotation)
            entries.append(Entry(sub, key, model, info, nested, props, schema.get("$defs", {})))
        found.append(Section(path, model, description, tuple(entries)))
        for entry in entries:
            if entry.section is not None:
                walk(entry.path, entry.section, entry.info.description or "")

    walk("", root, "")
    return found


def entries(root: type[BaseModel] = JobSpec) -> Iterator[Entry]:
    """Every field below ``root``, sections included, in page order."""
    for section in sections(root):
        yield from section.entries


# ---- values as YAML ------------------------------------------------------------------


def flow(value: Any) -> str:
    """``value`` as one line of YAML (flow style), quoted only where YAML needs it."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16, sort_keys=False)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _default(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        return to_jsonable_python(info.default_factory())  # type: ignore[call-arg]
    return to_jsonable_python(info.default)


def example_value(entry: Entry) -> Any:
    """The value a leaf's example shows: the field's own ``examples``, a typical value
    from ``FIELD_EXAMPLES``, its default, or one its type implies (NO_EXAMPLE if none)."""
    extra = entry.info.json_schema_extra
    own = entry.info.examples or (extra.get("examples") if isinstance(extra, dict) else None)
    if own:
        return own[0]
    if entry.path in FIELD_EXAMPLES:
        return FIELD_EXAMPLES[entry.path]
    if not entry.info.is_required() and entry.info.default is not None:
        return _default(entry.info)
    return _implied(entry.schema)


def _implied(schema: dict[str, Any]) -> Any:
    """The simplest valid value of a schema: an enum's first, a bool's true, an int's
    minimum; NO_EXAMPLE where a type implies none (strings, lists, floats)."""
    for branch in schema.get("anyOf", []):
        if branch.get("type") != "null" and (value := _implied(branch)) is not NO_EXAMPLE:
            return value
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if schema.get("type") == "boolean":
        return True
    if schema.get("type") == "integer":
        return schema.get("minimum", 1)
    return NO_EXAMPLE


def example_line(entry: Entry) -> str | None:
    """A leaf's example as the YAML line a spec holds, e.g. ``layers: 12``."""
    value = example_value(entry)
    return None if value is NO_EXAMPLE else f"{entry.key}: {flow(value)}"


def section_example(section: Section) -> Block:
    """A section's example block: the curated one, else its leaves' defaults (which hold
    together, unlike their separate examples) and the required leaves' examples."""
    if section.path in SECTION_EXAMPLES:
        return SECTION_EXAMPLES[section.path]
    if not section.path:
        return Block(MINIMAL)
    leaves = [e for e in section.entries if e.section is None]
    values = {e.key: example_value(e) if e.info.is_required() else _default(e.info) for e in leaves}
    body: Any = {k: v for k, v in values.items() if v is not None and v is not NO_EXAMPLE}
    for part in reversed(section.path.split(".")):
        body = {part: body}
    return Block(yaml.safe_dump(body, sort_keys=False, default_flow_style=False))


# ---- types as YAML -------------------------------------------------------------------

_SCALARS = {"integer": "int", "number": "float", "string": "str", "boolean": "bool"}
_BOUNDS = (
    ("minimum", ">="),
    ("ge", ">="),
    ("exclusiveMinimum", ">"),
    ("gt", ">"),
    ("maximum", "<="),
    ("le", "<="),
    ("exclusiveMaximum", "<"),
    ("lt", "<"),
)


def type_text(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    """A field's JSON schema as a reader writes the value in YAML: ``int in [1, 64]``,
    ``'a' | 'b'``, ``list of str``, ``float > 0 or null``."""
    if "$ref" in schema:
        target = defs.get(schema["$ref"].rsplit("/", 1)[-1], {})
        return "section" if "properties" in target else type_text(target, defs)
    if "anyOf" in schema or "allOf" in schema:
        branches = schema.get("anyOf") or schema["allOf"]
        return " or ".join(type_text(b, defs) for b in branches)
    if "const" in schema:
        return _literal(schema["const"])
    if "enum" in schema:
        return " | ".join(_literal(v) for v in schema["enum"])
    kind = schema.get("type") or ("string" if "pattern" in schema else None)
    if kind == "array":
        return _array_text(schema, defs)
    if kind == "object":
        values = schema.get("additionalProperties")
        return f"mapping of str to {type_text(values, defs)}" if _typed(values) else "mapping"
    if schema.get("format") == "date-time":
        return "datetime (ISO 8601)"
    return _SCALARS.get(kind, "null" if kind == "null" else "any") + _bounds(schema)


def _literal(value: Any) -> str:
    # Quoted, so a reader sees a fixed string ('auto') apart from a type name (int).
    return f"'{value}'" if isinstance(value, str) else flow(value)


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else flow(value)


def _typed(values: Any) -> bool:
    """Whether ``additionalProperties`` says a type (``true`` or absent: any value)."""
    return isinstance(values, dict) and bool(values)


def _array_text(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    if "prefixItems" in schema:
        return "[" + ", ".join(type_text(s, defs) for s in schema["prefixItems"]) + "]"
    return "list of " + type_text(schema.get("items", {}), defs)


def _bounds(schema: dict[str, Any]) -> str:
    """``' in [1, 64]'``, ``' >= 0'``, ``' in (0, 1)'``: a number's limits."""
    found = [(sign, schema[key]) for key, sign in _BOUNDS if key in schema]
    if len(found) == 2 and found[0][0].startswith(">") and found[1][0].startswith("<"):
        (low_sign, low), (high_sign, high) = found
        left, right = "[" if low_sign == ">=" else "(", "]" if high_sign == "<=" else ")"
        return f" in {left}{_number(low)}, {_number(high)}{right}"
    return "".join(f" {sign} {_number(value)}" for sign, value in found)


# ---- the page ------------------------------------------------------------------------


def anchor(path: str) -> str:
    """GitHub's anchor of the heading of the section at ``path``."""
    return re.sub(r"[^a-z0-9 _-]", "", f"`{path}`".lower()).replace(" ", "-") or "top-level"


def _wrap(text: str) -> str:
    return textwrap.fill(
        " ".join(text.split()), WIDTH, break_long_words=False, break_on_hyphens=False
    )


def _cell(text: str) -> str:
    # A pipe ends a table cell, inside code spans too, unless escaped (GFM).
    return " ".join(text.split()).replace("|", "\\|")


def _prose(text: str) -> str:
    """A docstring's or description's text as Markdown shows it verbatim: outside its
    code spans, ``<run dir>`` would be an HTML tag and ``*.safetensors`` emphasis."""
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):  # the even parts lie outside the code spans
        part = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace("*", "\\*")
        parts[i] = re.sub(r"(?<!\w)_|_(?!\w)", r"\\_", part)
    return "".join(parts)


def _code(text: str) -> str:
    return f"`{text}`"


def _field_type(entry: Entry) -> str:
    if entry.section is None:
        text = type_text(entry.schema, entry.defs)
        # A null default is accepted even where the schema types only the filled-in value
        # (hardware.rendezvous_host: null picks the address).
        nullable = entry.info.default is None and not entry.info.is_required()
        return _code(text + (" or null" if nullable and "null" not in text else ""))
    link = f"section [`{entry.path}`](#{anchor(entry.path)})"
    return link + (" or `null`" if "anyOf" in entry.schema else "")


def _default_text(entry: Entry) -> str:
    if entry.info.is_required():
        return "**required**"
    if entry.section is not None and entry.info.default_factory is not None:
        return "its fields' defaults"
    return _code(flow(_default(entry.info)))


def _row(entry: Entry) -> str:
    if entry.section is None:
        line = example_line(entry)
        example = _code(line) if line else "—"
    else:
        example = f"[below](#{anchor(entry.path)})"
    cells = (
        _code(entry.path),
        _field_type(entry),
        _default_text(entry),
        example,
        _prose(entry.info.description or ""),
    )
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _table(section: Section) -> list[str]:
    head = ["| Field | Type | Default | Example | Description |", "|---|---|---|---|---|"]
    return head + [_row(e) for e in section.entries]


def _yaml_block(text: str) -> list[str]:
    return ["```yaml", text.rstrip("\n"), "```"]


def _doc(model: type[BaseModel]) -> str:
    doc = model.__dict__.get("__doc__") or ""
    return inspect.cleandoc(doc).replace("``", "`")


def _forms(section: Section) -> list[str]:
    forms = FORMS.get(section.path, ())
    if not forms:
        return []
    lines = [_wrap(f"**Forms.** `{section.path}` takes one of {len(forms)} shapes:"), ""]
    for form in forms:
        lines += [_wrap(f"*{form.title}.* {form.text}"), "", *_yaml_block(form.yaml), ""]
    return lines


def _section_lines(section: Section) -> list[str]:
    depth = section.path.count(".") + 1 if section.path else 1
    title = _code(section.path) if section.path else "Top level"
    # The docstring: the holding field's description is in the parent's table already.
    about = _prose(_doc(section.model) or section.description)
    block = section_example(section)
    source = f" (from `{block.source}`)" if block.source else ""
    lines = [f"{'#' * (depth + 1)} {title}", "", _wrap(about), "", *_forms(section)]
    lines += [f"**Example**{source}:", "", *_yaml_block(block.yaml), ""]
    return lines + _table(section) + [""]


def _contents(found: list[Section]) -> list[str]:
    lines = ["## Contents", ""]
    for section in found:
        depth = section.path.count(".") + 1 if section.path else 0
        title = _code(section.path) if section.path else "Top level"
        indent = "  " * max(depth - 1, 0)
        lines.append(f"{indent}- [{title}](#{anchor(section.path)})")
    return [*lines, ""]


INTRO = (
    "A job spec is one YAML file. `name`, `model` and `training` are required; every other "
    "section may be left out, and its fields then take the defaults below. `jobctl validate "
    "JOB.yaml` checks a spec (every problem at once, with its line); `jobctl schema` prints "
    "the same models as JSON schema."
)
TYPES = (
    "Types read as the value is written in YAML: `str`, `int`, `float`, `bool`, `list of "
    "X`, `mapping` (any keys), `'a' | 'b'` (one of these strings), `null` (write `null` or "
    "leave the key out), with limits such as `int in [1, 64]` or `float > 0`. A *section* is "
    "a nested mapping with a heading of its own; its dotted path (`hardware.slurm`) names "
    "where it sits."
)


def render(root: type[BaseModel] = JobSpec) -> str:
    """The Markdown reference of every field of ``root`` (``JobSpec``): docs/spec.md."""
    found = sections(root)
    fields = sum(len(s.entries) for s in found)
    lines = [
        "# Job spec reference",
        "",
        f"<!-- Generated by `{REGENERATE}`; do not edit. -->",
        "",
        _wrap(
            f"Generated by `{REGENERATE}` from the pydantic models in `spec/` "
            f"({len(found)} sections, {fields} fields); do not edit it by hand. "
            "`tests/unit/test_spec_reference.py` fails until it is regenerated."
        ),
        "",
        _wrap(INTRO),
        "",
        _wrap(TYPES),
        "",
        *_contents(found),
    ]
    for section in found:
        lines += _section_lines(section)
    return "\n".join(lines).rstrip("\n") + "\n"
