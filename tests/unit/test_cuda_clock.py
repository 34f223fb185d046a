"""The calibration clock on CUDA times the device's own timeline (runs on a GPU only)."""

from __future__ import annotations

import time

import pytest
import torch

from jobctl.engine.calibration.measure.compute import _Clock

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _products(a: torch.Tensor, n: int) -> None:
    for _ in range(n):
        a @ a


def test_cuda_marks_time_queued_work_without_synchronising_between_them():
    clock, a = _Clock(torch.device("cuda")), torch.randn(4096, 4096, device="cuda")
    _products(a, 5)
    torch.cuda.synchronize()
    w0 = time.perf_counter()
    _products(a, 20)
    torch.cuda.synchronize()
    wall = time.perf_counter() - w0
    t0 = clock.now()
    _products(a, 20)
    t1 = clock.now()
    elapsed = t1 - t0
    assert 0.7 * wall < elapsed < 1.1 * wall


def test_a_mark_does_not_wait_for_the_queue():
    """The host runs ahead of the device as in training: right after queueing ~40 ms
    of products, the newest mark has not been reached yet (the old clock
    synchronised here, so every block paid its launch latency in full)."""
    clock, a = _Clock(torch.device("cuda")), torch.randn(4096, 4096, device="cuda")
    _products(a, 2)
    t0 = clock.now()
    _products(a, 20)
    t1 = clock.now()
    assert not t1.event.query()
    assert t1 - t0 > 0
    assert t1.event.query()
