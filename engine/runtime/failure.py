"""A lost peer seen from inside the training loop: which errors mean one, the step
commit that keeps the survivors consistent, and what a rank holds when it traps one.

A step's optimizer update happens only after its gradient sum, so a failure inside a
step leaves a rank's weights and optimizer state at the end of the previous step. The
survivors of different stages must also agree on that step: the stage whose replica
died a little later may already have finished its gradient sum and updated. So before
any rank updates, every live rank joins one more all-reduce, the **commit**, which
also sums the step's loss (the last stage's weighted micro-batch losses; the other
stages add 0): a rank that got through the commit of step k knows that every rank,
dead ones included, finished step k's gradient sums, so every survivor either updated
to k or holds k's summed gradients and can update itself (``Held.apply_pending``).
Nobody got through it: nobody updated, every survivor holds k - 1. Only elastic jobs
with D > 1 commit (the trainer's ``commits``): without replicas a lost node takes a
stage with it, and without elasticity the run does not morph onto survivors.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from jobctl.engine.runtime.p2p.gloo import comm_device
from jobctl.engine.runtime.p2p.shm import PeerGone

# What gloo, the shared-memory channels and the sockets under them say when the rank at
# the other end died (SIGKILL, a lost machine) or was torn down.
_PEER_WORDS = (
    "connection closed by peer",
    "connection reset by peer",
    "remote worker crashing",
    "broken pipe",
    "connection refused",
    "socket closed",
)


def is_peer_failure(exc: BaseException) -> bool:
    """Does ``exc`` say a peer is gone (rather than a bug in this rank)?"""
    if isinstance(exc, (PeerGone, ConnectionError)):
        return True
    if isinstance(exc, (dist.DistNetworkError, dist.DistStoreError)):
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc).lower() for w in _PEER_WORDS)


def commit_step(
    loss_sum: float | torch.Tensor, is_last: bool, group=None, found_inf: bool = False
) -> tuple[float, bool]:
    """The step's commit (see the module docstring): every live rank's all-reduce of
    the last stage's loss sums; returns the global-batch mean loss and whether any
    rank found an inf/NaN gradient under fp16 (``runtime.loss_scale``: the flag rides
    in the same all-reduce, a sum of 0/1 that is positive where the MAX is 1, so an
    fp16 step costs no extra round trip)."""
    part = float(loss_sum) if is_last else 0.0  # the step's one read of the device sum
    total = torch.tensor([part, float(found_inf)], dtype=torch.float64, device=comm_device())
    dist.all_reduce(total, group=group)
    return float(total[0]), bool(total[1] > 0)


@dataclass
class Held:
    """What a rank holds when it traps a lost peer."""

    done: int  # optimizer steps applied to its weights
    ready: bool  # step done + 1's gradients are summed, its update not applied
    losses: dict[int, float] = field(default_factory=dict)  # committed steps' losses
    reported: int = 0  # the newest step this rank wrote a ``step`` record for
    cause: str = ""
    apply_pending: Callable[[], None] | None = None  # applies step done + 1's update

    def committed(self) -> int:
        """The newest step this rank knows every rank summed (it may not have applied
        it: a failure between its commit and its update)."""
        return max([self.done, *self.losses])

    def as_record(self) -> dict:
        return {
            "done": self.done,
            "ready": self.ready,
            "committed": self.committed(),
            "losses": {str(k): v for k, v in self.losses.items()},
            "reported": self.reported,
            "cause": self.cause[:300],
        }


class StepFailure(Exception):
    """A peer was lost during training; ``held`` says what this rank still has."""

    def __init__(self, held: Held):
        super().__init__(f"lost a peer after step {held.done}: {held.cause}")
        self.held = held


class StepLedger:
    """Where a rank is inside its steps, kept up to date by the trainer."""

    def __init__(self, done: int) -> None:
        self.done = done
        self.ready = False
        self.losses: dict[int, float] = {}
        self.reported = 0
        self.stats = None  # the running step's executor stats (its loss sum)

    def begin(self) -> None:
        self.ready, self.stats = False, None

    def committed(self, step: int, loss: float) -> None:
        self.losses = {k: v for k, v in self.losses.items() if k >= step - 2}
        self.losses[step] = loss

    def applied(self, step: int) -> None:
        self.done, self.ready = step, False

    def held(self, exc: BaseException, apply_pending: Callable[[], None] | None) -> Held:
        pending = apply_pending if self.ready else None
        cause = f"{type(exc).__name__}: {exc}"  # the class too: PeerGone says it in its name
        return Held(self.done, self.ready, dict(self.losses), self.reported, cause, pending)


def cut_peer_connections(keep_ports: set[int]) -> int:
    """Shut down this process's TCP connections but those to ``keep_ports`` (the run
    host's store and event channel); the number cut.

    A rank that trapped a lost peer leaves the collectives, but a live peer may be
    blocked in one with it (its ring neighbour failed later, or not at all), and gloo
    releases it only when this process's connections close, at exit: destroying,
    aborting or shutting down the process groups leaves them open. The survivors then
    wait for each other's records in a deadlock until the hand-over's bound. Shutting
    the sockets down fails the peer's collective at once, so it hands over too."""
    import socket

    cut = 0
    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
        try:
            fd = os.dup(int(name))
        except (OSError, ValueError):
            continue  # the listing's own descriptor, gone
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)
            continue  # not a socket
        with sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                if sock.type != socket.SOCK_STREAM or sock.getpeername()[1] in keep_ports:
                    continue
                sock.shutdown(socket.SHUT_RDWR)
                cut += 1
            except OSError:
                continue  # a listening socket, or one already closed
    return cut
