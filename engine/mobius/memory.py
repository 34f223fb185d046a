"""The process's resident memory, now and at its peak, from ``/proc/self/status``.

A Mobius run is held to a per-process memory budget; what counts is resident set
size (the kernel's page cache of the tier's files does not belong to the process).
``reset_peak`` restarts the kernel's high-water mark (``clear_refs`` 5, Linux 4.0+)
so a peak is measured from a baseline, not from start-up.
"""

from __future__ import annotations

from pathlib import Path

_STATUS = Path("/proc/self/status")


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
