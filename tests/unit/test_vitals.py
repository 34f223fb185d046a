"""A heartbeat's memory: the RSS read from the statm file this process keeps open."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import torch

from jobctl.engine.runtime import vitals


def _statm_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def test_rss_follows_memory_touched_since_the_last_read():
    before = vitals._rss_mb()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, written, so resident
    after = vitals._rss_mb()
    assert after - before > 48
    assert abs(after - _statm_mb()) < 4  # the same figure a fresh open reads
    del block


def test_statm_is_opened_once_per_process():
    vitals._rss_mb()
    fd = vitals._STATM[os.getpid()]
    fields = vitals.memory_fields(torch.device("cpu"))
    assert vitals._STATM[os.getpid()] == fd
    assert fields["mem_kind"] == "rss" and fields["mem_mb"] > 0
