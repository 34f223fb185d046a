"""Key paths through the spec model tree: which keys a section accepts, where a key lives."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from functools import cache

from pydantic import BaseModel

from .job import JobSpec

Path = tuple[str | int, ...]


def section_model(annotation: object) -> type[BaseModel] | None:
    """The spec model inside a field annotation (``X``, ``X | None``, ``Annotated[X, ...]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        model = section_model(arg)
        if model is not None:
            return model
    return None


def is_free_mapping(annotation: object) -> bool:
    """Whether a field holds a free-form mapping (any keys allowed), like ``import_args``."""
    return typing.get_origin(annotation) is dict


def keys_of(model: type[BaseModel]) -> dict[str, str]:
    """YAML key (the alias where there is one) to field name, for one section."""
    return {info.alias or name: name for name, info in model.model_fields.items()}


def yaml_key(model: type[BaseModel], key: str) -> str | None:
    """The YAML spelling of ``key`` (a YAML key or a field name) in ``model``, or None."""
    for alias, name in keys_of(model).items():
        if key in (alias, name):
            return alias
    return None


def model_at(path: Path) -> type[BaseModel] | None:
    """The section model at ``path`` below JobSpec, or None if the path is not a section."""
    model: type[BaseModel] | None = JobSpec
    for part in path:
        if model is None or not isinstance(part, str):
            return None
        key = yaml_key(model, part)
        if key is None:
            return None
        model = section_model(model.model_fields[keys_of(model)[key]].annotation)
    return model


@cache
def _sections() -> tuple[tuple[Path, type[BaseModel]], ...]:
    found: list[tuple[Path, type[BaseModel]]] = []

    def walk(path: Path, model: type[BaseModel]) -> None:
        found.append((path, model))
        for key, name in keys_of(model).items():
            child = section_model(model.model_fields[name].annotation)
            if child is not None:
                walk((*path, key), child)

    walk((), JobSpec)
    return tuple(found)


def sections_with_key(key: str) -> Iterator[Path]:
    """Paths of every section that accepts ``key``, e.g. ``steps`` -> ``("training",)``."""
    for path, model in _sections():
        if key in keys_of(model):
            yield path
