"""Inline SVG line charts for ``jobctl report``: no scripts, no fonts, no network assets.

A chart is one or more series (polylines; each point also listed in ``data-points``
so tests and tools can count them) over shared axes, with vertical event markers
(Varuna Fig. 10 style: morphs, preemptions, checkpoints, uploads) that carry their
description as an SVG ``<title>`` (shown on hover).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

from jobctl.engine.supervise.report_data import Marker

MARKER_COLOURS = {
    "checkpoint": "#54A24B",
    "upload": "#72B7B2",
    "preemption": "#E45756",
    "morph": "#F58518",
    "recovery": "#B279A2",
    "adopt": "#4C78A8",
    "straggler": "#9D755D",
    "stop": "#333333",
    "resume": "#4C78A8",
}


@dataclass
class Series:
    """One polyline: its points, colour and CSS class."""

    name: str
    xs: list[float]
    ys: list[float]
    colour: str = "#4C78A8"
    css: str = ""


@dataclass
class Chart:
    """Series over shared axes with vertical event markers, drawn ``width`` x ``height``."""

    title: str
    x_label: str
    y_label: str
    series: list[Series]
    markers: list[Marker] = field(default_factory=list)
    gaps: list[tuple[float, float]] = field(default_factory=list)  # shaded: no training
    width: int = 960
    height: int = 280


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.4g}"


@dataclass(frozen=True)
class _Frame:
    """The plot area of a chart (pixels) and the data range it spans."""

    left: float
    top: float
    pw: float
    ph: float
    x0: float
    x1: float
    y0: float
    y1: float

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * self.pw

    def py(self, y: float) -> float:
        return self.top + self.ph - (y - self.y0) / (self.y1 - self.y0) * self.ph


def _frame(chart: Chart) -> _Frame:
    """The data range of every finite point and marker, the y axis from 0 when the
    data sits well above it."""
    left, right, top, bottom = 64, 16, 28, 44
    pts = [(x, y) for s in chart.series for x, y in zip(s.xs, s.ys, strict=True)]
    finite = [(x, y) for x, y in pts if math.isfinite(x) and math.isfinite(y)]
    xs = [x for x, _ in finite] + [m.x for m in chart.markers]
    ys = [y for _, y in finite]
    x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
    y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if y0 > 0 and y0 < 0.5 * y1:
        y0 = 0.0
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    pw, ph = chart.width - left - right, chart.height - top - bottom
    return _Frame(left, top, pw, ph, x0, x1, y0, y1)


def render(chart: Chart) -> str:
    """The chart as an ``<svg>`` element (HTML5 inline SVG)."""
    W, H, f = chart.width, chart.height, _frame(chart)
    left, top, pw, ph = f.left, f.top, f.pw, f.ph
    out = [
        f'<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img">',
        f"<title>{escape(chart.title)}</title>",
        f'<text x="{left}" y="18" class="ct">{escape(chart.title)}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="plot"/>',
    ]
    for t in _ticks(f.y0, f.y1):
        y = f.py(t)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="yt">{_fmt(t)}</text>')
    for t in _ticks(f.x0, f.x1, 8):
        x = f.px(t)
        out.append(f'<text x="{x:.1f}" y="{top + ph + 16}" class="xt">{_fmt(t)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{H - 6}" class="xl">{escape(chart.x_label)}</text>')
    out.append(
        f'<text transform="translate(14 {top + ph / 2}) rotate(-90)" class="xl">'
        f"{escape(chart.y_label)}</text>"
    )
    out += _gap_rects(chart, f)
    out += _marker_lines(chart, f)
    out += _polylines(chart, f)
    out.append(_legend(chart, left + pw))
    out.append("</svg>")
    return "\n".join(out)


def _marker_lines(chart: Chart, f: _Frame) -> list[str]:
    """A dashed vertical line per marker, its label as the hover title."""
    out = []
    for m in chart.markers:
        x, colour = f.px(m.x), MARKER_COLOURS.get(m.kind, "#888")
        out.append(
            f'<line class="marker marker-{escape(m.kind)}" data-kind="{escape(m.kind)}" '
            f'x1="{x:.1f}" x2="{x:.1f}" y1="{f.top}" y2="{f.top + f.ph}" stroke="{colour}">'
            f"<title>{escape(m.label)}</title></line>"
        )
    return out


def _gap_rects(chart: Chart, f: _Frame) -> list[str]:
    """A shaded band over each stretch with no training (its length as the title)."""
    return [
        f'<rect class="gap" x="{f.px(a):.1f}" y="{f.top}" width="{f.px(b) - f.px(a):.1f}" '
        f'height="{f.ph}" fill="#eeeeee"><title>no training for {b - a:.0f} s</title></rect>'
        for a, b in chart.gaps
    ]


def _segments(xs: list[float], ys: list[float]) -> list[list[tuple[float, float]]]:
    """The runs of finite points between non-finite ones (a NaN breaks the line)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in zip(xs, ys, strict=True):
        if math.isfinite(x) and math.isfinite(y):
            runs[-1].append((x, y))
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def _polylines(chart: Chart, f: _Frame) -> list[str]:
    """A polyline per series and unbroken run of its points, their count in
    ``data-points`` (a gap in the training is a gap in the line, not a flat bridge)."""
    out = []
    for s in chart.series:
        for run in _segments(s.xs, s.ys):
            coords = [f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in run]
            out.append(
                f'<polyline class="series {escape(s.css)}" data-name="{escape(s.name)}" '
                f'data-points="{len(coords)}" fill="none" stroke="{s.colour}" '
                f'stroke-width="1.5" points="{" ".join(coords)}">'
                f"<title>{escape(s.name)}</title></polyline>"
            )
    return out


def _legend(chart: Chart, right_edge: float) -> str:
    items = [(s.name, s.colour) for s in chart.series]
    items += [(k, MARKER_COLOURS.get(k, "#888")) for k in sorted({m.kind for m in chart.markers})]
    parts, x = [], right_edge
    for name, colour in reversed(items):
        x -= 14 + 7 * len(name)
        parts.append(
            f'<rect x="{x:.0f}" y="8" width="10" height="10" fill="{colour}"/>'
            f'<text x="{x + 13:.0f}" y="17" class="lg">{escape(name)}</text>'
        )
    return "".join(parts)
