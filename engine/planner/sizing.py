"""The micro-batch size the search starts from, and what would fit memory when nothing
does (Varuna sec. 4.4, step 1 of ``search``)."""

from __future__ import annotations

from jobctl.engine.planner.stage_costs import Tables
from jobctl.spec import HardwareSpec, JobSpec

GB = 1024**3


def gb_text(nbytes: float) -> str:
    """GB to two places, or three figures under 0.01 GB (a tiny stage read "0.00 GB")."""
    gb = nbytes / GB
    return f"{gb:.2f}" if gb >= 0.01 else f"{gb:.3g}"


STOP_GAIN = 0.05  # F(m)/m "stops improving": less than 5 % better at the next m


def choose_m(spec: JobSpec, tables: Tables, max_P: int, cap: float) -> tuple[int, list[str]]:
    """Varuna's m: the lowest m where F(m)/m stops improving, among sizes that fit."""
    explicit, cal = spec.training.micro_batch_size, tables.cal
    ms = sorted(cal.micro_batch_sizes)
    per = {m: cal.per_sample(m) for m in ms}
    table = ", ".join(f"m={m} {1e3 * per[m]:.3g} ms" for m in ms)
    lines = [f"F(m)/m, forward+backward per sample: {table}"]
    if isinstance(explicit, int):
        return explicit, [*lines, f"m={explicit}: explicit training.micro_batch_size"]
    stop = ms[-1]
    for a, b in zip(ms, ms[1:], strict=False):
        if 1 - per[b] / per[a] < STOP_GAIN:
            stop = a
            break
    fitting = [m for m in ms if m <= stop and tables.min_memory(max_P, m) <= cap]
    if not fitting:
        return 1, lines  # nothing fits even at m=1: the P sweep explains
    m = fitting[-1]
    why = f"stops improving by {100 * STOP_GAIN:.0f} % after m={stop}"
    if m != stop:
        why += f"; m={stop} does not fit {spec.hardware.memory_gb} GB on {max_P} stages"
    return m, [*lines, f"m={m}: {why}"]


def fit_hint(hardware: HardwareSpec, tables: Tables, G: int) -> str:
    """What would fit memory when nothing does at this G."""
    mem, n = hardware.memory_gb, tables.cal.num_blocks
    cap = mem * GB
    need = {P: tables.min_memory(P, 1) for P in range(1, n + 1)}
    low = next((P for P in range(1, n + 1) if need[P] <= cap), None)
    if low is None:
        return (
            f"the model does not fit {mem} GB devices even with one block per stage "
            f"(P={n}): the heaviest block needs {gb_text(need[n])} GB with m=1; raise "
            "hardware.memory_gb or use a smaller model"
        )
    if low > G:
        top = min(n, G)
        return (
            f"the model needs at least P={low} stages to fit {mem} GB devices, but only "
            f"G={G} devices are available: add devices (>= {low}), or raise "
            f"hardware.memory_gb to {gb_text(need[top])} GB to fit P={top}"
        )
    return f"P >= {low} stages fit {mem} GB at m=1: lower micro_batch_size or raise P"
