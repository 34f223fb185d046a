"""Why a node's processes failed: a bug in the code, or a lost process.

A worker that raises writes its traceback to ``errors/rank-R.txt`` before it exits
(engine/worker/process.py). A worker process that dies without one was killed (SIGKILL, the
OOM killer, its machine going away): its peers then fail with communication errors
("Connection closed by peer", "Connection reset by peer", a timed-out collective, or
the shared-memory channel's ``PeerGone``: the peer closed its end, or hangs).
So, when nodes fail:

* an error report that is not a communication error is a bug: it would recur on any
  relaunch, so the run fails and shows that rank's log;
* otherwise the failed nodes that lost a rank without a report (one that had trained
  in this attempt: a rank that never started says nothing about its machine) are lost,
  exactly like a preempted machine: dropped, and the run morphs onto the rest.
"""

from __future__ import annotations

from pathlib import Path

# Exception text of a rank whose peer went away (gloo, NCCL, the c10d store, and
# engine/runtime/p2p/shm.py's channels, named by class: this module stays free of torch).
COMM_ERRORS = (
    "PeerGone",
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "gloo/transport",
    "DistBackendError",
    "DistNetworkError",
    "DistStoreError",
    "NCCL error",
    "Timed out",
)


def exception_line(report: str) -> str:
    """The raised exception of a traceback: its last line that is not indented."""
    lines = [x for x in report.splitlines() if x.strip() and not x[0].isspace()]
    return lines[-1] if lines else ""


def is_comm_error(report: str) -> bool:
    """True when a rank's error report says a peer went away, not that its code broke."""
    line = exception_line(report)
    return any(marker in line for marker in COMM_ERRORS)


def error_reports(run_dir: Path) -> dict[int, str]:
    """This attempt's error reports by rank (earlier attempts' are archived)."""
    out = {}
    for path in (run_dir / "errors").glob("rank-*.txt"):
        rank = path.stem.split("-", 1)[1]
        if rank.isdigit():
            out[int(rank)] = path.read_text(errors="replace")
    return out


def bug_ranks(run_dir: Path) -> list[int]:
    """Ranks whose error report is a real exception (not a peer gone)."""
    return sorted(r for r, text in error_reports(run_dir).items() if not is_comm_error(text))


def lost_process_nodes(
    run_dir: Path, rank_nodes: dict[int, int], failed_nodes: set[int], started: set[int]
) -> list[int]:
    """Failed nodes that lost a started rank without an error report ([] when none)."""
    reported = set(error_reports(run_dir))
    return sorted(
        {n for r, n in rank_nodes.items() if n in failed_nodes and r in started - reported}
    )


def failure_log(backend, handles: list[str], run_dir: Path) -> tuple[int | None, Path, str]:
    """The failing rank, its log and a note, asking the backend for the logs first: on
    ssh or Kubernetes they live on the nodes until fetched."""
    from jobctl.backends import BackendError
    from jobctl.engine.supervise.launch import failing_rank

    note = ""
    try:
        fetched = backend.logs(handles, run_dir)
    except BackendError as e:
        fetched, note = [], f" (fetching the nodes' logs failed: {e})"
    rank = failing_rank(run_dir)
    if rank is None:  # no error report on this disk: the first rank log with a traceback
        rank = next((_rank_of(p) for p in fetched if _has_traceback(p)), None)
    name = f"rank-{rank}.log" if rank is not None else "node-0.log"
    found = [p for p in fetched if p.name == name] + [run_dir / "logs" / name]
    log = next((p for p in found if p.exists()), fetched[-1] if fetched else found[-1])
    return rank, log, note


def _rank_of(path: Path) -> int | None:
    stem = path.stem
    return int(stem[5:]) if stem.startswith("rank-") and stem[5:].isdigit() else None


def _has_traceback(path: Path) -> bool:
    return _rank_of(path) is not None and "Traceback" in path.read_text(errors="replace")
