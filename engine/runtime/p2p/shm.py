"""Shared-memory point-to-point channels between pipeline neighbours on one machine.

Gloo moves every activation and gradient through a loopback TCP socket: the sender's
``isend`` copies the tensor through the kernel's TCP stack in its own thread (0.1-0.4 ms
for a 36 KB activation on this 2-core machine) and the receiver's gloo thread copies it
out again, on the cores the stages compute on. Between two ranks of one node (CPU
devices) the pair instead shares a ring of slots in ``/dev/shm``: a send copies the
tensor into the next free slot and writes one byte to a FIFO; a receive waits on that
FIFO, copies the slot out and gives it back through a second FIFO. A message costs two
memory copies and two one-byte pipe writes.

Messages of one channel arrive in the order they were sent, which is the order the
executor takes them (both directions carry micro-batches in increasing order, and an
opportunistic forward is always the next forward). A peer that dies closes its FIFO
ends, so a waiting rank reads end-of-file and fails as it would on gloo's reset
connection; a peer that hangs is given up after the process group's timeout.

Set-up is pairwise over the process group (``connect``): the lower rank decides (one
machine per the plan, CPU, ``/dev/shm`` with room for both rings, not turned off with
``JOBCTL_P2P=gloo``), creates the files, and the two exchange their names and
readiness with small gloo messages; once both have opened everything, the names are
unlinked, so nothing is left in ``/dev/shm`` even if a process is killed later.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import shutil
import time
import uuid
from collections import deque

import torch
import torch.distributed as dist

from jobctl.engine.core.env import P2P

SHM_DIR = "/dev/shm"
SLOTS = 8  # the fewest slots a ring has
MAX_SHARE = 0.25  # of /dev/shm's free space the two rings of a pair may take
_NAME = 96  # bytes of the name message
# How long a rank with a core of its own polls for a message before it sleeps: a rank
# woken from select waits for the kernel (and, on a VM, the host) to run it again,
# 60-75 us a hop on this host's ping-pong, on the pipeline's critical path for every
# message (2M of them per step); a message that lands within the poll is read at once.
SPIN_S = 0.002


class PeerGone(RuntimeError):
    """The other end of a shared-memory channel exited or stopped answering."""


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _wait_readable(fd: int, timeout_s: float, what: str) -> None:
    ready, _, _ = select.select([fd], [], [], timeout_s)
    if not ready:
        raise PeerGone(f"no {what} within {timeout_s:.0f} s (the peer hangs)")


class Ring:
    """One direction of a pair: ``slots`` tensors in shared memory, a FIFO saying a slot
    was filled and a FIFO giving slots back. The FIFO's write and read are system calls,
    which order the slot's copy before the receiver reads it."""

    def __init__(self, path: str, shape, dtype, slots: int, sender: bool, timeout_s: float):
        self.shape, self.sender, self.timeout_s = tuple(shape), sender, timeout_s
        self.n = slots
        numel = math.prod(self.shape)
        self.slots = torch.from_file(path + ".data", shared=True, size=slots * numel, dtype=dtype)
        self.slots = self.slots.view(slots, *self.shape)
        self.path = path
        self.spin_s = 0.0  # polling before a blocking wait (``spin_budget``)
        self.seq = 0  # messages sent (sender) or taken (receiver)
        self.credits = slots  # sender: free slots
        self.arrived = 0  # receiver: notifications read, not yet taken
        # Read ends first (non-blocking: no writer may exist yet); write ends in ``open_writer``.
        self.rfd = os.open(path + (".acks" if sender else ".fills"), os.O_RDONLY | os.O_NONBLOCK)
        self.wfd: int | None = None

    def open_writer(self) -> None:
        """Open the write end (the peer's read end is open by now)."""
        name = self.path + (".fills" if self.sender else ".acks")
        self.wfd = os.open(name, os.O_WRONLY | os.O_NONBLOCK)
        os.set_blocking(self.wfd, True)

    def _read(self, block: bool, what: str) -> int:
        """Notifications available now (waiting for at least one if ``block``: polled
        for ``spin_s``, then asleep in select)."""
        poll_until = time.perf_counter() + self.spin_s if block and self.spin_s else 0.0
        while True:
            try:
                got = os.read(self.rfd, 4096)
            except BlockingIOError:
                if not block:
                    return 0
                if poll_until and time.perf_counter() < poll_until:
                    continue
                _wait_readable(self.rfd, self.timeout_s, what)
                continue
            if not got:
                raise PeerGone(f"the peer closed its end of {what}")
            return len(got)

    def send(self, t: torch.Tensor) -> None:
        self.credits += self._read(False, "slot returns")
        while self.credits == 0:
            self.credits += self._read(True, "a free slot")
        self.slots[self.seq % self.n].copy_(t)
        self.seq += 1
        self.credits -= 1
        try:
            os.write(self.wfd, b"\0")
        except BrokenPipeError as e:
            raise PeerGone("the receiver closed its end before taking a message") from e

    def ready(self) -> bool:
        """Has the next message arrived (never blocks)?"""
        if self.arrived == 0:
            self.arrived += self._read(False, "a message")
        return self.arrived > 0

    def take(self) -> torch.Tensor:
        while self.arrived == 0:
            self.arrived += self._read(True, "a message")
        out = self.slots[self.seq % self.n].clone()
        self.seq += 1
        self.arrived -= 1
        # Give the slot back. A sender that has already finished (its last message sent,
        # its end closed) needs no slot: the message was taken whole, so that is no error.
        with contextlib.suppress(BrokenPipeError):
            os.write(self.wfd, b"\0")
        return out

    def close(self) -> None:
        for fd in (self.rfd, self.wfd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.rfd = self.wfd = None


class ShmLink:
    """Both directions between this rank and one neighbour: ``out`` sends, ``into``
    receives."""

    def __init__(self, out: Ring, into: Ring):
        self.out, self.into = out, into

    def close(self) -> None:
        self.out.close()
        self.into.close()

    def poll_for(self, seconds: float) -> None:
        """Poll ``seconds`` for a message or a free slot before sleeping (see SPIN_S)."""
        self.out.spin_s = self.into.spin_s = seconds


def poll_where_cores_allow(links: dict, local_ranks: int) -> None:
    """Let ``links`` poll before sleeping where every one of this machine's
    ``local_ranks`` ranks has its cores (``spin_budget``): the trainer, the
    calibration's probes and the (M, N) profile alike, so what is timed is what runs."""
    spin = spin_budget(local_ranks, torch.get_num_threads())
    for link in (x for x in links.values() if x is not None):
        link.poll_for(spin)


def spin_budget(local_ranks: int, threads: int) -> float:
    """``SPIN_S`` where every rank on this machine has cores of its own, else 0: a rank
    polling on a shared core would take it from the rank it waits for."""
    return SPIN_S if local_ranks * threads <= len(os.sched_getaffinity(0)) else 0.0


def ring_slots(messages_per_step: int) -> int:
    """Slots per ring: two steps' messages. Neighbours are never more than a step apart
    (the stop vote is read one step behind), so a send never waits for a slot in a
    valid schedule, and two stages can never each wait on a slot the other must free
    (gloo's sends, buffered by the kernel, never wait either)."""
    return max(SLOTS, 2 * messages_per_step)


def _decide(shape, dtype, device: torch.device, slots: int) -> bool:
    if os.environ.get(P2P, "shm") == "gloo" or device.type != "cpu":
        return False
    if shape is None or not os.path.isdir(SHM_DIR):
        return False
    need = 2 * slots * _nbytes(shape, dtype)
    return need <= MAX_SHARE * shutil.disk_usage(SHM_DIR).free


def _say(text: str, peer: int) -> None:
    buf = torch.zeros(_NAME, dtype=torch.uint8)
    raw = text.encode()
    buf[: len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    dist.send(buf, peer)


def _hear(peer: int) -> str:
    buf = torch.zeros(_NAME, dtype=torch.uint8)
    dist.recv(buf, peer)
    return bytes(buf.tolist()).rstrip(b"\0").decode()


def connect(
    peer: int,
    shape,
    dtype,
    device: torch.device,
    same_node: bool,
    timeout_s: float,
    messages_per_step: int = SLOTS,
):
    """A :class:`ShmLink` to ``peer`` (both ranks call this), or None for gloo.

    ``shape``/``dtype``: of the activation between the two (its gradient has the same);
    the lower rank decides, so both ends always agree. The lower rank creates the files
    and opens its read ends, then names them; the higher opens its read ends and its
    write ends (every reader it writes to is open) and answers; the lower opens its
    write ends, says so (a read end without a writer yet reads as end-of-file) and
    unlinks the names.
    """
    n = ring_slots(messages_per_step)
    if dist.get_rank() < peer:
        use = same_node and _decide(shape, dtype, device, n)
        return _connect_lower(peer, shape, dtype, n, timeout_s, use)
    return _connect_higher(peer, shape, dtype, n, timeout_s)


def _create_files(path: str, size: int) -> None:
    """Both rings' data files and fifos: "up" runs lower -> higher rank (activations),
    "down" back (gradients)."""
    for d in ("up", "down"):
        with open(f"{path}-{d}.data", "wb") as f:
            f.truncate(size)
        os.mkfifo(f"{path}-{d}.fills", 0o600)
        os.mkfifo(f"{path}-{d}.acks", 0o600)


def _unlink_files(path: str) -> None:
    for d in ("up", "down"):
        for ext in ("data", "fills", "acks"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}-{d}.{ext}")


def _connect_lower(peer: int, shape, dtype, n: int, timeout_s: float, use: bool):
    """The lower rank's side of :func:`connect` (``use``: shared memory is possible)."""
    path = os.path.join(SHM_DIR, f"jobctl-p2p-{uuid.uuid4().hex[:16]}") if use else ""
    try:
        if path:
            _create_files(path, n * _nbytes(shape, dtype))
            out = Ring(f"{path}-up", shape, dtype, n, True, timeout_s)
            into = Ring(f"{path}-down", shape, dtype, n, False, timeout_s)
        _say(path, peer)
        if not path:
            return None
        if _hear(peer) != "open":
            raise PeerGone(f"rank {peer} could not open the shared-memory channel")
        out.open_writer()
        into.open_writer()
        _say("open", peer)  # the higher rank reads only once every writer is open
    finally:
        if path:
            _unlink_files(path)
    return ShmLink(out, into)


def _connect_higher(peer: int, shape, dtype, n: int, timeout_s: float):
    """The higher rank's side of :func:`connect`."""
    path = _hear(peer)
    if not path:
        return None
    try:
        out = Ring(f"{path}-down", shape, dtype, n, True, timeout_s)
        into = Ring(f"{path}-up", shape, dtype, n, False, timeout_s)
        out.open_writer()
        into.open_writer()
    except BaseException:
        _say("failed", peer)
        raise
    _say("open", peer)
    if _hear(peer) != "open":
        raise PeerGone(f"rank {peer} could not open the shared-memory channel")
    return ShmLink(out, into)


class ShmInbox:
    """Receives of one kind from one neighbour over a :class:`Ring` (``p2p.Inbox``'s
    interface; micro-batches are taken in ``order``)."""

    def __init__(self, ring: Ring, order: list[int]):
        self.ring, self.todo = ring, deque(order)

    def ready(self, i: int) -> bool:
        return bool(self.todo) and self.todo[0] == i and self.ring.ready()

    def take(self, i: int) -> torch.Tensor:
        if not self.todo or self.todo[0] != i:
            raise RuntimeError(
                f"micro-batch {i} received out of order (next: {list(self.todo)[:1]})"
            )
        self.todo.popleft()
        return self.ring.take()


class ShmOutbox:
    """Sends to one neighbour over a :class:`Ring` (``p2p.Outbox``'s interface)."""

    def __init__(self, ring: Ring):
        self.ring = ring

    def send(self, i: int, t: torch.Tensor) -> None:
        self.ring.send(t)

    def drain(self) -> None:
        """Nothing in flight: a send has copied its tensor when it returns."""


def connect_neighbours(topo, chans, device, same_node, timeout_s: float, messages: int) -> dict:
    """Links to the previous and next stage (None where gloo carries the traffic).

    ``same_node(peer)`` says whether ``peer`` runs on this machine; ``messages``: per
    step and direction (the micro-batch count). Each rank connects
    to its previous stage, then its next, so along a pipeline every pair meets in turn.
    """
    links = {}
    if topo.prev is not None:
        links[topo.prev] = connect(
            topo.prev,
            chans.in_shape,
            chans.in_dtype,
            device,
            same_node(topo.prev),
            timeout_s,
            messages,
        )
    if topo.next is not None:
        links[topo.next] = connect(
            topo.next,
            chans.out_shape,
            chans.out_dtype,
            device,
            same_node(topo.next),
            timeout_s,
            messages,
        )
    return links
