"""A survivor cuts its peers' connections (a peer blocked in a collective with it fails
at once instead of at this process's exit) but keeps the run host's. Run in a child
process: the cut reaches every TCP connection of the process it runs in."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import socket
from jobctl.engine.runtime.failure import cut_peer_connections

def pair(server):
    # bound first: a connect()'s own ephemeral port may be one another connection to
    # another server already uses (Linux shares them by 4-tuple), which would put the
    # peer's pair under a kept port now and then
    client = socket.create_connection(server.getsockname()[:2], source_address=("127.0.0.1", 0))
    return client, server.accept()[0]

peer_side = socket.create_server(("127.0.0.1", 0))
host_side = socket.create_server(("127.0.0.1", 0))
to_peer, at_peer = pair(peer_side)
to_host, at_host = pair(host_side)
# this process holds both ends of each pair: keep both ends of the run host's
kept = {host_side.getsockname()[1], to_host.getsockname()[1]}
assert cut_peer_connections(kept) == 2  # both ends of the peer's pair
at_peer.settimeout(5)
assert at_peer.recv(1) == b""  # the peer sees the connection closed at once
to_host.sendall(b"x")  # the run host's connection still works
at_host.settimeout(5)
assert at_host.recv(1) == b"x"
assert peer_side.getsockname()  # a listening socket is left alone
print("ok")
"""


def test_connections_are_cut_except_those_to_the_kept_ports():
    run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout == "ok\n", run.stdout + run.stderr
