"""The random state a recomputed forward replays, on every generator the stage uses.

A micro-batch whose forward runs without a graph and runs again in backward (Varuna's
recompute, ``recompute: all``, the shifted critical path, Mobius's swapped stages) must
draw the same dropout masks both times, or its gradients belong to another forward than
its loss. On a GPU those masks come from the device's generator, not the CPU's, so a
CPU-only capture replays the wrong masks there, silently. ``capture`` takes both (what
``torch.utils.checkpoint``'s ``preserve_rng_state`` does); ``replayed`` restores both
inside a fork, so the run's own streams go on as if the recompute had drawn nothing;
``isolated`` is that fork alone, for a forward whose draws must not count (a probe).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RngState:
    """The CPU generator's state and, on an accelerator, that device's."""

    cpu: torch.Tensor
    device: torch.device | None = None  # the accelerator (with its index); None on a CPU
    device_state: torch.Tensor | None = None


def _indexed(device: torch.device) -> torch.device:
    """``device`` with its index (``cuda`` alone means the current one)."""
    if device.type == "cpu" or device.index is not None:
        return device
    module = torch.get_device_module(device.type)
    return torch.device(device.type, module.current_device())


def capture(device: torch.device) -> RngState:
    """The generators a forward on ``device`` draws from, as they are now."""
    if device.type == "cpu":
        return RngState(torch.get_rng_state())
    device = _indexed(device)
    module = torch.get_device_module(device.type)
    return RngState(torch.get_rng_state(), device, module.get_rng_state(device.index))


@contextlib.contextmanager
def isolated(device: torch.device) -> Iterator[None]:
    """Draws inside leave the CPU's and ``device``'s generators as they found them."""
    if device.type == "cpu":
        with torch.random.fork_rng(devices=[]):
            yield
        return
    device = _indexed(device)
    with torch.random.fork_rng(devices=[device.index], device_type=device.type):
        yield


@contextlib.contextmanager
def replayed(state: RngState) -> Iterator[None]:
    """Inside, every generator of ``state`` draws what it drew when captured."""
    with isolated(state.device or torch.device("cpu")):
        torch.set_rng_state(state.cpu)
        if state.device is not None:
            module = torch.get_device_module(state.device.type)
            module.set_rng_state(state.device_state, state.device.index)
        yield
