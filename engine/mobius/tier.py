"""The memory tier below the device, where a Mobius stage lives between its runs.

``FileTier`` (a CPU device): one record file per stage and one activation file per
step under the run's folder, read and written with ``preadv``/``pwrite`` (which drop
the GIL) on one I/O thread, so a prefetch overlaps the training thread's compute.
``PinnedTier`` (CUDA): records in pinned host memory, copied on a high-priority copy
stream (Mobius sec. 3.3: the stage that runs first gets the higher priority; one
device here, so one stream). Both count the bytes they move by kind and direction
(``Traffic``), the quantity Mobius eq. (1) predicts. Every operation returns a
handle whose ``result()`` waits for it (a future or a stream event); requests run in
the order given, so a write from a buffer finishes before a later read into it.
"""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from jobctl.engine.mobius.layout import StageLayout

#: Byte ranges ``(start, length)`` of a record.
Ranges = list[tuple[int, int]]


@dataclass
class Traffic:
    """Bytes moved between the device and the tier: ``(kind, "up" | "down") -> bytes``;
    kinds: params, grads, optim (optimizer slots), acts (activations), ties."""

    moved: Counter = field(default_factory=Counter)

    def add(self, kind: str, direction: str, nbytes: int) -> None:
        self.moved[(kind, direction)] += nbytes

    def total(self, kinds: tuple[str, ...] | None = None) -> int:
        return sum(v for (k, _), v in self.moved.items() if kinds is None or k in kinds)

    def reset(self) -> None:
        self.moved.clear()


def _bytes(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's bytes as a writable buffer (no copy)."""
    return t.detach().reshape(-1).numpy().view(np.uint8)


class FileTier:
    """Stage records and offloaded activations in files under ``folder``."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.traffic = Traffic()
        self.io = ThreadPoolExecutor(1, thread_name_prefix="mobius-io")
        self.fds: dict[int, int] = {}
        self.writes: list[Future] = []  # checked by drain: a failed write must not pass
        self.act_fd = os.open(self.folder / "activations.bin", os.O_RDWR | os.O_CREAT, 0o600)
        self.acts: dict[tuple[int, int], tuple[int, tuple, torch.dtype]] = {}
        self.act_end = 0

    def close(self) -> None:
        self.io.shutdown(wait=True)
        for fd in [*self.fds.values(), self.act_fd]:
            os.close(fd)
        self.fds = {}

    def add(self, j: int, lay: StageLayout) -> None:
        """Stage ``j``'s record, zero-filled (fresh gradients and optimizer slots)."""
        fd = os.open(self.folder / f"stage-{j:04d}.bin", os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, 0)  # a folder reused: nothing of an earlier run survives
        os.ftruncate(fd, lay.nbytes)
        self.fds[j] = fd

    def drain(self) -> None:
        """Wait until every request issued so far has finished; raises the error of any
        write that failed (nobody else waits for a write)."""
        self.io.submit(lambda: None).result()
        writes, self.writes = self.writes, []
        for done in writes:
            done.result()

    def after(self, fn) -> Future:
        """Run ``fn`` on the I/O thread once the requests issued so far are done (the
        optimizer update of a stage just read: off the training thread)."""
        return self.io.submit(fn)

    def load(self, j: int, dst: torch.Tensor, ranges: Ranges, kind: list[str]) -> Future:
        """Read ``ranges`` of stage ``j``'s record into the same bytes of ``dst``."""
        return self.io.submit(self._move, self.fds[j], dst, ranges, kind, "up")

    def store(self, j: int, src: torch.Tensor, ranges: Ranges, kind: list[str]) -> Future:
        """Write ``ranges`` of ``src`` into stage ``j``'s record."""
        done = self.io.submit(self._move, self.fds[j], src, ranges, kind, "down")
        self.writes.append(done)
        return done

    def _move(self, fd: int, buf: torch.Tensor, ranges: Ranges, kinds, direction) -> None:
        view = _bytes(buf)
        for (start, length), kind in zip(ranges, kinds, strict=True):
            _transfer(fd, view[start : start + length], start, direction == "up")
            self.traffic.add(kind, direction, length)

    def put_act(self, key: tuple[int, int], t: torch.Tensor) -> Future:
        """Offload activation ``key`` = (stage, micro-batch) to the step's file."""
        t = t.detach().contiguous()
        offset, self.act_end = self.act_end, self.act_end + t.numel() * t.element_size()
        self.acts[key] = (offset, tuple(t.shape), t.dtype)
        done = self.io.submit(self._put, t, offset)
        self.writes.append(done)
        return done

    def _put(self, t: torch.Tensor, offset: int) -> None:
        _transfer(self.act_fd, _bytes(t), offset, read=False)
        self.traffic.add("acts", "down", t.numel() * t.element_size())

    def get_act(self, key: tuple[int, int]) -> Future:
        """Upload activation ``key``; the handle's result is the tensor."""
        offset, shape, dtype = self.acts.pop(key)
        return self.io.submit(self._get, offset, shape, dtype)

    def _get(self, offset: int, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype)
        _transfer(self.act_fd, _bytes(t), offset, read=True)
        self.traffic.add("acts", "up", t.numel() * t.element_size())
        return t

    def new_step(self) -> None:
        """Activations are the step's own: the file is reused from its start."""
        self.act_end = 0

    def read_span(self, j: int, start: int, out: torch.Tensor) -> None:
        """Read ``out``'s bytes from stage ``j``'s record at ``start`` (synchronous)."""
        _transfer(self.fds[j], _bytes(out), start, read=True)
        self.traffic.add("ties", "up", out.numel() * out.element_size())

    def write_span(self, j: int, start: int, src: torch.Tensor) -> None:
        _transfer(self.fds[j], _bytes(src), start, read=False)
        self.traffic.add("ties", "down", src.numel() * src.element_size())


def _transfer(fd: int, view: np.ndarray, offset: int, read: bool) -> None:
    """All of ``view`` from or to ``fd`` at ``offset`` (system calls may do part)."""
    mv = memoryview(view)
    done = 0
    while done < len(mv):
        part = mv[done:]
        n = os.preadv(fd, [part], offset + done) if read else os.pwrite(fd, part, offset + done)
        if n <= 0:
            raise OSError(f"short {'read' if read else 'write'} at byte {offset + done}")
        done += n
