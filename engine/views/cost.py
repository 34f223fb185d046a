"""Money in ``jobctl plan``: wall time and dollars to finish under each pricing (on-demand
and spot side by side), and the time-vs-dollars frontier as a small text picture.

Given computed forecasts (``planner.cost``), never a simulation. Everything fits 80
columns.
"""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from jobctl.engine.planner.cost import Forecast
from jobctl.engine.views.markup import plain, styled
from jobctl.engine.views.prediction import duration
from jobctl.engine.views.tables import dollars

WIDTH, HEIGHT = 52, 8  # the picture's plot area, in characters
MARKS = "abcdefghijklmnopqrstuvwxyz"


def print_costs(
    console: Console, steps: int, found: list[Forecast], paid: str, startup_measured: bool = True
) -> None:
    """Wall time and dollars to finish ``steps`` steps, one column per pricing (start-up
    ``not measured`` until a run on this machine measured it)."""
    t = Table(
        f"to finish {steps} steps",
        *(f"{f.label}{' (paid)' if f.label == paid and len(found) > 1 else ''}" for f in found),
        title="cost",
        title_justify="left",
    )
    t.add_row("devices x $/device-h", *(f"{f.devices} x {dollars(_per(f))}" for f in found))
    t.add_row("$ per hour", *(dollars(f.hourly_usd) for f in found))
    for part in ("start-up", "steps", "checkpoints", "preemptions"):
        if part == "start-up" and not startup_measured:
            t.add_row("  start-up", *("not measured" for _ in found))
            continue
        t.add_row(f"  {part}", *(_time(f.parts.get(part)) for f in found))
    t.add_row("expected preemptions", *(f"{f.preemptions:.2g}" for f in found))
    t.add_row("wall time", *(_time(f.wall_s) for f in found))
    t.add_row(styled("[bold]$ to finish[/bold]"), *(_usd(f) for f in found))
    console.print(t)


def _per(f: Forecast) -> float:
    return f.hourly_usd / f.devices if f.devices else 0.0


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return duration(seconds) if math.isfinite(seconds) else "never"


def _usd(f: Forecast) -> str:
    return dollars(f.usd) if f.finishes else "never finishes"


def frontier_picture(points: list[tuple[float, float]], chosen: int | None) -> list[str]:
    """(wall s, USD) points as a text scatter: letters in order, ``*`` the chosen one;
    wall time across, dollars up. At most ``HEIGHT + 2`` lines of <= 80 columns."""
    if not points:
        return []
    hours = [w / 3600 for w, _ in points]
    usd = [u for _, u in points]
    lo_h, hi_h, lo_u, hi_u = min(hours), max(hours), min(usd), max(usd)
    grid = [[" "] * WIDTH for _ in range(HEIGHT)]
    for i, (h, u) in enumerate(zip(hours, usd, strict=True)):
        x = _scale(h, lo_h, hi_h, WIDTH)
        y = HEIGHT - 1 - _scale(u, lo_u, hi_u, HEIGHT)
        grid[y][x] = "*" if i == chosen else MARKS[i % len(MARKS)]
    label = [f"{dollars(hi_u):>10} |"] + [f"{'':>10} |"] * (HEIGHT - 2) + [f"{dollars(lo_u):>10} |"]
    lines = [label[y] + "".join(row) for y, row in enumerate(grid)]
    lines.append(f"{'':>10} +" + "-" * WIDTH)
    left, right = duration(lo_h * 3600), duration(hi_h * 3600)
    lines.append(f"{'':>12}{left}{right:>{WIDTH - len(left)}}  (wall time)")
    return lines


def _scale(v: float, lo: float, hi: float, n: int) -> int:
    return 0 if hi <= lo else min(n - 1, round((v - lo) / (hi - lo) * (n - 1)))


def print_frontier(
    console: Console, rows: list[tuple[str, Forecast]], chosen: int | None, objective: str
) -> None:
    """The frontier (label, forecast) rows: the picture, then one line per point."""
    if len(rows) < 2:
        return
    console.print(styled("[bold]time vs dollars[/bold] (objective {}; * = chosen):", objective))
    pts = [(f.wall_s, f.usd) for _, f in rows]
    for line in frontier_picture(pts, chosen):
        console.print(plain(line), highlight=False)
    for i, (label, f) in enumerate(rows):
        mark = "*" if i == chosen else MARKS[i % len(MARKS)]
        console.print(
            plain(
                f"  {mark} {label[:40]:<40} {f.devices:>3} dev {_time(f.wall_s):>9} "
                f"{dollars(f.usd):>9}"
            ),
            highlight=False,
        )
