"""``jobctl plan``'s AvgPipe (M, N) table: every setting the tuner predicted
(``averaging.planning.tuning``, profiled by ``averaging.tuning``), its step split as
eq. 1 (computation, blocking communication, bubbles, the N updates), samples/s and
memory (eq. 8), the pick and why it won; plain lines within 80 columns."""

from __future__ import annotations

import textwrap

from rich.console import Console

from jobctl.engine.averaging.planning.tuning import Tuning

WIDTH = 80
HEAD = f"{'M':>4}{'N':>3}{'m':>5}{'step ms':>9}{'gpu':>7}{'com':>7}{'bub':>7}{'upd':>7}"
HEAD += f"{'smp/s':>8}{'mem MB':>9}{'fits':>6}  pick"


def tuning_lines(t: Tuning) -> list[str]:
    """The table's lines, fastest predicted first."""
    p = t.profile
    out = [
        f"AvgPipe (M, N) tuning: profiled M={p.m} N={p.n} for 20 batches; "
        f"memory cap {t.cap / 2**20:.0f} MB",
        HEAD,
    ]
    for r in sorted(t.rows, key=lambda row: row.step_s):
        ms = [f"{1e3 * x:>7.1f}" for x in (r.T_gpu, r.T_com, r.T_bub, r.T_upd)]
        fits = "yes" if r.memory <= t.cap else "no"
        mark = "  <-" if r is t.pick else ""
        out.append(
            f"{r.M:>4}{r.N:>3}{r.size:>5}{1e3 * r.step_s:>9.1f}{''.join(ms)}"
            f"{r.samples_per_s:>8.1f}{r.memory / 2**20:>9.1f}{fits:>6}{mark}"
        )
    why = f"pick M={t.pick.M} N={t.pick.N} (m={t.pick.size}): {t.reason}"
    out += textwrap.wrap(why, WIDTH)
    timed = all(s.timed for s in p.stages)
    gpu = "the stage alone timed at that m" if timed else "eq. 2's utilisation curve"
    note = (
        "m: samples per micro-batch, B / (D N M); step = the slowest stage's gpu + com + "
        f"bub + upd (AvgPipe eqs. 1-7; gpu: the profiled pipeline's computation, moved "
        f"to each m by {gpu}; upd: the N optimizer steps and pulls); mem: the "
        "largest stage's models and activations (eq. 8)."
    )
    return out + textwrap.wrap(note, WIDTH)


def print_tuning(console: Console, t: Tuning) -> None:
    """The table on ``console``."""
    for line in tuning_lines(t):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
