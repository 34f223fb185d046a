"""Dated result files: what a benchmark measured, on which machine, with which command.

A benchmark calls ``write(name, figures, device=...)``; it lands in
``benchmarks/results/YYYY-MM-DD-<name>[-<device>].json`` (``-2``, ``-3`` ... when that
day already has one), or under ``$BENCHMARKS_RESULTS`` where that is set (``python -m
benchmarks run --results DIR NAME`` sets it). ``latest(name, device)`` reads the newest
such file back: the figures a later comparison is made against live here, not in code.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
ENV = "BENCHMARKS_RESULTS"


def folder() -> Path:
    """Where result files go: ``$BENCHMARKS_RESULTS``, else ``benchmarks/results``."""
    return Path(os.environ[ENV]) if os.environ.get(ENV) else RESULTS


def slug(text: str) -> str:
    """``text`` as a file-name part: lower case, runs of other characters as one dash."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def machine() -> dict:
    """The machine a result was measured on: host platform, cores, Python, torch and
    its accelerators (torch only if the benchmark imported it: no import for that)."""
    out = {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.__version__
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            out["gpus"] = [torch.cuda.get_device_name(i) for i in range(n)]
    return out


def command() -> str:
    """The command line that ran the benchmark, as the runner saw it."""
    return " ".join([Path(sys.executable).name, *sys.argv])


def _free(base: str) -> Path:
    """``base.json`` in the results folder, or the first ``base-K.json`` not taken."""
    where = folder()
    path, k = where / f"{base}.json", 2
    while path.exists():
        path, k = where / f"{base}-{k}.json", k + 1
    return path


def write(name: str, figures: dict, device: str | None = None, notes: str = "") -> Path:
    """Write one dated result of benchmark ``name``; returns its path."""
    today = datetime.date.today().isoformat()
    base = f"{today}-{name}" + (f"-{slug(device)}" if device else "")
    path = _free(base)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "date": today,
        "device": device,
        "command": command(),
        "machine": machine(),
        "figures": figures,
        "notes": notes,
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"result written to {path}")
    return path


def latest(name: str, device: str | None = None) -> dict | None:
    """The newest result file of ``name`` (and ``device``) as written, or None."""
    tail = f"-{name}" + (f"-{slug(device)}" if device else "")
    pattern = re.compile(r"\d{4}-\d{2}-\d{2}" + re.escape(tail) + r"(-\d+)?\.json")
    found = [(p, pattern.fullmatch(p.name)) for p in folder().glob("*.json")]
    # by date, then by the day's count: a second file of a day ends in -2
    order = sorted((p.name[:10], int((m[1] or "-1")[1:]), p) for p, m in found if m)
    return json.loads(order[-1][2].read_text()) if order else None
