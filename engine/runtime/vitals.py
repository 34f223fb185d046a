"""A step's heartbeat fields: this rank's compute per micro-batch and its memory."""

from __future__ import annotations

import os
import resource

import torch

from jobctl.engine.runtime.executor import StepStats


def max_rss_mb() -> float:
    """Peak resident memory of this process (CPU) in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


_STATM: dict[int, int] = {}  # pid -> an open /proc/<pid>/statm (a fork opens its own)


def _rss_mb() -> float:
    """Resident memory of this process now, in MiB (/proc; the peak where there is none).

    Every heartbeat reads it: the file stays open and is re-read in place (one pread,
    ~2 us) instead of opened, read and closed through ``pathlib`` (~20-35 us, several
    system calls, each a chance to lose the core on a shared host)."""
    pid = os.getpid()
    try:
        if pid not in _STATM:
            _STATM[pid] = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
        pages = int(os.pread(_STATM[pid], 128, 0).split()[1])
    except (OSError, IndexError, ValueError):
        return max_rss_mb()
    return pages * resource.getpagesize() / 2**20


def memory_fields(device: torch.device) -> dict:
    """A heartbeat's memory: the CUDA allocator's peak on a GPU, the process RSS on CPU."""
    out = {"max_rss_mb": max_rss_mb()}
    if device.type == "cuda":
        out.update(mem_mb=torch.cuda.max_memory_allocated(device) / 2**20, mem_kind="cuda_peak")
    else:
        out.update(mem_mb=_rss_mb(), mem_kind="rss")
    return out


def compute_fields(stats: StepStats, micro_batches: int) -> dict:
    """Per-micro-batch compute of one step: forward (recomputes included) and backward
    means in ms, and their sum in seconds (``compute_s``, what the straggler detector
    compares with the stage peers). Waits for peers are not compute and not counted."""
    n = max(1, micro_batches)
    fwd, bwd = sum(stats.fwd_s) / n, sum(stats.bwd_s) / n
    return {"fwd_ms": 1e3 * fwd, "bwd_ms": 1e3 * bwd, "compute_s": fwd + bwd}
