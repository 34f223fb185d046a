"""The backend interface: registry, status in jobctl's terms, derived poll, caching."""

from __future__ import annotations

import signal
import time

import pytest

from jobctl.backends import BackendError, NodeStatus, Rendered, get_backend
from jobctl.backends.base import BackendBase
from jobctl.backends.remote import StatusCache, run_command
from jobctl.engine.core.process import kill_tree

from ..render_contexts import context


def test_registry_knows_every_backend_and_lists_them():
    for name in ("local", "slurm", "kubernetes", "ssh"):
        assert get_backend(name).name == name
    with pytest.raises(ValueError, match=r"valid backends are local, slurm, kubernetes, ssh$"):
        get_backend("nomad")


class _Fixed(BackendBase):
    def __init__(self, statuses: list[NodeStatus]) -> None:
        self.statuses = statuses

    def status(self, handles):
        return self.statuses


def test_poll_is_the_exit_code_of_each_status():
    backend = _Fixed(
        [
            NodeStatus("pending"),
            NodeStatus("running"),
            NodeStatus("succeeded", 0),
            NodeStatus("failed", 3),
            NodeStatus("stopped", -15),
        ]
    )
    assert backend.poll(["a", "b", "c", "d", "e"]) == [None, None, 0, 3, -15]
    assert [s.done for s in backend.statuses] == [False, False, True, True, True]


def test_status_cache_asks_again_only_when_stale_or_for_other_handles():
    now, calls = [0.0], []
    cache = StatusCache(2.0, clock=lambda: now[0])

    def fetch():
        calls.append(now[0])
        return [NodeStatus("running")]

    cache.get(["1"], fetch)
    now[0] = 1.9
    cache.get(["1"], fetch)
    cache.get(["2"], fetch)
    now[0] = 4.0
    cache.get(["2"], fetch)
    cache.clear()
    cache.get(["2"], fetch)
    assert calls == [0.0, 1.9, 4.0, 4.0]


def test_status_cache_rides_out_a_failing_query_for_a_while():
    now, failing = [0.0], [True]
    cache = StatusCache(1.0, clock=lambda: now[0], max_stale=10.0)

    def fetch():
        if failing[0]:
            raise BackendError("squeue: Socket timed out")
        return [NodeStatus("running")]

    with pytest.raises(BackendError):  # nothing known yet: the error is the answer
        cache.get(["1"], fetch)
    failing[0] = False
    assert cache.get(["1"], fetch) == [NodeStatus("running")]
    failing[0], now[0] = True, 5.0
    assert cache.get(["1"], fetch) == [NodeStatus("running")]  # stale, still believed
    now[0] = 11.0
    with pytest.raises(BackendError, match="Socket timed out"):
        cache.get(["1"], fetch)


def test_run_command_errors_name_the_command():
    with pytest.raises(BackendError, match="no-such-tool-xyz: command not found"):
        run_command(["no-such-tool-xyz"])
    with pytest.raises(BackendError, match=r"^bash -c 'echo oops >&2; exit 3' exited 3: oops$"):
        run_command(["bash", "-c", "echo oops >&2; exit 3"])


def test_local_nodes_stopped_from_outside_are_not_failed(tmp_path):
    backend = get_backend("local")
    ctx = context("local", {}, run_dir=tmp_path)
    stub = {"node-0.sh": "exit 4\n", "node-1.sh": "exec sleep 60\n", "node-2.sh": "exec sleep 60\n"}
    handles = backend.submit(Rendered("local", stub), ctx)
    assert all(isinstance(h, str) and h.isdigit() for h in handles)
    backend.cancel(handles[1:2], signal.SIGTERM)
    kill_tree(int(handles[2]), signal.SIGKILL)  # a lost machine, as the chaos tests do it
    deadline = time.monotonic() + 20
    while not all(s.done for s in backend.status(handles)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert backend.status(handles) == [
        NodeStatus("failed", 4, "exit 4"),
        NodeStatus("stopped", -signal.SIGTERM, f"exit {-signal.SIGTERM}", "cancelled"),
        NodeStatus("stopped", -signal.SIGKILL, f"exit {-signal.SIGKILL}", "preempted"),
    ]
    assert backend.poll(handles) == [4, -signal.SIGTERM, -signal.SIGKILL]
    assert [p.name for p in backend.logs(handles, tmp_path)] == [
        "node-0.log",
        "node-1.log",
        "node-2.log",
    ]
