"""The several tensors that cross a cut, as one message tensor.

A boundary between subgraphs carries a pytree of values: hidden states, and common
nodes such as an attention mask (bool), position ids (int64) and rotary tables.
The pipeline's channels (gloo and shared memory) move one tensor per micro-batch,
so a ``Boundary`` packs the values into one *carrier*: the values that need a
gradient are flattened into it differentiably, and every other value is copied in
bit for bit (reinterpreted as the carrier's dtype, never converted), so an int64 or
bool crosses exactly. The receiver unpacks views; the gradient it sends back is the
carrier's, which is zero where the non-differentiable values sit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Slot:
    """One value in the carrier: its shape, dtype, and whether it is differentiable."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    grad: bool


@dataclass(frozen=True)
class Boundary:
    """The layout of one cut's carrier."""

    slots: tuple[Slot, ...]
    dtype: torch.dtype  # the carrier's dtype: that of the differentiable values

    def sizes(self) -> list[int]:
        """Carrier elements each slot takes (bit-copied slots padded to whole elements)."""
        width = _itemsize(self.dtype)
        out = []
        for s in self.slots:
            nbytes = _numel(s.shape) * _itemsize(s.dtype)
            out.append(_numel(s.shape) if s.grad else -(-nbytes // width))
        return out

    def numel(self) -> int:
        """Elements of the carrier tensor (per micro-batch)."""
        return sum(self.sizes())

    def nbytes(self) -> int:
        """Bytes the carrier moves per micro-batch."""
        return self.numel() * _itemsize(self.dtype)


def describe(values: list[torch.Tensor]) -> Boundary:
    """The boundary of ``values``; the carrier takes the first float value's dtype."""
    floats = [v.dtype for v in values if v.is_floating_point()]
    dtype = floats[0] if floats else torch.float32
    slots = tuple(
        Slot(tuple(v.shape), v.dtype, v.is_floating_point() and v.dtype == dtype) for v in values
    )
    return Boundary(slots, dtype)


def pack(b: Boundary, values: list[torch.Tensor]) -> torch.Tensor:
    """One carrier tensor holding ``values`` (differentiable where a slot is)."""
    parts = []
    for slot, size, v in zip(b.slots, b.sizes(), values, strict=True):
        if slot.grad:
            parts.append(v.reshape(-1))
        else:
            parts.append(_bits(v.detach(), b.dtype, size))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=b.dtype)


def unpack(b: Boundary, carrier: torch.Tensor) -> list[torch.Tensor]:
    """The values of a carrier, as views (differentiable slots keep the graph)."""
    out, start = [], 0
    for slot, size in zip(b.slots, b.sizes(), strict=True):
        piece = carrier[start : start + size]
        start += size
        if slot.grad:
            out.append(piece.view(slot.shape))
        else:
            raw = piece.detach().contiguous().view(torch.uint8)
            n = _numel(slot.shape) * _itemsize(slot.dtype)
            # A copy: the slot's offset in the carrier need not be aligned to its dtype.
            out.append(raw[:n].clone().view(slot.dtype).view(slot.shape))
    return out


DTYPES = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)


def encode(b: Boundary) -> list[int]:
    """The layout as integers (sent once, at start-up, to the receiving stage)."""
    out = [DTYPES.index(b.dtype), len(b.slots)]
    for s in b.slots:
        out += [DTYPES.index(s.dtype), int(s.grad), len(s.shape), *s.shape]
    return out


def decode(ints: list[int]) -> Boundary:
    """Counterpart of :func:`encode`."""
    dtype, count, k = DTYPES[ints[0]], ints[1], 2
    slots = []
    for _ in range(count):
        sdtype, grad, ndim = DTYPES[ints[k]], bool(ints[k + 1]), ints[k + 2]
        shape = tuple(ints[k + 3 : k + 3 + ndim])
        slots.append(Slot(shape, sdtype, grad))
        k += 3 + ndim
    return Boundary(tuple(slots), dtype)


def _bits(v: torch.Tensor, dtype: torch.dtype, size: int) -> torch.Tensor:
    raw = v.contiguous().reshape(-1).view(torch.uint8)
    pad = size * _itemsize(dtype) - raw.numel()
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    return raw.view(dtype)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
