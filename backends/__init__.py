"""Backends: where a run's processes execute, found by name in a registry."""

from __future__ import annotations

from .base import Backend, Rendered, RunContext
from .local import LocalBackend

_REGISTRY: dict[str, type] = {"local": LocalBackend}


def get_backend(name: str) -> Backend:
    """The backend called ``name``; the error lists the valid names."""
    try:
        return _REGISTRY[name]()
    except KeyError:
        valid = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown backend {name!r}: valid backends are {valid}") from None


__all__ = ["Backend", "Rendered", "RunContext", "get_backend"]
