"""Dated result files: what a benchmark measured, on which machine, with which command.

A benchmark calls ``write(name, figures, device=...)``; it lands in
``benchmarks/results/YYYY-MM-DD-<name>[-<device>].json`` (``-2``, ``-3`` ... when that
day already has one), or under ``$BENCHMARKS_RESULTS`` where that is set (``python -m
benchmarks run --results DIR NAME`` sets it). ``latest(name, device)`` reads the newest
such file back, from that folder and the recorded ones in ``benchmarks/results``: the
figures a later comparison is made against live here, not in code.

Every other benchmark's result is what it printed: the runner wraps the run in
``kept(name, argv)``, which tees stdout and stderr (still printed live) and writes them
to ``YYYY-MM-DD-<name>.txt`` under the same folder, headed by the command and the
machine, unless the benchmark wrote its own result through ``write``.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import platform
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
ENV = "BENCHMARKS_RESULTS"
WRITTEN: list[Path] = []  # result files ``write`` wrote in this process (``kept`` reads it)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # rich's colours: live only, not in the file


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


def _free(base: str, ext: str = "json") -> Path:
    """``base.ext`` in the results folder, or the first ``base-K.ext`` not taken."""
    where = folder()
    path, k = where / f"{base}.{ext}", 2
    while path.exists():
        path, k = where / f"{base}-{k}.{ext}", k + 1
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
    WRITTEN.append(path)
    print(f"result written to {path}")
    return path


def latest(name: str, device: str | None = None) -> dict | None:
    """The newest result file of ``name`` (and ``device``) as written, or None."""
    tail = f"-{name}" + (f"-{slug(device)}" if device else "")
    pattern = re.compile(r"\d{4}-\d{2}-\d{2}" + re.escape(tail) + r"(-\d+)?\.json")
    # a run pointed elsewhere still compares against the results recorded in the tree
    where = dict.fromkeys([folder().resolve(), RESULTS.resolve()])
    found = [(p, pattern.fullmatch(p.name)) for d in where for p in d.glob("*.json")]
    # by date, then by the day's count: a second file of a day ends in -2
    order = sorted((p.name[:10], int((m[1] or "-1")[1:]), p) for p, m in found if m)
    return json.loads(order[-1][2].read_text()) if order else None


class _Tee(io.TextIOBase):
    """A text stream that writes to ``live`` and keeps a copy in ``kept``; everything
    else (isatty, fileno, encoding) is ``live``'s, so rich prints as it would."""

    def __init__(self, live, kept: list[str]):
        self.live, self.kept = live, kept

    def write(self, text: str) -> int:
        self.kept.append(text)
        return self.live.write(text)

    def flush(self) -> None:
        self.live.flush()

    def isatty(self) -> bool:
        return self.live.isatty()

    def fileno(self) -> int:
        return self.live.fileno()

    def __getattr__(self, name: str):
        return getattr(self.live, name)


@contextlib.contextmanager
def kept(name: str, argv: list[str]) -> Iterator[dict]:
    """Run the block with stdout and stderr teed; then, unless it wrote its own result
    through ``write``, write what it printed to ``YYYY-MM-DD-<name>.txt``, headed by
    ``argv`` (the runner's arguments as typed). The block sets the yielded dict's
    ``status`` (its exit); a failure is written too, so a broken run leaves its
    evidence."""
    text: list[str] = []
    out, err, before = sys.stdout, sys.stderr, len(WRITTEN)
    sys.stdout, sys.stderr = _Tee(out, text), _Tee(err, text)
    state = {"status": "exit 0"}
    try:
        yield state
    except SystemExit as e:
        state["status"] = f"exit {e.code if isinstance(e.code, int) else 1}"
        if e.code is not None and not isinstance(e.code, int):
            text.append(f"{e.code}\n")  # the message SystemExit prints after we return
        raise
    except BaseException as e:
        state["status"] = f"raised {type(e).__name__}: {e}"
        raise
    finally:
        sys.stdout, sys.stderr = out, err
        if len(WRITTEN) == before:
            _keep(name, argv, "".join(text), state["status"])


def _keep(name: str, argv: list[str], text: str, status: str) -> None:
    """The dated text file of one run: command, date and machine, output, exit."""
    now = datetime.datetime.now()
    path = _free(f"{now.date().isoformat()}-{name}", "txt")
    path.parent.mkdir(parents=True, exist_ok=True)
    m = machine()
    where = ", ".join(f"{k} {v}" for k, v in m.items())
    head = f"$ python -m benchmarks {shlex.join(argv)}\n"
    head += f"# {now:%Y-%m-%d %H:%M}, {where}\n\n"
    body = ANSI.sub("", text)
    path.write_text(head + body + ("" if body.endswith("\n") else "\n") + f"# {status}\n")
    print(f"output kept in {path}", file=sys.stderr)
