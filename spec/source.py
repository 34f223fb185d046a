"""The YAML source of a spec: its data plus the file position of every key and value.

PyYAML's composer keeps a mark on every node; building the Python data from the node
tree ourselves (instead of ``yaml.safe_load``) lets us remember where each key path came
from, and catch what ``safe_load`` silently accepts: duplicate keys and non-name keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .errors import SpecIssue, dotted

Path = tuple[str | int, ...]
MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class Position:
    """1-based (line, column) of a key and of its value; for list items both are the item."""

    key: tuple[int, int]
    value: tuple[int, int]


@dataclass
class Source:
    """Parsed YAML: the data, where each path is, and the problems found while parsing."""

    filename: str
    data: Any = None
    positions: dict[Path, Position] = field(default_factory=dict)
    issues: list[SpecIssue] = field(default_factory=list)

    def issue(self, node: Node, path: Path, message: str, fix: str | None = None) -> None:
        """Record a problem at ``node``."""
        line, column = _mark(node)
        self.issues.append(SpecIssue(self.filename, line, column, dotted(path), message, fix=fix))


def parse_yaml(text: str, filename: str) -> Source:
    """Parse ``text``; syntax errors, duplicate keys and odd keys become ``issues``."""
    source = Source(filename)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        source.issues.append(_syntax_issue(err, filename))
        return source
    except yaml.YAMLError as err:  # reader errors (e.g. control characters) carry no mark
        source.issues.append(SpecIssue(filename, None, None, "", f"YAML error: {err}"))
        return source
    if root is None:
        source.data = {}
        source.positions[()] = Position((1, 1), (1, 1))
        return source
    source.positions[()] = Position(_mark(root), _mark(root))
    source.data = _Builder(source).build(root, ())
    return source


def _syntax_issue(err: yaml.MarkedYAMLError, filename: str) -> SpecIssue:
    mark = err.problem_mark or err.context_mark
    what = " ".join(part for part in (err.context, err.problem) if part)
    line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
    return SpecIssue(filename, line, column, "", f"YAML syntax error: {what}")


def _mark(node: Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


class _Builder:
    """Turns composed nodes into Python data, recording positions and problems."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.constructor = SafeConstructor()
        self.active: set[int] = set()  # nodes being built, to stop recursive aliases
        self.checked: set[int] = set()  # mappings already checked for duplicates

    def build(self, node: Node, path: Path) -> Any:
        if id(node) in self.active:
            self.source.issue(node, path, "recursive YAML alias")
            return None
        self.active.add(id(node))
        try:
            if isinstance(node, MappingNode):
                return self._mapping(node, path)
            if isinstance(node, SequenceNode):
                return self._sequence(node, path)
            return self._scalar(node, path)
        finally:
            self.active.discard(id(node))

    def _scalar(self, node: Node, path: Path) -> Any:
        try:
            return self.constructor.construct_object(node, deep=True)
        except ConstructorError as err:
            self.source.issue(node, path, f"cannot read value: {err.problem}")
            return None

    def _sequence(self, node: SequenceNode, path: Path) -> list[Any]:
        items = []
        for index, item in enumerate(node.value):
            self.source.positions[(*path, index)] = Position(_mark(item), _mark(item))
            items.append(self.build(item, (*path, index)))
        return items

    def _mapping(self, node: MappingNode, path: Path) -> dict[str, Any]:
        self._check_duplicates(node, path)
        try:
            self.constructor.flatten_mapping(node)  # resolves `<<: *anchor` merge keys
        except ConstructorError as err:
            self.source.issue(node, path, f"cannot merge mapping: {err.problem}")
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:  # left only when merging failed, reported above
                continue
            if not isinstance(key_node, ScalarNode):
                self.source.issue(key_node, path, "mapping keys must be plain names")
                continue
            key = str(key_node.value)  # the text as written: `on:` stays "on", not True
            self.source.positions[(*path, key)] = Position(_mark(key_node), _mark(value_node))
            result[key] = self.build(value_node, (*path, key))
        return result

    def _check_duplicates(self, node: MappingNode, path: Path) -> None:
        if id(node) in self.checked:
            return
        self.checked.add(id(node))
        first_line: dict[str, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == MERGE_TAG:
                continue
            key = str(key_node.value)
            if key in first_line:
                self.source.issue(
                    key_node,
                    (*path, key),
                    f"duplicate key '{key}' (first defined at line {first_line[key]})",
                    fix="remove one of them; YAML would silently keep only the last",
                )
            else:
                first_line[key] = _mark(key_node)[0]
