"""Whether the nodes can reach the rendezvous the supervisor hosts.

Every node dials ``hardware.rendezvous_host`` for the torchrun rendezvous and the event
channel. The spec defaults it to 127.0.0.1 only when every node runs on the supervisor's
machine, and to this machine's host name otherwise (``spec.sections``); a loopback
address that nodes on other machines would dial is refused here, before anything starts,
with the field to change.
"""

from __future__ import annotations

import socket

from jobctl.spec.sections import is_loopback

from .base import BackendError, RunContext


def require_reachable(
    ctx: RunContext, backend: str, who: str, *, loopback_ok_if_set: bool = False
) -> None:
    """Refuse a loopback rendezvous that ``who`` (nodes on other machines) would dial.

    ``loopback_ok_if_set``: a loopback address the spec sets on purpose is kept (a Slurm
    cluster whose one node is this machine); one it only defaults to is refused.
    """
    host, hw = ctx.rdzv_host, ctx.hardware
    chosen = "rendezvous_host" in hw.model_fields_set
    if not is_loopback(host) or (chosen and loopback_ok_if_set):
        return
    name = socket.gethostname()
    if chosen:
        why = "hardware.rendezvous_host sets it"
    elif hw.backend != backend:
        why = f"hardware.rendezvous_host defaults to it for hardware.backend {hw.backend!r}"
    else:
        why = f"hardware.rendezvous_host defaults to this machine's host name, {name!r}"
    fix = "set hardware.rendezvous_host to an address of this machine that they reach"
    if not is_loopback(name):
        fix += f" (its host name is {name!r})"
    if not chosen and hw.backend != backend and not is_loopback(name):
        fix += f", or set hardware.backend: {backend} (the default is then this machine's name)"
    raise BackendError(f"{who} cannot reach the rendezvous at {host} ({why}): {fix}")
