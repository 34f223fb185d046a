"""The YAML source of a spec: its data plus the file position of every key and value.

PyYAML's composer keeps a mark on every node; building the Python data from the node
tree ourselves (instead of ``yaml.safe_load``) lets us remember where each key path came
from, and catch what ``safe_load`` silently accepts: duplicate keys and non-name keys.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .errors import SpecIssue, dotted

Path = tuple[str | int, ...]
MERGE_TAG = "tag:yaml.org,2002:merge"
# A job spec is a page of YAML; these bounds stop a hostile file (an alias bomb, 500
# nested brackets, 13M list items) from taking the memory, stack or minutes of `validate`.
MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_VALUES = 10_000
LIMIT_FIX = "a job spec is a page of YAML: write the values out plainly, without deep nesting"


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
    if len(text) > MAX_BYTES:
        line, column = line_column(text, MAX_BYTES)
        message = f"the file is longer than {MAX_BYTES} characters"
        source.issues.append(SpecIssue(filename, line, column, "", message, fix=LIMIT_FIX))
        return source
    try:
        root = _BoundedLoader(text).get_single_node()
    except _LimitError as err:
        line, column = err.problem_mark.line + 1, err.problem_mark.column + 1
        source.issues.append(SpecIssue(filename, line, column, "", err.problem, fix=LIMIT_FIX))
        return source
    except yaml.MarkedYAMLError as err:
        source.issues.append(_syntax_issue(err, filename))
        return source
    except yaml.reader.ReaderError as err:  # control characters: a character offset
        source.issues.append(_reader_issue(err, text, filename))
        return source
    if root is None:
        source.data = {}
        source.positions[()] = Position((1, 1), (1, 1))
        return source
    source.positions[()] = Position(_mark(root), _mark(root))
    try:
        source.data = _Builder(source).build(root, ())
    except RecursionError:  # a chain of merges the bounds above did not foresee
        source.issues.append(SpecIssue(filename, 1, 1, "", "YAML nested too deep", fix=LIMIT_FIX))
    return source


def _syntax_issue(err: yaml.MarkedYAMLError, filename: str) -> SpecIssue:
    mark = err.problem_mark or err.context_mark
    what = " ".join(part for part in (err.context, err.problem) if part)
    line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
    return SpecIssue(filename, line, column, "", f"YAML syntax error: {what}")


def _reader_issue(err: yaml.reader.ReaderError, text: str, filename: str) -> SpecIssue:
    line, column = line_column(text, err.position)
    code = err.character if isinstance(err.character, int) else ord(err.character)
    message = f"YAML cannot hold the control character #x{code:02x} ({err.reason})"
    fix = "remove it, or write it as an escape such as \\x07 inside double quotes"
    return SpecIssue(filename, line, column, "", message, fix=fix)


def line_column(text: str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of character ``offset`` in ``text``."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


class _LimitError(ComposerError):
    """The YAML is nested too deep or holds too many values (``problem`` says which)."""


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader with nesting and size bounds checked while nodes are composed."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.nodes = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self.depth += 1
        self.nodes += 1
        try:
            if self.depth > MAX_DEPTH or self.nodes > MAX_VALUES:
                raise _LimitError(None, None, _too_much(self.depth), self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _too_much(depth: int) -> str:
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    return f"more than {MAX_VALUES} values"


def _mark(node: Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


class _Builder:
    """Turns composed nodes into Python data, recording positions and problems."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.constructor = SafeConstructor()
        self.active: set[int] = set()  # nodes being built, to stop recursive aliases
        self.checked: set[int] = set()  # mappings already checked for duplicates
        self.sizes: dict[int, int] = {}  # entries of each mapping once merged
        self.built = 0  # values built, each alias counted again: an alias bomb's size

    def build(self, node: Node, path: Path) -> Any:
        if id(node) in self.active:
            self.source.issue(node, path, "recursive YAML alias")
            return None
        self.built += 1
        if self.built > MAX_VALUES or len(path) > MAX_DEPTH:
            if self.built == MAX_VALUES + 1 or len(path) == MAX_DEPTH + 1:
                problem = f"{_too_much(len(path))} once its aliases are expanded"
                self.source.issue(node, path, problem, fix=LIMIT_FIX)
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
        except ValueError:  # an int past Python's digit limit for str -> int (#46 item 3)
            limit = sys.get_int_max_str_digits()
            problem = f"cannot read value: a number of {len(node.value)} characters is too long"
            self.source.issue(node, path, problem, fix=f"write a number of at most {limit} digits")
            return None

    def _sequence(self, node: SequenceNode, path: Path) -> list[Any]:
        items = []
        for index, item in enumerate(node.value):
            self.source.positions[(*path, index)] = Position(_mark(item), _mark(item))
            items.append(self.build(item, (*path, index)))
        return items

    def _mapping(self, node: MappingNode, path: Path) -> dict[str, Any]:
        self._check_duplicates(node, path)
        if self._merged_size(node, 0) > MAX_VALUES:
            problem = f"more than {MAX_VALUES} values once its `<<` merges are expanded"
            self.source.issue(node, path, problem, fix=LIMIT_FIX)
            return {}
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

    def _merged_size(self, node: MappingNode, depth: int) -> int:
        """Entries of ``node`` once merged, counted before PyYAML copies them (a chain of
        merges deeper than MAX_DEPTH counts as too many: PyYAML merges recursively)."""
        if depth > MAX_DEPTH:
            return MAX_VALUES + 1
        if id(node) not in self.sizes:
            self.sizes[id(node)] = 0  # a merge cycle adds nothing; PyYAML reports it
            size = 0
            for key_node, value_node in node.value:
                if key_node.tag != MERGE_TAG:
                    size += 1
                    continue
                merged = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
                subs = [m for m in merged if isinstance(m, MappingNode)]
                size += sum(self._merged_size(m, depth + 1) for m in subs)
            self.sizes[id(node)] = size
        return self.sizes[id(node)]

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
