"""Draw a simulated step as a Gantt chart (Varuna Fig. 8 style) with matplotlib.

One row per stage, stage 0 on top; forward, recompute, backward and (zero-bubble
schedules) weight-gradient bars in their own colours, each labelled with its
micro-batch when there is room, then the stage's gradient allreduce and optimizer
step. Activation and gradient sends are thin lines under each row, so waiting on the
network is visible too. A schedule with two stages per device (ZB-V,
``simulator.devices``) gets one row per device; its second stage's bars are hatched.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display needed, safe in worker threads and CI

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from jobctl.engine.planner.simulator.devices import DeviceSimResult  # noqa: E402
from jobctl.engine.planner.simulator.simulation import SimEvent, SimResult  # noqa: E402

COLOURS = {
    "F": "#4C78A8",  # forward
    "R": "#F2B701",  # recompute
    "B": "#54A24B",  # backward (the input gradient only where the stage has W's)
    "W": "#B279A2",  # weight gradients of a split backward (zero bubble)
    "allreduce": "#E45756",
    "optimizer": "#9D9D9D",
    "send": "#333333",
}
ROW = 0.8  # bar height in row units


LABELS = {
    "F": "forward",
    "R": "recompute",
    "B": "backward",
    "W": "weight grad",
    "allreduce": "allreduce",
    "optimizer": "optimizer",
    "send": "send (line)",
}


LEGEND_IN = 0.35  # inches under the axes for the legend's one row


def draw_gantt(
    result: SimResult | DeviceSimResult, path: Path, title: str = "", unit: str = "s"
) -> Path:
    """Write the timeline of ``result`` to ``path`` (PNG, SVG or PDF by suffix)."""
    P = len(result.busy)
    events, row, second = _rows(result)
    width = min(24.0, max(8.0, 0.12 * len(events) / max(P, 1) + 6))
    height = 1.2 + 0.55 * P + LEGEND_IN
    fig, ax = plt.subplots(figsize=(width, height), dpi=120)
    span = result.step_time or 1.0
    for e, up in zip(events, second, strict=True):
        _draw_event(ax, e, P - 1 - e.stage, span, hatch="//" if up else None)
    ax.set_yticks(range(P), [f"{row} {P - 1 - y}" for y in range(P)])
    ax.set_xlim(0, span * 1.01)
    ax.set_ylim(-0.7, P - 0.3)
    ax.set_xlabel(f"time ({unit})")
    bubble = f"idle {100 * result.idle_share:.1f} %"
    ax.set_title(title or f"simulated step: {span:.4g} {unit}, {bubble}")
    # The legend on a strip of its own under the axes: anchored to the axes, it sat on
    # the x-axis label at some P (#47).
    fig.legend(
        handles=[Patch(color=COLOURS[k], label=v) for k, v in _shown(result).items()],
        loc="lower center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=7,
        fontsize=8,
        frameon=False,
    )
    return save_figure(fig, ax, path, bottom=LEGEND_IN / height)


def save_figure(fig, ax, path: Path, bottom: float = 0.0) -> Path:
    """Grid, lay out (above the ``bottom`` fraction of the figure, kept for a legend)
    and write a timeline figure to ``path`` (its folder made), then close it (pyplot
    keeps every open figure alive otherwise)."""
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _rows(result: SimResult | DeviceSimResult) -> tuple[list[SimEvent], str, list[bool]]:
    """The bars (``stage``: the row), the rows' name, and which bars are a device's
    second stage (ZB-V's way back up: stage >= the number of devices)."""
    if not isinstance(result, DeviceSimResult):
        return result.events, "stage", [False] * len(result.events)
    P = len(result.busy)
    events = [SimEvent(e.device, e.placed.action, e.start, e.end) for e in result.events]
    return events, "device", [e.placed.stage >= P for e in result.events]


def _shown(result: SimResult | DeviceSimResult) -> dict[str, str]:
    """The legend: W only where a stage splits its backward."""
    split = any(e.action is not None and e.action.op.value == "W" for e in _rows(result)[0])
    return {k: v for k, v in LABELS.items() if k != "W" or split}


def _draw_event(ax: Axes, e: SimEvent, y: float, span: float, hatch: str | None = None) -> None:
    """One compute/allreduce/optimizer bar, or one send line under its row."""
    if e.end <= e.start:
        return
    if e.kind.startswith("send"):
        ax.plot([e.start, e.end], [y - ROW / 2 - 0.05] * 2, color=COLOURS["send"], lw=0.8)
        return
    key = e.action.op.value if e.kind == "compute" else e.kind
    ax.barh(
        y,
        e.end - e.start,
        left=e.start,
        height=ROW,
        color=COLOURS[key],
        edgecolor="white",
        hatch=hatch,
    )
    if e.kind == "compute" and (e.end - e.start) / span > 0.012:
        label = f"{key}{e.action.micro_batch}"
        mid = (e.start + e.end) / 2
        ax.text(mid, y, label, ha="center", va="center", fontsize=7, color="white")
