"""A Mobius step drawn with its swaps: per rank, compute beside the tier's transfers.

``gantt_lines`` is the terminal picture (80 columns): per rank a compute lane (F
forward, B backward with its recompute, X the last stage's forward and backward) and
a swap lane (U upload waited for, P prefetch under compute, o activation offload,
r reload, D gradients or updated state down, u the optimizer update on upload), each
cell the glyph that covers most of its time. ``draw_mobius_gantt`` writes the same
as a PNG/SVG: compute bars labelled with their stage, and under them a thinner lane
of transfers in their own colours and hatches. Given a simulated step
(``mobius.planning.simulator``), never a simulation.
"""

from __future__ import annotations

from pathlib import Path

from jobctl.engine.mobius.planning.simulator import MobiusSimResult, SwapEvent

GLYPHS = {
    "F": "F",
    "B": "B",
    "FB": "X",
    "upload": "U",
    "prefetch": "P",
    "offload": "o",
    "reload": "r",
    "download": "D",
    "update": "u",
}
COMPUTE = ("F", "B", "FB")
COLOURS = {
    "F": "#4C78A8",
    "B": "#54A24B",
    "FB": "#72B7B2",
    "upload": "#E45756",
    "prefetch": "#F58518",
    "offload": "#B279A2",
    "reload": "#FF9DA6",
    "download": "#9D755D",
    "update": "#9D9D9D",
}
HATCH = {"upload": "xx", "prefetch": "//", "offload": "..", "reload": "\\\\", "download": "--"}
LABELS = {
    "F": "forward",
    "B": "backward (+recompute)",
    "FB": "last stage F+B",
    "upload": "upload (waited)",
    "prefetch": "prefetch",
    "offload": "act. offload",
    "reload": "act. reload",
    "download": "down (grads, state)",
    "update": "update",
}


def _lane(events: list[SwapEvent], cols: int, span: float, idle: str) -> str:
    """One lane of ``cols`` cells: each the glyph of the kind covering most of it."""
    cells = []
    width = span / cols
    for c in range(cols):
        a, b = c * width, (c + 1) * width
        cover: dict[str, float] = {}
        for e in events:
            got = min(b, e.end) - max(a, e.start)
            if got > 0:
                cover[e.kind] = cover.get(e.kind, 0.0) + got
        cells.append(GLYPHS[max(cover, key=cover.get)] if cover else idle)
    return "".join(cells)


def gantt_lines(result: MobiusSimResult, width: int = 80) -> list[str]:
    """The step as text lines of at most ``width`` columns (see the module doc)."""
    cols = width - 8
    span = result.step_time or 1.0
    out = []
    for r in range(len(result.busy)):
        mine = [e for e in result.events if e.rank == r]
        busy = [e for e in mine if e.kind in COMPUTE]
        moves = [e for e in mine if e.kind not in COMPUTE]
        out.append(f"r{r:<3}cmp " + _lane(busy, cols, span, "."))
        out.append(f"{'':<4}swp " + _lane(moves, cols, span, " "))
    end = f"{span:.3g} s"
    out.append(f"{'':<8}0{end:>{cols - 1}}")
    out.append("F fwd B bwd X last F+B | U upload P prefetch o/r acts off/on D down u update")
    return [line[:width] for line in out]


def _draw_event(ax, e, N: int, span: float) -> None:
    """One event's bar on its rank's lane (compute tall, transfers thin), labelled with
    its stage where the bar is wide enough to read."""
    if e.end <= e.start:
        return
    y, big = N - 1 - e.rank, e.kind in COMPUTE
    bar = {"height": 0.5 if big else 0.22, "color": COLOURS[e.kind], "edgecolor": "white"}
    ax.barh(
        y + (0.12 if big else -0.3), e.end - e.start, left=e.start, **bar, hatch=HATCH.get(e.kind)
    )
    if big and (e.end - e.start) / span > 0.015:
        ax.text(
            (e.start + e.end) / 2,
            y + 0.12,
            str(e.stage),
            ha="center",
            va="center",
            fontsize=7,
            color="white",
        )


def draw_mobius_gantt(result: MobiusSimResult, path: Path, title: str = "") -> Path:
    """Write the step to ``path`` (PNG, SVG or PDF by suffix)."""
    # views.gantt holds matplotlib (on Agg: files only); imported here, so the text
    # lanes of `jobctl plan` do not load it
    from jobctl.engine.views.gantt import Patch, plt, save_figure

    N, span = len(result.busy), result.step_time or 1.0
    fig, ax = plt.subplots(figsize=(min(24.0, 8 + 0.05 * len(result.events)), 1.6 + N), dpi=120)
    for e in result.events:
        _draw_event(ax, e, N, span)
    ax.set_yticks(range(N), [f"rank {N - 1 - y}" for y in range(N)])
    ax.set_xlim(0, span * 1.01)
    ax.set_ylim(-0.6, N - 0.3)
    ax.set_xlabel("time (s)")
    ax.set_title(title or f"Mobius step: {span:.4g} s, idle {100 * result.idle_share:.1f} %")
    shown = {e.kind for e in result.events}
    handles = [
        Patch(facecolor=COLOURS[k], hatch=HATCH.get(k), label=v)
        for k, v in LABELS.items()
        if k in shown
    ]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.3),
        ncol=5,
        fontsize=8,
        frameon=False,
    )
    return save_figure(fig, ax, path)
