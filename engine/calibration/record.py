"""The calibration record: primitive costs of one model on one device (Varuna Table 2).

Per cut-point (model block) i and micro-batch size m: forward, forward without autograd
(the first pass of a recomputed micro-batch), and backward time, plus the block's
parameter, training-state, activation and boundary (send) bytes and its peak memory;
per link kind (same node, across nodes): point-to-point time by message size; allreduce
time by ring size and message size, also with several allreduces in flight; how much
k busy processes slow each other down on one host; the time to fetch a micro-batch of
data; the all-reduce of a tensor-parallel group's activations by T and size
(``tp_allreduce``, where the model admits a T > 1). Every number has a unit
(``units``), measured ones a sample count and spread.

Nothing here depends on the number of devices G: one record plans any G (Varuna's
scale-invariant calibration). Each value says where it came from (``source``):
``measured`` with torch on this machine, or ``analytic`` from the hardware spec. The
record is keyed by a ``Fingerprint`` of model, device, torch version and threads;
``cache`` stores and finds records under the state home.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import statistics
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CALIBRATION_VERSION = 10  # 2: the runtime's own costs (``runtime``); 3: + compute, load;
# 4: loads are compute demand (plain simulation), no longer fitted along with the message;
# 5: solo, 2-stage and 4-stage probes; 6: allreduce timed as the runtime's gradient sync;
# 7: the busy probe's message fit no longer rides on the busy ping-pong; probe rounds, drift
# 8: compute times at the probes' machine speed (drift), probes taken as measured;
# 9: each probe's step-to-step spread (step_cv), for data-parallel replicas' skew;
# 10: the data source is no longer in the model hash (``data_source`` says what ``data``
# was measured with), so a job that changes it keeps its measured compute
UNITS = {"time": "s", "bytes": "B", "bandwidth": "B/s"}
STEADY_DRIFT = 1.10  # probes this much slower or faster than the block timing: unsteady
Source = Literal["measured", "analytic"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Stat(_Frozen):
    """A measured quantity: median, interquartile range and sample count."""

    median: float
    iqr: float = Field(0.0, description="75th minus 25th percentile, same unit as median")
    n: int = Field(1, description="number of samples (1 for analytic values)")

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stat:
        """Median and IQR of ``samples`` (at least one)."""
        xs = sorted(samples)
        if len(xs) < 2:
            return cls(median=xs[0], iqr=0.0, n=len(xs))
        q = statistics.quantiles(xs, n=4, method="inclusive")
        return cls(median=statistics.median(xs), iqr=q[2] - q[0], n=len(xs))

    @property
    def rel_std(self) -> float:
        """Relative standard deviation estimated from the IQR (normal: IQR = 1.349 std)."""
        return self.iqr / 1.349 / self.median if self.median > 0 else 0.0


def _interpolate(points: dict[int, float], x: float) -> float:
    """Piecewise linear in x through ``points``; proportional beyond the largest x."""
    xs = sorted(points)
    if x <= xs[0]:
        return points[xs[0]] * x / xs[0]
    if x >= xs[-1]:
        return points[xs[-1]] * x / xs[-1]
    k = bisect.bisect_left(xs, x)
    x0, x1 = xs[k - 1], xs[k]
    w = (x - x0) / (x1 - x0)
    return points[x0] * (1 - w) + points[x1] * w


class BlockCalibration(_Frozen):
    """One cut-point section (block): its sizes and its compute times by micro-batch size."""

    name: str
    params: int = Field(description="parameter elements")
    param_bytes: float = Field(description="bytes of the weights (and of their gradients)")
    state_bytes: float = Field(description="weights, gradients and optimizer state, bytes")
    tied_bytes: float = Field(0.0, description="bytes of weights tied to another block")
    act_bytes: float = Field(description="activation bytes kept for backward, per sample")
    boundary_bytes: float = Field(description="bytes of the block's output per sample")
    forward: dict[int, Stat] = Field(description="m -> forward seconds, autograd graph kept")
    forward_nograd: dict[int, Stat] = Field(description="m -> forward seconds, no graph")
    backward: dict[int, Stat] = Field(description="m -> backward seconds")
    optimizer: Stat = Field(description="seconds of one optimizer step over the block")
    peak_bytes: dict[int, float] = Field(description="m -> peak bytes during forward+backward")


class LinkCalibration(_Frozen):
    """Point-to-point message time on one kind of link: ``time(bytes)``."""

    source: Source
    latency_s: float = Field(description="fitted per-message latency, s")
    bandwidth_Bps: float = Field(description="fitted bandwidth, B/s")  # noqa: N815
    points: dict[int, Stat] = Field(
        default_factory=dict, description="bytes -> one-way seconds (measured sizes)"
    )
    busy_points: dict[int, Stat] = Field(
        default_factory=dict,
        description="bytes -> one-way seconds while busy_ranks other processes compute",
    )
    busy_ranks: int = Field(0, description="processes computing during busy_points")

    def time(self, nbytes: float, busy: bool = False) -> float:
        """Seconds to move ``nbytes``: interpolated between measured sizes, else the fit.

        ``busy``: the host's cores are oversubscribed, so a waiting receiver may wait
        for a core too (the measured busy times, where there are any).
        """
        points = self.busy_points if busy and self.busy_points else self.points
        fit = self.latency_s + nbytes / self.bandwidth_Bps
        if not points:
            return fit
        if len(points) < 2 or not min(points) <= nbytes <= max(points):
            nearest = min(points, key=lambda x: abs(x - nbytes))
            return points[nearest].median - self.latency_s - nearest / self.bandwidth_Bps + fit
        return _interpolate({k: v.median for k, v in points.items()}, nbytes)

    @property
    def jitter(self) -> float:
        """Median relative spread of the measured sizes (0 for analytic links)."""
        return statistics.median(p.rel_std for p in self.points.values()) if self.points else 0.0


class AllreducePoint(_Frozen):
    """One measured allreduce: ``inflight`` disjoint rings of ``ring`` ranks at once."""

    ring: int
    inflight: int
    bytes: int
    time: Stat


class AllreduceCalibration(_Frozen):
    """Allreduce time by ring size, message size and number of allreduces in flight.

    Measured points are used where the ring size and in-flight count were measured
    (interpolating in bytes); elsewhere the ring model ``2(D-1) * latency +
    2(D-1)/D * bytes / bandwidth``, with the bandwidth shared by the allreduces in flight.
    """

    source: Source
    latency_s: float
    bandwidth_Bps: float  # noqa: N815
    points: list[AllreducePoint] = Field(default_factory=list)

    def time(self, ring: int, nbytes: float, inflight: int = 1) -> float:
        """Seconds for an allreduce of ``nbytes`` over ``ring`` ranks."""
        if ring <= 1:
            return 0.0
        inflight = max(1, inflight)
        measured = [p for p in self.points if p.ring == ring and p.inflight <= inflight]
        if not measured:
            return self._model(ring, inflight)(nbytes)
        k = max(p.inflight for p in measured)
        table = {p.bytes: p.time.median for p in measured if p.inflight == k}
        # More allreduces in flight than measured: they share what k of them got.
        return inflight / k * _interpolate_bytes(table, nbytes, self._model(ring, 1))

    def _model(self, ring: int, inflight: int):
        steps = 2 * (ring - 1)
        return lambda n: steps * self.latency_s + steps / ring * n * inflight / self.bandwidth_Bps


def _interpolate_bytes(points: dict[int, float], x: float, model) -> float:
    """Linear between measured sizes; the model, shifted to the nearest point, outside."""
    xs = sorted(points)
    if x <= xs[0]:
        return max(0.0, points[xs[0]] - model(xs[0]) + model(x))
    if x >= xs[-1]:
        return points[xs[-1]] - model(xs[-1]) + model(x)
    k = bisect.bisect_left(xs, x)
    x0, x1 = xs[k - 1], xs[k]
    return points[x0] + (points[x1] - points[x0]) * (x - x0) / (x1 - x0)


class HostCalibration(_Frozen):
    """How busy processes on one host slow each other (CPU devices share cores)."""

    source: Source
    cores: int = Field(description="cores the worker processes may run on")
    slowdown: dict[int, float] = Field(
        description="k processes computing at once -> time factor of each (1 = no slowdown)"
    )

    def factor(self, busy: float) -> float:
        """Time factor with ``busy`` processes computing (fractional: interpolated)."""
        if busy <= 1 or not self.slowdown:  # nothing measured or modelled: no sharing
            return 1.0
        pts = {1: 1.0, **self.slowdown}
        k_max = max(pts)
        if busy > k_max:  # beyond what was measured, cores are shared evenly
            return pts[k_max] * busy / k_max
        return _interpolate(pts, busy)


class RuntimeCalibration(_Frozen):
    """What the runtime pays beyond compute and the wire, from a real pipeline probe.

    ``measure.probe`` runs 1F1B over the job's model with the runtime's own
    executor and the trainer's per-step work, on one stage (``solo``), two and four;
    ``measure.fit`` simulates the same runs with the calibrated compute and links.
    ``action_s``: what each forward, recompute and backward of the executor takes beyond
    the calibrated time of its blocks (the solo run beyond its calibrated compute: data
    fetch, autograd set-up, the loss, bookkeeping); a per-action cost, as the probe at
    the smallest micro-batch showed (a factor found there over-predicted larger
    micro-batches by a third). ``step_s``: each rank's fixed work per step outside the
    schedule (seeding, zero_grad, metric lines, and the optimizer step beyond its
    calibrated per-block cost). ``message_s`` is the extra time per message that makes
    the simulated 2-stage pipeline match the measured one: waking a receiver that
    blocked (its core idle), the executor's per-message bookkeeping; negative where the
    runtime's channel (shared memory) is cheaper than the ping-pong measured over gloo,
    never below a free send. ``message_busy_s``
    is the same for the 4-stage one (more processes than cores on small hosts: a woken
    process, or the one it preempts, waits for a core).
    ``load_idle`` / ``load_busy``: each probe's compute demand (processes computing at
    once, on average, in its plain simulation with the idle message time); a plan's
    messages cost what its own demand, taken the same way, says (``message_at``). If
    the busy probe's demand is not above the idle one's (slow messages lower demand),
    every message costs the idle time. ``step_cv`` / ``step_cv_busy``: how much one
    rank's run of the schedule varies from step to step in each probe (relative
    standard deviation, from the interquartile range); data-parallel replicas start
    their gradient sum when the slowest of them is done (``cv_at``, ``replica_skew``).
    """

    source: Source
    message_s: float = Field(
        0.0, description="extra seconds per message, cores to spare (< 0: cheaper than the link)"
    )
    message_busy_s: float = Field(0.0, description="extra seconds per message, cores shared")
    step_s: float = Field(0.0, description="fixed seconds per step on every rank")
    action_s: float = Field(0.0, description="extra seconds per forward/backward action")
    load_idle: float = Field(0.0, description="mean processes computing, idle probe")
    load_busy: float = Field(0.0, description="mean processes computing, busy probe")
    step_cv: float = Field(0.0, description="relative spread of a step's run, idle probe")
    step_cv_busy: float = Field(0.0, description="relative spread of a step's run, busy probe")
    drift: float = Field(
        1.0,
        description="the model's time during the probes over that while the blocks were "
        "timed (> 1: the machine ran slower; every compute time was multiplied by it)",
    )
    probe: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="per probe phase: measured and simulated seconds of its pipeline run",
    )

    @property
    def speed_moved(self) -> float:
        """How far the machine's speed moved between block timing and probes: |log drift|
        (a run 10 % slower and one 10 % faster count about alike)."""
        return abs(math.log(self.drift))

    @property
    def steady(self) -> bool:
        """Whether the machine kept its speed within ``STEADY_DRIFT`` during calibration."""
        return self.speed_moved <= math.log(STEADY_DRIFT)

    def message(self, busy: bool) -> float:
        return self.message_busy_s if busy else self.message_s

    def message_at(self, load: float) -> float:
        """Extra seconds per message when ``load`` processes compute at once on average:
        linear between the two probes' loads, held at their values outside."""
        return self._at(load, self.message_s, self.message_busy_s)

    def cv_at(self, load: float) -> float:
        """A rank's step-to-step spread at ``load``, between the probes' as ``message_at``."""
        return self._at(load, self.step_cv, self.step_cv_busy)

    def _at(self, load: float, idle: float, busy: float) -> float:
        if self.load_busy <= self.load_idle:
            return idle
        w = min(1.0, max(0.0, (load - self.load_idle) / (self.load_busy - self.load_idle)))
        return idle + w * (busy - idle)


class Fingerprint(_Frozen):
    """What a calibration is valid for; any change means measuring again."""

    model: str = Field(description="sha256 of the model, precision, optimizer and data source")
    device: str = Field(description="device type and name, e.g. 'cpu:AMD EPYC x2'")
    torch: str = Field(description="torch version")
    threads: int = Field(description="intra-op threads per worker process")

    @property
    def key(self) -> str:
        """Short stable id of the fingerprint (the cache file name)."""
        raw = json.dumps(self.model_dump(), sort_keys=True).encode()
        return hashlib.sha256(raw).hexdigest()[:16]


class Calibration(_Frozen):
    """A versioned calibration record; see the module docstring."""

    version: int = CALIBRATION_VERSION
    source: Source = Field(description="measured: compute measured here; analytic: from spec")
    fingerprint: Fingerprint
    created: float = Field(description="unix time of the measurement")
    seconds: float = Field(0.0, description="how long calibrating took, s")
    units: dict[str, str] = Field(default_factory=lambda: dict(UNITS))
    micro_batch_sizes: list[int] = Field(description="the m values compute was measured at")
    blocks: list[BlockCalibration]
    data: dict[int, Stat] = Field(description="m -> seconds to fetch one micro-batch of m")
    data_source: str | None = Field(
        None, description="the data.source ``data`` was measured with (None: analytic)"
    )
    p2p_intra: LinkCalibration
    p2p_inter: LinkCalibration
    allreduce_intra: AllreduceCalibration
    allreduce_inter: AllreduceCalibration
    host: HostCalibration
    runtime: RuntimeCalibration | None = Field(
        None, description="the runtime's own per-message and per-step costs (measured only)"
    )
    tp_allreduce: AllreduceCalibration | None = Field(
        None,
        description="tensor parallelism's activation all-reduces in one node, by T (ring) "
        "and bytes (measured where a T > 1 is admissible; None: the intra-node model)",
    )

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.blocks]

    def forward(self, i: int, m: float, graph: bool = True) -> float:
        """Forward seconds of block i at micro-batch size m."""
        table = self.blocks[i].forward if graph else self.blocks[i].forward_nograd
        return _interpolate({k: s.median for k, s in table.items()}, m)

    def backward(self, i: int, m: float) -> float:
        """Backward seconds of block i at micro-batch size m."""
        return _interpolate({k: s.median for k, s in self.blocks[i].backward.items()}, m)

    def data_time(self, m: float) -> float:
        """Seconds to fetch one micro-batch of m samples."""
        return _interpolate({k: s.median for k, s in self.data.items()}, m) if self.data else 0.0

    def per_sample(self, m: int) -> float:
        """Forward + backward seconds of the whole model per sample at m (Varuna F(m)/m)."""
        total = sum(self.forward(i, m) + self.backward(i, m) for i in range(self.num_blocks))
        return total / m

    def link(self, same_node: bool) -> LinkCalibration:
        return self.p2p_intra if same_node else self.p2p_inter

    def allreduce(self, same_node: bool) -> AllreduceCalibration:
        return self.allreduce_intra if same_node else self.allreduce_inter

    @property
    def jitter(self) -> float:
        """Relative spread of point-to-point times, for the simulator's send jitter."""
        return self.p2p_intra.jitter
