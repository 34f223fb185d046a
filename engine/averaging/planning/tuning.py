"""AvgPipe's profiling-based tuning of (M, N) (sec. 5.2): from one profiled setting,
predict every candidate setting's step and memory per stage, and pick the fastest
that fits ``hardware.memory_gb``.

Symbols as in the paper: the profile ran M = m micro-batches per parallel pipeline and
N = n pipelines; a candidate is M = m*, N = n* (``m_star``, ``n_star``); stage k's
computation T_gpu, blocking communication T_com, bubbles T_bub (eq. 1), total
communication T, utilisation curve phi, memory F_mod (models) and F_dat (data).

What jobctl's runtime changes in the equations (each says so where it is used):

* A rank runs its N pipelines interleaved in one action list, one action at a time
  (``averaging.interleave``), over K = N M micro-batches of B / (D N M) samples, each
  pipeline training on B / N. So a micro-batch's size, and with it (the paper's
  assumption) the utilisation, scales by r = (m n) / (m* n*); the paper's N processes
  per GPU add their utilisations, r = (m n*) / (m* n). Eq. 2's form,
  (T_gpu)* = (T_gpu + int max(r phi - 1, 0) dt) / r, holds for either r.
* Computation at another micro-batch size is measured where the profile timed the
  stage alone at the candidates' sizes (``StageProfile.timed``: t(size), a forward
  and backward of one micro-batch, timed between the profiled batches so both see
  one load); eq. 2 is the fallback where it did not. Eq. 2 holds the work's volume
  fixed and lets a larger micro-batch only raise the utilisation (on a CPU the rate
  achieved against the rate at B samples, ``averaging.profile_rank``): a micro-batch
  r times larger takes the profiled one's seconds until that peak, whatever its
  real cost between. What a larger micro-batch saves on a CPU rank is a fixed cost
  per micro-batch (Python, the executor, small GEMMs' efficiency) beside a cost per
  sample, and the curve missed it: a benchmark run ranked the best measured setting
  (m = 8) sixth of seven. So a profiled micro-batch's in-pipeline seconds
  c = T_gpu / K move by the stage-alone difference, c* = c + t(size*) - t(size),
  and (T_gpu)* = K* c* (``measured``): the in-pipeline overhead stays a cost per
  micro-batch, and c* never falls below t(size*). A size not timed takes t from the
  least-squares line a + b size through the timed ones. On a GPU, where the
  device's busy fraction is the utilisation the paper means, a profile without
  ``timed`` keeps eq. 2.
* One fill and one drain per step over K* = n* m* micro-batches: eqs. 3, 6 and 7
  divide by K* where the paper divides by m*.
* Eq. 4's (T)*: a batch moves the activations of B / D samples at any (M, N), so
  over a network, where bytes cost, (T)* = T. Between the processes of one machine
  (shared memory) a message costs its hand-over and the receiver's wake-up, not its
  few bytes: (T)* = (K* / K) T, the messages' count (the paper's n* / n for its
  N pipelines' messages, with jobctl's M too). ``Profile.per_message`` says which.
* The N optimizer steps and the rule's passes (E1-E3) are computation the paper's
  eq. 2 does not scale with N; they are profiled apart (T_upd) and scaled by n* / n.
* Memory (eq. 8): the N parallel models' state scales by n* / n, the reference's
  weights stay; the data scale with the micro-batch size and with how many
  micro-batches the candidate's list holds at once (its schedule's peak), which for
  1F1B-like lists is the paper's (m n*) / (m* n) with jobctl's r.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jobctl.engine.planner.sizing import GB


@dataclass(frozen=True)
class StageProfile:
    """Stage k's measurements of one batch at the profiled (m, n)."""

    T_gpu: float  # seconds computing forwards and backwards
    T: float  # total seconds of communication (this stage's messages in and out)
    phi: tuple[tuple[float, float], ...]  # the utilisation curve: (seconds, phi) pieces
    T_upd: float  # seconds of the n models' updates (E1-E3)
    F_mod: float  # bytes of the n parallel models' training state
    F_ref: float  # bytes of the reference's weights
    F_dat: float  # bytes of activations at the list's peak
    peak: int  # micro-batches held at that peak
    timed: tuple[tuple[int, float], ...] = ()  # (size, seconds): the stage alone


@dataclass(frozen=True)
class Profile:
    """The profiled setting and its stages (index k - 1 holds GPU k)."""

    m: int
    n: int
    B: int  # samples per replica per batch (B / D)
    stages: tuple[StageProfile, ...]
    per_message: bool = False  # communication costs per message (one machine)


@dataclass(frozen=True)
class Prediction:
    """One candidate's predicted step (the slowest stage's eq. 1) and memory."""

    M: int
    N: int
    size: int  # samples per micro-batch, B / (D N M)
    step_s: float
    T_gpu: float  # of the slowest stage
    T_com: float
    T_bub: float
    T_upd: float
    memory: float  # bytes, the largest stage's (eq. 8)

    @property
    def samples_per_s(self) -> float:
        return self.size * self.M * self.N / self.step_s


def utilisation_scale(m: int, n: int, m_star: int, n_star: int) -> float:
    """r: how the micro-batch size, and so the utilisation, scales from (m, n) to
    (m*, n*) when one process runs the N pipelines' actions in turn."""
    return (m * n) / (m_star * n_star)


def computation(T_gpu: float, phi: tuple[tuple[float, float], ...], r: float) -> float:
    """Eq. 2: (T_gpu)* = (T_gpu + int max(r phi(t) - 1, 0) dt) / r: the same volume
    of work at r times the utilisation, the part above 100 % taking extra time."""
    over = sum(dt * max(r * p - 1.0, 0.0) for dt, p in phi)
    return (T_gpu + over) / r


def seconds_at(timed: tuple[tuple[int, float], ...], size: int) -> float:
    """t(size): the stage alone's forward and backward of a micro-batch of ``size``,
    as timed, else from the least-squares line a + b size through the timings (one
    timing alone: proportional to size)."""
    table = dict(timed)
    if size in table:
        return table[size]
    if len(table) == 1:
        ((s0, t0),) = table.items()
        return t0 * size / s0
    n = len(table)
    mean_s, mean_t = sum(table) / n, sum(table.values()) / n
    var = sum((x - mean_s) ** 2 for x in table)
    b = sum((x - mean_s) * (t - mean_t) for x, t in table.items()) / var
    return mean_t + b * (size - mean_s)


def measured(
    T_gpu: float,
    K: int,
    K_star: int,
    size: int,
    size_star: int,
    timed: tuple[tuple[int, float], ...],
) -> float:
    """(T_gpu)* = K* c* with c* = max(c + t(size*) - t(size), t(size*)) and
    c = T_gpu / K: the profiled micro-batch's in-pipeline seconds moved by the
    measured difference between the sizes (see the module docstring)."""
    t, t_star = seconds_at(timed, size), seconds_at(timed, size_star)
    return K_star * max(T_gpu / K + t_star - t, t_star)


def communication(T_star: float, T_gpu_star: float, K_star: int) -> float:
    """Eqs. 3-4: the first micro-batch's messages block; the other K* - 1 block only
    by what their computation does not hide."""
    return T_star / K_star + (K_star - 1) / K_star * max(T_star - T_gpu_star, 0.0)


def bubbles(T_star: list[float], T_gpu_star: list[float], K_star: int) -> list[float]:
    """Eqs. 5-7: (T_bub)^k = (T_up)^k + (T_down)^k, each stage waiting for one
    micro-batch's communication and computation of every stage above (up) and
    below (down) it."""
    K = len(T_star)
    up, down = [0.0] * K, [0.0] * K
    for k in range(1, K):  # eq. 6
        up[k] = up[k - 1] + (T_star[k - 1] + T_gpu_star[k - 1]) / K_star
    for k in range(K - 2, -1, -1):  # eq. 7
        down[k] = down[k + 1] + (T_star[k + 1] + T_gpu_star[k + 1]) / K_star
    return [u + d for u, d in zip(up, down, strict=True)]


def footprint(s: StageProfile, n: int, n_star: int, r: float, peak_star: int) -> float:
    """Eq. 8: (F)* = (n* / n) F_mod + F_ref + r (peak* / peak) F_dat."""
    return n_star / n * s.F_mod + s.F_ref + r * peak_star / max(s.peak, 1) * s.F_dat


def predict(p: Profile, m_star: int, n_star: int, peaks: list[int]) -> Prediction:
    """Candidate (m*, n*) from profile ``p``; ``peaks``: the micro-batches each stage's
    list for K* = n* m* holds at once."""
    r, K_star = utilisation_scale(p.m, p.n, m_star, n_star), m_star * n_star
    gpu = [_computation(s, p, m_star, n_star, r) for s in p.stages]
    scale = K_star / (p.m * p.n) if p.per_message else 1.0  # eq. 4's (T)*, see above
    T_star = [s.T * scale for s in p.stages]
    com = [communication(t, g, K_star) for t, g in zip(T_star, gpu, strict=True)]
    bub = bubbles(T_star, gpu, K_star)
    upd = [s.T_upd * n_star / p.n for s in p.stages]
    steps = [g + c + b + u for g, c, b, u in zip(gpu, com, bub, upd, strict=True)]
    k = max(range(len(steps)), key=steps.__getitem__)
    mem = max(footprint(s, p.n, n_star, r, pk) for s, pk in zip(p.stages, peaks, strict=True))
    size = p.B // (m_star * n_star)
    return Prediction(m_star, n_star, size, steps[k], gpu[k], com[k], bub[k], upd[k], mem)


def _computation(s: StageProfile, p: Profile, m_star: int, n_star: int, r: float) -> float:
    """Stage ``s``'s (T_gpu)* at (m*, n*): measured where the profile timed the
    sizes, else eq. 2 with the utilisation scale ``r``."""
    K, K_star = p.m * p.n, m_star * n_star
    if s.timed:
        return measured(s.T_gpu, K, K_star, p.B // K, p.B // K_star, s.timed)
    return computation(s.T_gpu, s.phi, r)


@dataclass(frozen=True)
class Tuning:
    """Every candidate's prediction, the pick and why it won."""

    profile: Profile
    rows: tuple[Prediction, ...]
    pick: Prediction
    cap: float  # bytes per device
    reason: str


def tune(
    p: Profile,
    settings: list[tuple[int, int]],
    cap: float,
    peaks_of: Callable[[int], list[int]],
) -> Tuning:
    """Predict every (M, N) of ``settings`` and pick the fastest whose memory fits
    ``cap`` bytes (sec. 5.2.3's constraint); ValueError when none fits."""
    rows = tuple(predict(p, M, n, peaks_of(M * n)) for M, n in settings)
    fits = [row for row in rows if row.memory <= cap]
    if not fits:
        least = min(rows, key=lambda row: row.memory)
        raise ValueError(
            f"no (M, N) fits hardware.memory_gb: the least memory is M={least.M} "
            f"N={least.N} at {least.memory / GB:.3g} GB (raise hardware.memory_gb)"
        )
    pick = min(fits, key=lambda row: row.step_s)
    fastest = min(rows, key=lambda row: row.step_s)
    if fastest is pick:
        reason = "fastest predicted step of all settings, and it fits the memory cap"
    else:
        reason = (
            f"fastest that fits: M={fastest.M} N={fastest.N} would be "
            f"{pick.step_s / fastest.step_s - 1:.0%} faster but needs "
            f"{fastest.memory / GB:.3g} GB > {cap / GB:.3g} GB"
        )
    return Tuning(p, rows, pick, cap, reason)
