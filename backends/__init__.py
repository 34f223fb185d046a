"""Backends: where a run's processes execute, found by name in a registry."""

from __future__ import annotations

from .base import Backend, BackendError, NodeStatus, Released, Rendered, RunContext
from .by_hand import by_hand_command
from .kubernetes import KubernetesBackend
from .local import LocalBackend
from .slurm import SlurmBackend
from .ssh import SshBackend

_REGISTRY: dict[str, type] = {
    "local": LocalBackend,
    "slurm": SlurmBackend,
    "kubernetes": KubernetesBackend,
    "ssh": SshBackend,
}


def get_backend(name: str) -> Backend:
    """The backend called ``name``; the error lists the valid names."""
    try:
        return _REGISTRY[name]()
    except KeyError:
        valid = ", ".join(_REGISTRY)  # the default, local, first
        raise ValueError(f"unknown backend {name!r}: valid backends are {valid}") from None


__all__ = [
    "Backend",
    "BackendError",
    "NodeStatus",
    "Released",
    "Rendered",
    "RunContext",
    "by_hand_command",
    "get_backend",
]
