"""``jobctl status``: the table of runs (fitted to the terminal), one run's details, and
both as JSON for scripts."""

from __future__ import annotations

import time
from dataclasses import asdict

from rich.console import Console
from rich.table import Table
from rich.text import Text

from jobctl.engine.supervise.figures import RunFigures
from jobctl.engine.views.markup import plain
from jobctl.engine.views.prose import say
from jobctl.engine.views.tables import _num, dollars, hms, human_bytes


def ago(ts: float | None, now: float | None = None) -> str:
    """``35s ago``, ``12m ago``, ``1.5h ago``; ``just now`` within a second (a clock a
    little ahead of this one never shows ``-0s ago``)."""
    if not ts:
        return "-"
    s = (now or time.time()) - ts
    if s < 1:
        return "just now"
    return (
        f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.1f}h ago"
    )


RUN_COLUMNS = (
    "run",
    "phase",
    "step",
    "loss",
    "samples/s",
    "ETA",
    "devices",
    "plan",
    "ckpt",
    "uploaded",
    "upload lag",
    "$ so far",
    "$ to finish",
    "updated",
)


# The columns a narrow terminal keeps, in this order; the rest join, left to right in
# RUN_COLUMNS order, while the table still fits the console's width.
ESSENTIAL = ("run", "phase", "step", "loss", "ETA")
MONEY = ("$ so far", "$ to finish")  # left out where no run shown has a price


def run_cells(r: dict, f: RunFigures, now: float) -> dict[str, str]:
    """One run's cells by column: ``-`` for what is unknown, never ``None``."""
    return {
        "run": r["id"],
        "phase": _phase_cell(r),
        "step": f"{r['step'] or 0}/{r['total_steps'] or '?'}",
        "loss": _num(r["loss"], "{:.4f}"),
        "samples/s": _num(f.samples_per_s or r["samples_per_s"] or None, "{:.1f}"),
        "ETA": hms(f.eta_s),
        "devices": str(r["devices"] or "-"),
        "plan": r["plan"] or "-",
        "ckpt": _num(r["last_checkpoint"], "{}"),
        "uploaded": _upload_cell(r, f, now),
        "upload lag": _lag_cell(f, r),
        "$ so far": dollars(f.cost_usd),
        "$ to finish": dollars(f.usd_to_finish),
        "updated": ago(r["updated_at"], now),
    }


def fit_columns(cells: list[dict[str, str]], width: int) -> list[str]:
    """The columns that fit ``width``: the essential ones always (the run id is never
    cut: other commands need it), then each other one whose widest cell still fits."""

    def need(col: str) -> int:  # a cell, its padding and its border
        return max(len(col), *(len(c[col]) for c in cells)) + 3

    used = 1 + sum(need(c) for c in ESSENTIAL)
    shown = set(ESSENTIAL)
    unpriced = {c for c in MONEY if all(cell[c] == "-" for cell in cells)}  # no price
    for col in RUN_COLUMNS:
        if col not in shown | unpriced and used + need(col) <= width:
            shown.add(col)
            used += need(col)
    return [c for c in RUN_COLUMNS if c in shown]


def print_runs(
    console: Console,
    rows: list[dict],
    figures: dict[str, RunFigures] | None = None,
    now: float | None = None,
) -> None:
    """One line per run, with as many columns as the console's width holds (`status
    RUN` and `status --json` show them all); ``figures`` (by run id) adds ETA, upload
    age and lag, and $."""
    if not rows:
        console.print("no runs yet: `jobctl apply job.yaml` starts one")
        return
    now = now or time.time()
    cells = [run_cells(r, (figures or {}).get(r["id"]) or RunFigures(), now) for r in rows]
    columns = fit_columns(cells, console.width)
    t = Table(*columns)
    t.columns[0].no_wrap = True
    for c in cells:
        t.add_row(*(plain(c[col]) for col in columns))
    console.print(t)
    missing = [c for c in RUN_COLUMNS if c not in columns and any(x[c] != "-" for x in cells)]
    if missing:  # a column of "-" only (no run has a price) is not missed
        console.print(
            f"({len(missing)} more columns in a wider terminal, `jobctl status RUN` or `--json`)",
            style="dim",
        )


def runs_json(rows: list[dict], figures: dict[str, RunFigures], now: float) -> list[dict]:
    """Every run's row and figures as plain data (`jobctl status --json`)."""
    out = []
    for r in rows:
        f = figures.get(r["id"]) or RunFigures()
        out.append(
            {
                **{k: r.get(k) for k in RUN_FIELDS},
                "updated_at": r.get("updated_at"),
                "message": r.get("message"),
                "unsupervised": r.get("unsupervised", False),
                "figures": _figures_data(f),
            }
        )
    return out


def _figures_data(f: RunFigures) -> dict:
    return asdict(f)


def _phase_cell(r: dict) -> str:
    """The phase, with the scheduler's reason while the run waits in its queue."""
    note = r.get("message") or ""
    queued = r["phase"] == "launching" and note.startswith("queued: ")
    if queued:
        return f"{r['phase']} ({note})"
    return f"{r['phase']} (no supervisor)" if r.get("unsupervised") else r["phase"]


def _upload_cell(r: dict, f: RunFigures, now: float) -> str:
    """Newest uploaded step and how long ago it reached the remote store."""
    if r.get("last_upload") is None:
        return "-"
    return f"{r['last_upload']}" + (f" ({ago(f.uploaded_at, now)})" if f.uploaded_at else "")


def _lag_cell(f: RunFigures, row: dict) -> str:
    """Local checkpoints not yet uploaded: steps, how long the oldest has waited, and
    the step uploading now (the supervisor's ``uploading_step``)."""
    if f.lag_steps is None:
        return "-"
    lag = f"{f.lag_steps} steps / {hms(f.lag_s or 0.0)}" if f.lag_steps else "0"
    busy = row.get("uploading_step")
    return lag + (f", uploading {busy}" if busy is not None else "")


RUN_FIELDS = (
    "id",
    "phase",
    "step",
    "total_steps",
    "loss",
    "samples_per_s",
    "devices",
    "plan",
    "last_checkpoint",
    "last_upload",
    "exit_code",
    "message",
)
# Printed under the table in full: a path is copied, and a table cell at 80 columns
# or in a pipe would cut it with "…" (a path has no space to wrap at).
PATH_FIELDS = ("run_dir", "spec_path")


def _distance_row(t: Table, f: RunFigures) -> None:
    """AvgPipe: each parallel model's distance from the reference (before its pull)."""
    if f.avg_distance is not None:
        step, dists = f.avg_distance
        shown = " ".join(f"{d:.3g}" for d in dists)
        t.add_row("dist. to reference", f"{shown} (step {step})")


def print_run(
    console: Console,
    row: dict,
    events: list[dict],
    figures: RunFigures | None = None,
    ranks: list[dict] | None = None,
    now: float | None = None,
) -> None:
    """One run's fields and derived figures (ETA, $, upload lag, recovery times,
    stragglers), each rank's compute and memory, and its recent ``events``."""
    f = figures or RunFigures()
    t = Table("field", "value", show_header=False)
    if row.get("unsupervised"):
        t.add_row("supervisor", plain(f"none: `jobctl resume {row['id']}` supervises it again"))
    for key in RUN_FIELDS:
        if key == "samples_per_s":  # the recent figures below, from one window
            continue
        fmt = "{:.4f}" if key == "loss" else "{}"
        t.add_row(key, plain(_num(row.get(key), fmt)))  # names, messages: user text
    t.add_row("steps/s (recent)", _num(f.steps_per_s, "{:.3g}"))
    t.add_row("samples/s (recent)", _num(f.samples_per_s, "{:.1f}"))
    t.add_row("ETA", hms(f.eta_s))
    _cost_rows(t, f)
    t.add_row("upload lag", _lag_cell(f, row))
    t.add_row("newest upload", ago(f.uploaded_at, now))
    t.add_row("recovery times", _recovery_cell(f.recoveries, f.steps_lost))
    t.add_row("stragglers", plain(_straggler_cell(row, f)))  # the DB's text
    t.add_row("epoch", "-" if f.epoch is None else str(f.epoch))
    ev_loss = f.eval_loss
    t.add_row("eval loss", "-" if ev_loss is None else f"{ev_loss[1]:.4f} (step {ev_loss[0]})")
    _distance_row(t, f)
    console.print(t)
    for key in PATH_FIELDS:  # whole: at a terminal too narrow, under its key (#47)
        say(console, Text(f"{key}: {row.get(key) or '-'}"), highlight=False)
    if ranks:
        print_ranks(console, ranks)
    print_events(console, events)


def print_events(console: Console, events: list[dict]) -> None:
    """The run's recent events, a line each (their first line: messages are user text)."""
    ev = Table("time", "kind", "message", title="recent events", title_justify="left")
    for e in events:
        when = time.strftime("%H:%M:%S", time.localtime(e["ts"]))
        ev.add_row(when, plain(e["kind"]), plain(e["message"].splitlines()[0]))
    console.print(ev)


def _cost_rows(t: Table, f: RunFigures) -> None:
    """Dollars so far, per step and to finish; device-hours alone for a run with no
    price (``hardware.price_per_hour`` unset: every dollar figure would be $0.0000)."""
    hours = f"{_num(f.device_hours, '{:.3g}')} device-h"
    if f.cost_usd is None:
        t.add_row("device time", hours)
        return
    t.add_row("$ so far", f"{dollars(f.cost_usd)} ({hours})")
    t.add_row("$ per step (now)", _num(f.usd_per_step, "${:.3g}"))
    t.add_row("$ to finish", f"{dollars(f.usd_to_finish)} at the current rate, ETA {hms(f.eta_s)}")


def _recovery_cell(seconds: list[float], lost: list[int | None]) -> str:
    """Each recovery's time, with the completed steps it trained again where known."""
    lost = [*lost, *[None] * (len(seconds) - len(lost))]
    cells = [
        f"{s:.1f} s" + ("" if n is None else f" ({n} steps lost)")
        for s, n in zip(seconds, lost, strict=False)
    ]
    return ", ".join(cells) or "-"


def _straggler_cell(row: dict, f: RunFigures) -> str:
    """Flagged ranks now, and the nodes the newest straggler event named."""
    ranks = row.get("stragglers")
    if not ranks:
        return "none flagged"
    nodes = f" on node(s) {f.straggler_nodes}" if f.straggler_nodes else ""
    return f"rank(s) {ranks}{nodes}"


def print_ranks(console: Console, ranks: list[dict]) -> None:
    """Each rank's newest heartbeat: per-micro-batch compute against its stage peers."""
    t = Table(
        "rank",
        "stage",
        "node",
        "step",
        "fwd ms/mb",
        "bwd ms/mb",
        "vs stage peers",
        "memory",
        title="ranks (newest heartbeat)",
        title_justify="left",
    )
    for h in ranks:
        mem, kind = h.get("mem_mb"), h.get("mem_kind", "rss")
        if mem is None:  # an older worker: its peak RSS only
            mem, kind = h.get("max_rss_mb"), "peak rss"
        t.add_row(
            str(h["rank"]),
            str(h.get("stage", "-")),
            str(h.get("node", "-")),
            str(h["step"]),
            _num(h.get("fwd_ms"), "{:.2f}"),
            _num(h.get("bwd_ms"), "{:.2f}"),
            _num(h.get("slowdown") and 100 * h["slowdown"], "{:+.0f} %"),
            "-" if mem is None else f"{human_bytes(mem * 2**20)} {kind}",
        )
    console.print(t)
