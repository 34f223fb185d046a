"""The GPU check, through the runner: ``gpu_check.sh`` beside this file, then its
summary as a dated result file.

The script runs jobctl's CUDA tests, trains two small jobs on the GPU with ``jobctl
apply`` and measures the planner's step-time predictions against real runs
(``gpu_accuracy``); docs/benchmarks.md says what each step checks. Its arguments pass
through unchanged; once it ends, what it wrote to its results directory
(``environment.txt``, ``summary.txt``) is kept as
``benchmarks/results/DATE-gpu_check-DEVICE.json``.

    python -m benchmarks run gpu_check [-o DIR] [tests apply mobius accuracy]
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.lib import results

QUESTION = (
    "Does jobctl run on this CUDA machine (its GPU tests, two small jobs), and how close "
    "are its step-time predictions to real runs there?"
)
BASELINE = "Each step's own pass or fail; the accuracy step's real runs of each configuration."
SCRIPT = Path(__file__).resolve().with_name("gpu_check.sh")
DEFAULT_OUT = "./gpu-check-results"


def out_dir(argv: list[str]) -> Path:
    """The results directory the script writes: ``-o DIR``, else its default."""
    if "-o" in argv and argv.index("-o") + 1 < len(argv):
        return Path(argv[argv.index("-o") + 1])
    return Path(os.environ.get("GPU_CHECK_OUT", DEFAULT_OUT))


def device(environment: list[str]) -> str | None:
    """The first GPU's name from ``environment.txt`` (``  cuda:0 NAME, N GiB``)."""
    for line in environment:
        if line.strip().startswith("cuda:0 "):
            return line.strip().split(" ", 1)[1].rsplit(",", 1)[0]
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = ["-h" if a == "--help" else a for a in argv]  # the script's getopts: -h only
    rc = subprocess.run(["bash", str(SCRIPT), *argv]).returncode
    out = out_dir(argv)
    summary = out / "summary.txt"
    if "-h" in argv or rc == 2 or not summary.exists():  # nothing ran: nothing to keep
        return rc
    env = (out / "environment.txt").read_text().splitlines()
    steps = dict(line.split(": ", 1) for line in summary.read_text().splitlines() if ": " in line)
    figures = {"exit_status": rc, "steps": steps, "environment": env, "logs": str(out.resolve())}
    results.write("gpu_check", figures, device=device(env))
    return rc
