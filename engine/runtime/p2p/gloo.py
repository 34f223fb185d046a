"""Point-to-point activation and gradient channels between neighbouring stages.

Receives are posted ahead of need (a bounded window), so a stage can ask whether a
gradient has already arrived without blocking: that is what Varuna's opportunistic
deviation needs (on gloo, whose receive handles cannot be polled, a thread waits on
them once a stage first asks). Messages are matched by tag (2i for the activation of micro-batch i,
2i+1 for its gradient); both directions carry micro-batches in increasing order, so
the order also matches on backends that ignore tags (NCCL).
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from datetime import timedelta

import torch
import torch.distributed as dist

from jobctl.engine.core.env import PG_TIMEOUT_S

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64]


def pg_timeout_s() -> float:
    """Seconds a collective or a receive may wait before its peer counts as hung
    (``JOBCTL_PG_TIMEOUT_S``, default 300): the process group's timeout, and the
    shared-memory channels' too."""
    return float(os.environ.get(PG_TIMEOUT_S, "300"))


def comm_device() -> torch.device:
    """Where small control tensors of a collective or send must live: the current GPU
    under NCCL (it moves device memory only), else the CPU (gloo)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def join_world(store, rank: int, world: int, device: str) -> None:
    """Join the run's default process group in ``store`` as ``rank`` of ``world``: NCCL
    for a CUDA plan, else gloo; the group and the store it meets in wait as long as
    ``pg_timeout_s`` lets them."""
    timeout = timedelta(seconds=pg_timeout_s())
    store.set_timeout(timeout)
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


def send_meta(t: torch.Tensor, dst: int) -> None:
    """Blocking send of a tensor's shape and dtype (startup shape propagation)."""
    meta = torch.zeros(8, dtype=torch.int64)
    meta[0], meta[1] = t.dim(), _DTYPES.index(t.dtype)
    meta[2 : 2 + t.dim()] = torch.tensor(t.shape)
    dist.send(meta.to(comm_device()), dst)


def recv_meta(src: int) -> tuple[tuple[int, ...], torch.dtype]:
    """Counterpart of :func:`send_meta`."""
    meta = torch.zeros(8, dtype=torch.int64, device=comm_device())
    dist.recv(meta, src)
    meta = meta.cpu()
    ndim = int(meta[0])
    return tuple(int(x) for x in meta[2 : 2 + ndim]), _DTYPES[int(meta[1])]


def send_value(t: torch.Tensor, dst: int) -> None:
    """Blocking send of a tensor whose shape and dtype the receiver knows (startup)."""
    dist.send(t.detach().contiguous().to(comm_device()), dst)


def recv_value(shape: tuple[int, ...], dtype: torch.dtype, src: int) -> torch.Tensor:
    """Counterpart of :func:`send_value` (on the CPU)."""
    out = torch.zeros(shape, dtype=dtype, device=comm_device())
    dist.recv(out, src)
    return out.cpu()


def send_ints(values: list[int], dst: int) -> None:
    """Blocking send of a list of integers (its length first)."""
    dist.send(torch.tensor([len(values)], dtype=torch.int64).to(comm_device()), dst)
    dist.send(torch.tensor(values, dtype=torch.int64).to(comm_device()), dst)


def recv_ints(src: int) -> list[int]:
    """Counterpart of :func:`send_ints`."""
    n = torch.zeros(1, dtype=torch.int64, device=comm_device())
    dist.recv(n, src)
    out = torch.zeros(int(n.item()), dtype=torch.int64, device=comm_device())
    dist.recv(out, src)
    return [int(v) for v in out.cpu()]


class _Watcher:
    """Waits, in a thread, on receives in the order they were posted.

    Gloo's receive handles never report completion to ``is_completed()`` (only
    ``wait()`` does, and a ``wait`` with a timeout that expires closes the connection),
    so "has it arrived?" needs a thread that waits; each arrival sets an event. Once a
    watcher exists it is the only waiter of the works it was given.
    """

    def __init__(self) -> None:
        self.events: dict[int, threading.Event] = {}
        self.errors: dict[int, BaseException] = {}
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, daemon=True, name="jobctl-inbox").start()

    def watch(self, i: int, work) -> None:
        self.events[i] = threading.Event()
        self.queue.put((i, work, self.events[i]))

    def close(self) -> None:
        self.queue.put(None)

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            i, work, arrived = item
            try:
                work.wait()
            except BaseException as e:  # handed to the taker, who re-raises it
                self.errors[i] = e
            arrived.set()

    def wait(self, i: int) -> None:
        self.events.pop(i).wait()
        if i in self.errors:
            raise self.errors.pop(i)


class Inbox:
    """Pre-posted receives of one kind (activations or gradients) from one peer."""

    def __init__(self, peer: int, shape, dtype, device, parity: int, order: list[int], window: int):
        self.peer, self.shape, self.dtype, self.device = peer, shape, dtype, device
        self.parity = parity
        self.todo = deque(order)
        self.window = max(1, window)
        self.posted: dict[int, tuple[torch.Tensor, object]] = {}
        self.watcher: _Watcher | None = None  # started by the first ready() on gloo
        self._fill()

    def _fill(self) -> None:
        while self.todo and len(self.posted) < self.window:
            i = self.todo.popleft()
            buf = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            work = dist.irecv(buf, self.peer, tag=2 * i + self.parity)
            self.posted[i] = (buf, work)
            if self.watcher is not None:
                self.watcher.watch(i, work)
        if self.watcher is not None and not self.todo:
            self.watcher.close()

    def ready(self, i: int) -> bool:
        """Has micro-batch ``i`` arrived (never blocks)?"""
        entry = self.posted.get(i)
        if entry is None:
            return False
        if dist.get_backend() != "gloo":
            return entry[1].is_completed()
        if self.watcher is None:
            self.watcher = _Watcher()
            for j, (_, work) in self.posted.items():
                self.watcher.watch(j, work)
            if not self.todo:
                self.watcher.close()
        return self.watcher.events[i].is_set()

    def take(self, i: int) -> torch.Tensor:
        """Wait for micro-batch ``i`` and return it."""
        if i not in self.posted:
            raise RuntimeError(
                f"micro-batch {i} received out of order (posted: {list(self.posted)})"
            )
        buf, work = self.posted.pop(i)
        if self.watcher is not None:
            self.watcher.wait(i)
        else:
            work.wait()
        self._fill()
        return buf


class Outbox:
    """Asynchronous sends to one peer; completed sends are released as we go."""

    def __init__(self, peer: int, parity: int, max_inflight: int = 8):
        self.peer, self.parity, self.max_inflight = peer, parity, max_inflight
        self.inflight: deque = deque()

    def send(self, i: int, t: torch.Tensor) -> None:
        t = t.contiguous()
        self.inflight.append((t, dist.isend(t, self.peer, tag=2 * i + self.parity)))
        while self.inflight and (
            self.inflight[0][1].is_completed() or len(self.inflight) > self.max_inflight
        ):
            self.inflight.popleft()[1].wait()

    def drain(self) -> None:
        while self.inflight:
            self.inflight.popleft()[1].wait()
