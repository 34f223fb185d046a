"""A shared-memory ring's receiver polls for a message before it sleeps in select,
where its rank has a core of its own (``spin_budget``)."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from jobctl.engine.runtime.p2p import shm


@pytest.fixture
def ring_pair(tmp_path):
    """A sender and a receiver on one ring, in this process (files under tmp_path)."""
    path = str(tmp_path / "ring")
    shm._create_files(path, 4 * 6 * 4)
    into = shm.Ring(f"{path}-up", (2, 3), torch.float32, 4, sender=False, timeout_s=0.2)
    out = shm.Ring(f"{path}-up", (2, 3), torch.float32, 4, sender=True, timeout_s=0.2)
    out.open_writer()
    into.open_writer()
    yield out, into
    out.close()
    into.close()


def _count_selects(monkeypatch) -> list[int]:
    calls = []
    real = shm._wait_readable

    def counted(fd, timeout_s, what):
        calls.append(fd)
        real(fd, timeout_s, what)

    monkeypatch.setattr(shm, "_wait_readable", counted)
    return calls


def _send_later(out: shm.Ring, t: torch.Tensor, delay_s: float) -> threading.Thread:
    th = threading.Thread(target=lambda: (time.sleep(delay_s), out.send(t)))
    th.start()
    return th


def test_a_message_within_the_poll_is_taken_without_sleeping(ring_pair, monkeypatch):
    out, into = ring_pair
    selects = _count_selects(monkeypatch)
    into.spin_s = 1.0
    msg = torch.arange(6, dtype=torch.float32).view(2, 3)
    th = _send_later(out, msg, 0.02)
    assert torch.equal(into.take(), msg)
    th.join()
    assert selects == []


def test_without_a_poll_the_receiver_sleeps_in_select(ring_pair, monkeypatch):
    out, into = ring_pair
    selects = _count_selects(monkeypatch)
    msg = torch.ones(2, 3)
    th = _send_later(out, msg, 0.02)
    assert torch.equal(into.take(), msg)
    th.join()
    assert selects == [into.rfd]


def test_a_poll_that_runs_out_still_gives_up_on_a_silent_peer(ring_pair):
    _, into = ring_pair
    into.spin_s = 0.01
    t0 = time.perf_counter()
    with pytest.raises(shm.PeerGone, match="hangs"):
        into.take()
    assert time.perf_counter() - t0 >= 0.2  # the poll, then the whole timeout asleep


def test_only_ranks_with_cores_of_their_own_poll():
    cores = len(os.sched_getaffinity(0))
    assert shm.spin_budget(cores, 1) == shm.SPIN_S > 0
    assert shm.spin_budget(1, cores) == shm.SPIN_S
    assert shm.spin_budget(cores + 1, 1) == 0.0
    assert shm.spin_budget(cores, 2) == 0.0
