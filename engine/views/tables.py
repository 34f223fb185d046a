"""Rich renderings of plans, runs and events for the terminal."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Column, Table

from jobctl.engine.views.markup import styled

if TYPE_CHECKING:  # `jobctl status` formats with this module without plans or records
    from rich.progress import Progress

    from jobctl.engine.calibration.record import (
        AllreduceCalibration,
        Calibration,
        RuntimeCalibration,
    )
    from jobctl.engine.core.plan import Plan


def _recompute_cell(st) -> str:
    """'yes'/'no', or stage-aware recomputation's alpha_i and kept blocks."""
    if st.alpha is not None:
        return f"a={st.alpha:.2f} keep {st.keep_blocks}/{len(st.blocks)}"
    return "yes" if st.recompute else "no"


def print_plan(console: Console, plan: Plan, steps: int | None = None, done: int = 0) -> None:
    """The plan as a summary line, a stage table and a rank table; with ``steps``, the
    end-to-end prediction (start-up included) of the steps after ``done`` (a resume)."""
    tp = f"T={plan.T} x " if plan.T > 1 or plan.t_search else ""  # T ranks per stage
    console.print(
        styled(
            "[bold]plan[/bold] {}",
            f"{tp}P={plan.P} x D={plan.D} on {plan.world_size} device(s), "
            f"{plan.nodes} node(s); micro-batch m={plan.micro_batch_size} x "
            f"{plan.micro_batches} per replica = global batch {plan.global_batch_size}; "
            f"schedule {plan.schedule}",
        ),
        soft_wrap=False,  # prose: wraps at words at 80 columns and in a pipe (#47)
    )
    for line in plan.t_search:  # tensor_parallel auto: why this T
        console.print(line, soft_wrap=False, highlight=False)
    console.print(_stage_table(plan))
    if plan.mobius is None:  # a Mobius rank's order is its swap lanes (views.mobius_gantt)
        _print_actions(console, plan)
    where = "device" if plan.placement else "stage"  # ZB-V: a rank's device hosts two
    shard = ["t"] if plan.T > 1 else []
    ranks = Table("rank", "node", "local rank", where, "replica", *shard)
    for r in plan.ranks:
        cells = (r.rank, r.node, r.local_rank, r.stage, r.replica, r.tp_rank)
        ranks.add_row(*(str(v) for v in cells[: 5 + len(shard)]))
    console.print(ranks)
    if plan.prediction:
        from jobctl.engine.views.prediction import print_end_to_end

        _print_prediction(console, plan)
        print_end_to_end(console, plan, steps, done)
    if plan.alternatives:
        print_alternatives(console, plan)


def _stage_table(plan: Plan) -> Table:
    """A row per stage: its blocks (by index and name), ranks and recomputation."""
    first = "ranks (replica 0..D-1)" if plan.T == 1 else "first ranks (+0..T-1)"
    # A name longer than the column at 80 is folded, never cut with an ellipsis (#47).
    blocks, ranks = Column("blocks", overflow="fold"), Column(first, overflow="fold")
    stages = Table("stage", blocks, ranks, "recompute")
    for st in plan.stages:
        # a traced block spanning modules, "a..b", may wrap between them
        names = [plan.block_names[b].replace("..", " .. ") for b in st.blocks]
        shown = names if len(names) <= 4 else [names[0], "...", names[-1]]
        stages.add_row(
            str(st.index),
            f"{_block_ranges(st.blocks)}: {', '.join(shown)}",
            " ".join(map(str, st.ranks)),
            _recompute_cell(st),
        )
    return stages


def _block_ranges(blocks: list[int]) -> str:
    """``[0, 3, 4]`` as ``0,3-4``: a Mobius rank hosts blocks that are not contiguous."""
    runs: list[list[int]] = []
    for b in blocks:
        if runs and b == runs[-1][-1] + 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _print_actions(console: Console, plan: Plan) -> None:
    """Per stage, or (two stages per rank: ZB-V) per device in the order it runs them."""
    if plan.placement is None:
        rows = [(f"S{st.index}", st.actions) for st in plan.stages]
        what = "per-stage action lists"
    else:
        rows = [(f"D{d}", text) for d, text in enumerate(plan.device_actions)]
        what = "per-device action lists; F3@5: micro-batch 3 on stage 5"
    console.print(styled("[bold]schedule[/bold] {} ({}):", plan.schedule, what))
    for name, text in rows:
        for line in action_lines(name, text, console.width):
            console.print(line, soft_wrap=True, highlight=False, markup=False)


def action_lines(name: str, text: str, width: int, most: int = 2) -> list[str]:
    """``name``'s action list wrapped at actions to ``width`` columns, at most ``most``
    lines; a longer list ends with how many actions are left out (never a cut one)."""
    lead = f"  {name}: "
    body = textwrap.wrap(text, max(20, width - len(lead)), break_long_words=False) or [""]
    pad = " " * len(lead)
    if len(body) > most:
        rest = len(text.split()) - sum(len(x.split()) for x in body[:most])
        body = [*body[:most], f"... {rest} more (jobctl plan --json)"]
    return [lead + body[0], *[pad + x for x in body[1:]]]


def _print_prediction(console: Console, plan: Plan) -> None:
    pr = plan.prediction
    mem = ", ".join(human_bytes(m * 1024**3) for m in pr.memory_per_stage_gb)
    per_device = pr.samples_per_s_per_device
    console.print(
        f"predicted ({pr.source}): {pr.step_time_s:.4g} s/step, "
        f"{pr.samples_per_s:.1f} samples/s"
        + (f" ({per_device:.1f} per device)" if per_device is not None else "")
        + f", idle {100 * pr.idle_share:.1f} % of the step, memory per "
        f"{'device' if plan.placement else 'stage'} [{mem}]"
        + (f", ${pr.cost_per_1k_samples:.4f} per 1k samples" if pr.cost_per_1k_samples else ""),
        soft_wrap=False,  # prose: wraps at words
        highlight=False,
    )


# The alternatives' columns a narrow terminal gives up first (`plan --json` has them).
ALTERNATIVE_DROPS = ("$/1k", "/device", "N_m", "memory/stage", "samples/s")


def print_alternatives(console: Console, plan: Plan) -> None:
    """The runners-up the planner simulated or rejected, numbered, then why each lost
    on a line of its own (a reason is prose: it wraps at words, not in a column)."""
    from jobctl.engine.views.fit import print_fitted, print_labelled

    priced = any(a.cost_per_1k_samples for a in plan.alternatives)
    cols = ("#", "P", "D", "m", "N_m", "schedule", "s/step", "samples/s", "/device")
    t = Table(*cols, "memory/stage", "idle", *(["$/1k"] if priced else []))
    t.title, t.title_justify = "alternatives", "left"
    for i, a in enumerate(plan.alternatives, 1):
        sched = a.schedule + (" +R" if a.recompute and a.schedule in ("gpipe", "1f1b") else "")
        mem = max(a.memory_per_stage_gb, default=None)
        t.add_row(
            f"#{i}",
            *(str(v) for v in (a.P, a.D, a.micro_batch_size)),
            _num(a.micro_batches, "{}"),
            sched,
            _num(a.step_time_s, "{:.4g}"),
            _num(a.samples_per_s, "{:.1f}"),
            _num(a.samples_per_s_per_device, "{:.1f}"),
            f"<= {human_bytes(mem * 1024**3)}" if mem else "-",
            _num(a.idle_share and 100 * a.idle_share, "{:.0f} %"),
            *([_num(a.cost_per_1k_samples, "${:.4f}")] if priced else []),
        )
    print_fitted(console, t, ALTERNATIVE_DROPS, "`jobctl plan --json`")
    console.print("why not:", highlight=False)
    print_labelled(console, [(f"#{i}", a.why_not) for i, a in enumerate(plan.alternatives, 1)])


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def print_explanation(console: Console, plan: Plan) -> None:
    """The planner's reasoning, one line per decision."""
    console.print(styled("[bold]why this plan[/bold]"))
    for line in plan.explanation:
        console.print(f"  {line}", highlight=False, markup=False)


def calibration_progress(console: Console) -> Progress:
    """Progress bar of ``jobctl calibrate``."""
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        TextColumn("[bold]calibrating[/bold]"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
    )


def print_calibration(console: Console, cal: Calibration, path: Path) -> None:
    """A calibration record: per-block times at each m, links, allreduce, core sharing."""
    fp = cal.fingerprint
    console.print(
        styled(
            "[bold]calibration[/bold] {}",
            f"{fp.key} ({cal.source}, {cal.seconds:.1f} s): {fp.device}, "
            f"torch {fp.torch}, {fp.threads} thread(s); written to {path}",
        ),
    )
    ms = cal.micro_batch_sizes
    heads = [f"F/B m={m} (ms)" for m in ms]
    t = Table("block", "params", "act/sample", *heads)
    for i, b in enumerate(cal.blocks):
        times = [f"{1e3 * cal.forward(i, m):.3g}/{1e3 * cal.backward(i, m):.3g}" for m in ms]
        t.add_row(b.name, f"{b.params:,}", human_bytes(b.act_bytes), *times)
    from jobctl.engine.views.fit import print_fitted

    print_fitted(console, t, ["act/sample", "params", *heads[:0:-1]], str(path))
    link = cal.p2p_intra
    console.print(
        f"point-to-point intra-node ({link.source}): latency {1e6 * link.latency_s:.0f} us, "
        f"{link.bandwidth_Bps / 1e9:.2f} GB/s, jitter {100 * link.jitter:.0f} %; inter-node "
        f"({cal.p2p_inter.source}): {cal.p2p_inter.bandwidth_Bps / 1e9:.2f} GB/s",
    )
    ar = cal.allreduce_intra
    rings = sorted({(p.ring, p.inflight) for p in ar.points})
    console.print(
        f"allreduce intra-node ({ar.source}): rings x in flight {rings}, latency "
        f"{1e6 * ar.latency_s:.0f} us/hop, {ar.bandwidth_Bps / 1e9:.2f} GB/s",
    )
    slow = ", ".join(f"{k}: {v:.2f}x" for k, v in sorted(cal.host.slowdown.items()))
    console.print(f"core sharing ({cal.host.source}, {cal.host.cores} cores): {slow or 'none'}")
    if cal.tp_allreduce is not None:
        _print_tp_allreduce(console, cal.tp_allreduce)
    if cal.runtime is not None:
        _print_runtime(console, cal.runtime)


def _print_tp_allreduce(console: Console, ar: AllreduceCalibration) -> None:
    """Tensor parallelism's activation all-reduce: median time by T and size."""
    by_T = ", ".join(
        f"T={p.ring} {p.bytes / 1024:.0f} KiB {1e3 * p.time.median:.3f} ms"
        for p in sorted(ar.points, key=lambda p: (p.ring, p.bytes))
    )
    console.print(f"tensor-parallel all-reduce ({ar.source}): {by_T}")


def _print_runtime(console: Console, rt: RuntimeCalibration) -> None:
    """The pipeline probes' costs and the machine's drift, warning when it moved."""
    console.print(
        f"runtime ({rt.source}, pipeline probes): {1e3 * rt.action_s:.3f} ms per action, "
        f"{1e3 * rt.message_s:+.3f} ms per message ({1e3 * rt.message_busy_s:+.3f} ms "
        f"with cores shared), {1e3 * rt.step_s:.2f} ms per step; machine "
        f"{100 * (rt.drift - 1):+.0f} % slower during the probes than the block timing "
        "(compute times scaled to the probes)",
    )
    if not rt.steady:
        console.print(
            styled(
                "[yellow]the machine's speed moved during the calibration: plans follow the "
                "probes' speed; run `jobctl calibrate` again at a steadier time if its "
                "predictions are off[/yellow]"
            ),
        )


def human_bytes(n: float) -> str:
    """``1.5 GiB``, ``320 MiB``, ``12 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def hms(seconds: float | None) -> str:
    """``1:02:05`` (hours unbounded); ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def dollars(usd: float | None) -> str:
    if usd is None:
        return "-"
    return f"${usd:,.2f}" if usd >= 1 else f"${usd:.4f}"
