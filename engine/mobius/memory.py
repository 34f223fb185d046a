"""The process's resident memory, now and at its peak, from ``/proc/self/status``.

A Mobius run is held to a per-process memory budget; what counts is resident set
size (the kernel's page cache of the tier's files does not belong to the process).
``reset_peak`` restarts the kernel's high-water mark (``clear_refs`` 5, Linux 4.0+)
so a peak is measured from a baseline, not from start-up.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

_STATUS = Path("/proc/self/status")
_M_MMAP_THRESHOLD = -3  # mallopt parameter (malloc.h)


def _field(name: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"{name} not in {_STATUS} (Linux only)")


def rss_bytes() -> int:
    """Resident set size now."""
    return _field("VmRSS")


def peak_bytes() -> int:
    """Resident set size at its highest since the last ``reset_peak``."""
    return _field("VmHWM")


def reset_peak() -> None:
    """Restart the high-water mark at the current resident size."""
    Path("/proc/self/clear_refs").write_text("5")


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to tune
        return None


def hold_heap() -> None:
    """Keep freed stage-sized memory from staying resident: glibc raises its mmap
    threshold to the largest block freed (up to 32 MiB), after which transient
    tensors of a stage's size come from the heap and stay resident once freed; a
    fixed 64 KiB threshold maps them and unmaps them on free. Then trim what the
    heap holds now. Process-wide: a Mobius rank owns its process."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, 64 * 1024)
        libc.malloc_trim(0)
