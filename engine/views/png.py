"""PNG files of ``jobctl report``: the same charts as the page's inline SVG, via matplotlib.

A chart (engine/views/svg.py: series over shared axes, plus vertical event markers in
their family's colour) becomes one PNG, so the pictures can go into a paper, a ticket
or a chat without the page. The Agg backend writes files only: no display needed.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from jobctl.engine.views.svg import MARKER_COLOURS, Chart  # noqa: E402


def slug(chart: Chart) -> str:
    """File-name part of a chart: ``Throughput per device`` -> ``throughput-per-device``."""
    return "-".join(chart.title.lower().split())


def draw_png(chart: Chart, path: Path) -> Path:
    """Write ``chart`` as a PNG at ``path``; returns the path."""
    fig, ax = plt.subplots(figsize=(chart.width / 100, chart.height / 100), dpi=100)
    for s in chart.series:
        pts = [(x, y) for x, y in zip(s.xs, s.ys, strict=True) if math.isfinite(y)]
        ax.plot([x for x, _ in pts], [y for _, y in pts], color=s.colour, lw=1.5, label=s.name)
    for a, b in chart.gaps:  # no training there (the line breaks at its NaN point)
        ax.axvspan(a, b, color="#eeeeee", zorder=0)
    for m in chart.markers:
        ax.axvline(m.x, color=MARKER_COLOURS.get(m.kind, "#888"), ls="--", lw=1.0, alpha=0.8)
    kinds = sorted({m.kind for m in chart.markers})
    handles = [Line2D([], [], color=MARKER_COLOURS.get(k, "#888"), ls="--", label=k) for k in kinds]
    ax.legend(handles=ax.get_legend_handles_labels()[0] + handles, fontsize=8, loc="best")
    ax.set_title(chart.title)
    ax.set_xlabel(chart.x_label)
    ax.set_ylabel(chart.y_label)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
