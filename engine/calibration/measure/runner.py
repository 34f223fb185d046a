"""``calibrate``: measure a job's model and this machine once, and cache the record.

Compute is measured in this process (one block at a time, at every micro-batch size
the planner may pick); communication and core sharing in a small process group
(``comm``); inter-node values, which one machine cannot measure, come from
the spec's interconnect and are marked ``analytic``. The record is saved under the
state home, keyed by its fingerprint, and ``jobctl plan`` reuses it for any G.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from jobctl.engine.calibration.analytic import allreduce_from_spec, host_from_spec, link_from_spec
from jobctl.engine.calibration.cache import DEFAULT_THREADS, fingerprint, save
from jobctl.engine.calibration.measure.comm import measure_comm
from jobctl.engine.calibration.measure.compute import measure_blocks, measure_data
from jobctl.engine.calibration.measure.fit import calibrate_runtime
from jobctl.engine.calibration.measure.graph_compute import measure_graph_blocks
from jobctl.engine.calibration.measure.probe import model_seconds
from jobctl.engine.calibration.measure.tp_allreduce import measure_tp_allreduce
from jobctl.engine.calibration.record import BlockCalibration, Calibration, Stat
from jobctl.engine.model.blocks import Stage, model_def, returns_list
from jobctl.engine.planner.partition import partition
from jobctl.spec import HardwareSpec, JobSpec, dump_yaml

Progress = Callable[[str, float], None]  # (what is being measured, fraction done)
MAX_MICRO_BATCH = 32
MAX_SIZES = 10
PROBE_MICRO_BATCHES = 4  # of the pipeline probe (calibration_probe)
BUSY_PROBE_STAGES = 4  # the probe's pipeline when the group has that many ranks
# Block timings are taken in this many passes, 2 x ``repeats`` timed runs per block and
# m spread over them; per micro-batch size the least disturbed pass is kept. Six
# shorter passes were tried (calibration_noise, docs/benchmarks.md "Past investigations"):
# the blocks' times agreed better between calibrations (spread 0.67x) but the plans
# did not (predicted step spread 1.97x, the order's Kendall tau 0.73 -> 0.74).
COMPUTE_PASSES = 2


def micro_batch_sizes(spec: JobSpec, max_m: int = MAX_MICRO_BATCH) -> list[int]:
    """Powers of two up to min(global batch, max_m), plus an explicit micro-batch size."""
    top = min(spec.training.global_batch_size, max_m)
    ms = {2**k for k in range(top.bit_length()) if 2**k <= top}
    if isinstance(spec.training.micro_batch_size, int):
        ms.add(spec.training.micro_batch_size)
    return sorted(ms)


def _spread(values: set[int], limit: int = MAX_SIZES) -> list[int]:
    """At most ``limit`` of ``values``, evenly spaced in log scale, ends included."""
    xs = sorted(v for v in values if v > 0)
    if len(xs) <= limit:
        return xs
    step = (len(xs) - 1) / (limit - 1)
    return sorted({xs[round(k * step)] for k in range(limit)})


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def comm_world(hardware: HardwareSpec) -> int:
    """Processes of the communication benchmark: 2-4, never more devices than exist."""
    if hardware.device == "cuda":
        return min(4, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    return max(2, min(4, hardware.devices))


def calibrate(
    spec: JobSpec,
    home: Path | None = None,
    repeats: int = 15,
    threads: int = DEFAULT_THREADS,
    progress: Progress | None = None,
    passes: int = COMPUTE_PASSES,
) -> tuple[Calibration, Path]:
    """Measure the spec's model on this machine; returns the record and its cache path."""
    start = time.time()
    ms = micro_batch_sizes(spec)
    report = progress or (lambda _what, _done: None)
    with _threads(threads):
        blocks, data, speed = _measure_compute(spec, ms, repeats, report, passes)
    report("communication and core sharing (process group)", 0.65)
    probe = _probes(spec, blocks, data, ms[0])
    link, allreduce, host, samples = _comm(spec, blocks, ms, threads, probe)
    report("tensor-parallel all-reduce (process group)", 0.9)
    cal = Calibration(
        source="measured",
        fingerprint=fingerprint(spec, threads),
        created=start,
        seconds=time.time() - start,
        micro_batch_sizes=ms,
        blocks=blocks,
        data=data,
        data_source=spec.data.source,
        p2p_intra=link,
        p2p_inter=link_from_spec(spec.hardware, False),
        allreduce_intra=allreduce,
        allreduce_inter=allreduce_from_spec(spec.hardware, False),
        host=host or host_from_spec(spec.hardware),
        tp_allreduce=measure_tp_allreduce(spec, ms) if traced(spec) else None,
    )
    if probe[2]:
        reference = min(speed) if speed else None  # as the least disturbed pass
        cal = calibrate_runtime(cal, samples, ms[0], PROBE_MICRO_BATCHES, reference)
        cal = cal.model_copy(update={"seconds": time.time() - start})
    report("done", 1.0)
    return cal, save(cal, home)


def _measure_compute(
    spec: JobSpec, ms: list[int], repeats: int, report: Progress, passes: int
) -> tuple[list[BlockCalibration], dict[int, Stat], list[float]]:
    """The data fetch, and the blocks timed in ``passes`` passes (``COMPUTE_PASSES``; the
    least disturbed kept per m); on CPU the whole model's speed after each pass, which
    the probes' times are brought to (their runtime is the CPU one)."""
    device = torch.device("cuda", 0) if spec.hardware.device == "cuda" else torch.device("cpu")
    report("data loading", 0.0)
    data = measure_data(spec, ms, repeats)
    if traced(spec):  # subgraphs on a real batch; no probes to bring to its speed
        blocks = measure_graph_blocks(
            spec, ms, device, repeats, progress=lambda what, f: report(what, 0.05 + 0.6 * f)
        )
        return blocks, data, []
    timed, speed = [], []
    per_pass = max(3, math.ceil(2 * repeats / passes))
    for k in range(passes):
        timed.append(
            measure_blocks(
                spec,
                ms,
                device,
                per_pass,
                progress=lambda what, f, k=k: report(what, 0.05 + 0.6 * (k + f) / passes),
            )
        )
        if device.type == "cpu":
            speed.append(_model_speed(spec, ms[0], per_pass))
    return least_disturbed(timed, ms), data, speed


def _model_speed(spec: JobSpec, m: int, repeats: int) -> float:
    """Median CPU seconds of the whole model over the probe's micro-batches
    (``model_seconds``), timed as the solo probe times it between its steps."""
    mdef = model_def(spec.model, spec.training.seed)
    stage = Stage(mdef, range(mdef.num_blocks))
    run = model_seconds(spec, stage, m, PROBE_MICRO_BATCHES)
    return statistics.median(run() for _ in range(repeats))


def traced(spec: JobSpec) -> bool:
    """Whether the spec's model is traced into subgraphs (``model.huggingface``, or a
    ``model.import`` factory returning one ``nn.Module``) rather than hand-cut blocks."""
    m = spec.model
    if m.huggingface is not None:
        return True
    return bool(m.import_) and not returns_list(m.import_, dict(m.import_args))


def least_disturbed(passes: list[list[BlockCalibration]], ms: list[int]):
    """Per micro-batch size, the times of the pass whose whole model took least.

    The chain's CPU time is robust to other processes but not to the VM's own bad
    seconds: one calibration in a dozen timed the whole model at twice its usual time
    (every block alike), which no later fit can tell from a slow model. Other work only
    adds time, so the fastest pass is the undisturbed one; its blocks stay together so
    they remain one consistent measurement."""

    def total(p: list[BlockCalibration], m: int) -> float:
        return sum(b.forward[m].median + b.backward[m].median for b in p)

    best = {m: min(passes, key=lambda p: total(p, m)) for m in ms}
    kinds = ("forward", "forward_nograd", "backward")
    return [
        b.model_copy(update={k: {m: getattr(best[m][i], k)[m] for m in ms} for k in kinds})
        for i, b in enumerate(passes[0])
    ]


def _probes(spec: JobSpec, blocks: list[BlockCalibration], data: dict, m: int) -> dict:
    """Per probe pipeline (2 and ``BUSY_PROBE_STAGES`` stages) its stages; none for a
    traced model (the probes run the builtin runtime's hand-cut blocks)."""
    if traced(spec):
        return {2: [], BUSY_PROBE_STAGES: []}
    return {P: _probe_stages(blocks, data, m, P) for P in (2, BUSY_PROBE_STAGES)}


def _probe_stages(blocks: list[BlockCalibration], data: dict, m: int, P: int) -> list[list[int]]:
    """A pipeline probe's P stages, balanced by calibrated time at m (none for a model
    of fewer blocks)."""
    if len(blocks) < P:
        return []
    costs = [b.forward[m].median + b.backward[m].median for b in blocks]
    costs[0] += data[m].median if m in data else 0.0
    costs[-1] += data[m].median if m in data else 0.0
    return partition(costs, P)


def allreduce_sizes(blocks: list[BlockCalibration]) -> list[int]:
    """Gradient bucket sizes to time: each block's, the whole model's (a one-stage
    replica's bucket) and powers of 4 from 4 KB between, at most ``MAX_SIZES``."""
    total = int(sum(b.param_bytes for b in blocks))
    sizes = {int(b.param_bytes) for b in blocks} | {total} | {4096 * 4**k for k in range(12)}
    return _spread({s for s in sizes if s <= max(total, 4096)})


def _comm(spec: JobSpec, blocks: list[BlockCalibration], ms: list[int], threads: int, stages):
    """Links, allreduce, core sharing and the pipeline probe measured in a process
    group, where one can run."""
    world = comm_world(spec.hardware)
    if world < 2:
        return (
            link_from_spec(spec.hardware, True),
            allreduce_from_spec(spec.hardware, True),
            None,
            {},
        )
    p2p_sizes = _spread({int(b.boundary_bytes * m) for b in blocks for m in ms})
    cpu = spec.hardware.device == "cpu"
    return measure_comm(
        dump_yaml(spec),
        p2p_sizes,
        allreduce_sizes(blocks),
        world,
        probe_m=ms[0],
        threads=threads,
        probe_stages=stages[2] if cpu else None,  # the probes run the CPU runtime
        probe_micro_batches=PROBE_MICRO_BATCHES,
        probe_stages_busy=stages[BUSY_PROBE_STAGES] if cpu else None,
    )
