"""Rich renderings of plans, runs and events for the terminal."""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from .plan import Plan


def print_plan(console: Console, plan: Plan) -> None:
    """The plan as a summary line, a stage table and a rank table."""
    console.print(
        f"[bold]plan[/bold] P={plan.P} x D={plan.D} on {plan.world_size} device(s), "
        f"{plan.nodes} node(s); micro-batch m={plan.micro_batch_size} x "
        f"{plan.micro_batches} per replica = global batch {plan.global_batch_size}; "
        f"schedule {plan.schedule}",
        soft_wrap=True,
    )
    stages = Table("stage", "blocks", "ranks (replica 0..D-1)", "recompute")
    for st in plan.stages:
        names = [plan.block_names[b] for b in st.blocks]
        shown = names if len(names) <= 4 else [names[0], "...", names[-1]]
        stages.add_row(
            str(st.index),
            f"{st.blocks[0]}-{st.blocks[-1]}: {', '.join(shown)}",
            " ".join(map(str, st.ranks)),
            "yes" if st.recompute else "no",
        )
    console.print(stages)
    console.print(f"[bold]schedule[/bold] {plan.schedule} (per-stage action lists):")
    for st in plan.stages:
        acts = st.actions if len(st.actions) <= 160 else st.actions[:157] + "..."
        console.print(f"  S{st.index}: {acts}", soft_wrap=True, highlight=False)
    ranks = Table("rank", "node", "local rank", "stage", "replica")
    for r in plan.ranks:
        ranks.add_row(*(str(v) for v in (r.rank, r.node, r.local_rank, r.stage, r.replica)))
    console.print(ranks)
    if plan.prediction:
        pr = plan.prediction
        mem = ", ".join(human_bytes(m * 1024**3) for m in pr.memory_per_stage_gb)
        console.print(
            f"predicted ({pr.source}): {pr.step_time_s:.3f} s/step, "
            f"{pr.samples_per_s:.1f} samples/s, "
            f"bubble {100 * pr.bubble_ratio:.1f} %, memory per stage [{mem}], "
            f"${pr.cost_per_1k_samples:.4f} per 1k samples",
            soft_wrap=True,
        )


def human_bytes(n: float) -> str:
    """``1.5 GiB``, ``320 MiB``, ``12 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    s = time.time() - ts
    return (
        f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.1f}h ago"
    )


def print_runs(console: Console, rows: list[dict]) -> None:
    """One line per run."""
    if not rows:
        console.print("no runs yet: `jobctl apply job.yaml` starts one")
        return
    t = Table(
        "run",
        "phase",
        "step",
        "loss",
        "samples/s",
        "devices",
        "plan",
        "ckpt",
        "uploaded",
        "updated",
    )
    for r in rows:
        t.add_row(
            r["id"],
            r["phase"],
            f"{r['step'] or 0}/{r['total_steps'] or '?'}",
            f"{r['loss']:.4f}" if r["loss"] is not None else "-",
            f"{r['samples_per_s']:.1f}" if r["samples_per_s"] else "-",
            str(r["devices"] or "-"),
            r["plan"] or "-",
            str(r["last_checkpoint"]) if r["last_checkpoint"] is not None else "-",
            _upload_cell(r),
            _ago(r["updated_at"]),
        )
    console.print(t)


def _upload_cell(r: dict) -> str:
    """Last uploaded step and the lag behind the last local checkpoint, in steps."""
    if r.get("last_upload") is None:
        return "-"
    lag = (r["last_checkpoint"] or 0) - r["last_upload"]
    return f"{r['last_upload']}" + (f" (lag {lag})" if lag > 0 else "")


def print_run(console: Console, row: dict, events: list[dict]) -> None:
    """One run's fields and its recent events."""
    t = Table("field", "value", show_header=False)
    for key in (
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
        "run_dir",
        "spec_path",
        "exit_code",
    ):
        t.add_row(key, str(row.get(key)))
    console.print(t)
    ev = Table("time", "kind", "message")
    for e in events:
        ev.add_row(
            time.strftime("%H:%M:%S", time.localtime(e["ts"])),
            e["kind"],
            e["message"].splitlines()[0],
        )
    console.print(ev)
