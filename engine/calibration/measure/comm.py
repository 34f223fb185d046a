"""Measure communication and core sharing with a small real process group.

``measure_comm`` starts ``world`` (2-4) worker processes on 127.0.0.1 (gloo on CPU,
NCCL on CUDA, one GPU each), which run ``comm_worker``: point-to-point
ping-pong for each activation size, alone and while the other ranks compute;
allreduce for each ring size and message size, also with k disjoint rings reducing at
once (Varuna sec. 4.3: several stages of one node reduce together); and, on CPU, how
much k processes computing at once slow each other (they share the host's cores).
This module turns the samples into calibration records (with fitted latency and
bandwidth). Everything here is on one machine, so it is intra-node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from jobctl.engine.calibration.record import (
    AllreduceCalibration,
    AllreducePoint,
    HostCalibration,
    LinkCalibration,
    Stat,
)
from jobctl.engine.core.process import free_port

TIMEOUT_S = 300.0


def measure_comm(
    spec_yaml: str,
    p2p_bytes: list[int],
    allreduce_bytes: list[int],
    world: int,
    probe_m: int,
    repeats: int = 20,
    threads: int = 1,
    probe_stages: list[list[int]] | None = None,
    probe_micro_batches: int = 4,
    probe_stages_busy: list[list[int]] | None = None,
) -> tuple[LinkCalibration, AllreduceCalibration, HostCalibration | None, dict]:
    """Run the communication micro-benchmarks; returns the intra-node link, allreduce
    and (CPU only) host-sharing calibrations, and the pipeline probe's samples
    (``measure.probe``; empty without ``probe_stages``)."""
    with tempfile.TemporaryDirectory(prefix="jobctl-calib-") as tmp:
        job = {
            "spec": str(Path(tmp) / "spec.yaml"),
            "out": str(Path(tmp) / "result.json"),
            "p2p_bytes": p2p_bytes,
            "allreduce_bytes": allreduce_bytes,
            "rings": [[r, k] for r in range(2, world + 1) for k in range(1, world // r + 1)],
            "repeats": repeats,
            "probe_m": probe_m,
            "threads": threads,
            "probe_stages": probe_stages or [],
            "probe_stages_busy": probe_stages_busy or [],
            "probe_micro_batches": probe_micro_batches,
        }
        Path(job["spec"]).write_text(spec_yaml)
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job))
        _run_group(job_path, world)
        result = json.loads(Path(job["out"]).read_text())
    link = _link(result["p2p"], result["p2p_busy"], max(0, world - 2))
    return link, _allreduce(result["allreduce"]), _host(result["slowdown"]), result["pipeline"]


def _run_group(job_path: Path, world: int) -> None:
    """Start ``world`` ranks of ``_worker`` and wait for all of them."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        cmd = [sys.executable, "-m", "jobctl.engine.calibration.measure.comm_worker", str(job_path)]
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
    errors = []
    for rank, p in enumerate(procs):
        _, stderr = p.communicate(timeout=TIMEOUT_S)
        if p.returncode:
            errors.append(f"rank {rank} exited {p.returncode}: {stderr.strip()[-2000:]}")
    if errors:
        raise RuntimeError("calibration workers failed:\n" + "\n".join(errors))


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope, both clamped to be positive."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    slope = max(slope, 1e-15)
    return max(my - slope * mx, 1e-7), slope


def _link(idle: dict[str, list[float]], busy: dict[str, list[float]], others: int):
    points = {int(b): Stat.of(ts) for b, ts in idle.items()}
    lat, per_byte = fit_line(list(points), [s.median for s in points.values()])
    return LinkCalibration(
        source="measured",
        latency_s=lat,
        bandwidth_Bps=1.0 / per_byte,
        points=points,
        busy_points={int(b): Stat.of(ts) for b, ts in busy.items() if ts},
        busy_ranks=others,
    )


def _allreduce(rows: list[list]) -> AllreduceCalibration:
    points = [AllreducePoint(ring=r, inflight=k, bytes=b, time=Stat.of(ts)) for r, k, b, ts in rows]
    single = [p for p in points if p.inflight == 1]
    lat, per_byte = _fit_ring([(p.ring, p.bytes, p.time.median) for p in single])
    return AllreduceCalibration(
        source="measured", latency_s=lat, bandwidth_Bps=1.0 / per_byte, points=points
    )


def _fit_ring(rows: list[tuple[int, int, float]]) -> tuple[float, float]:
    """Least squares of the ring model t = 2(r-1) * latency + 2(r-1)/r * bytes * per_byte."""
    a = [2.0 * (r - 1) for r, _, _ in rows]
    c = [2.0 * (r - 1) / r * b for r, b, _ in rows]
    t = [y for _, _, y in rows]
    saa, scc = sum(x * x for x in a), sum(x * x for x in c)
    sac = sum(x * y for x, y in zip(a, c, strict=True))
    sat = sum(x * y for x, y in zip(a, t, strict=True))
    sct = sum(x * y for x, y in zip(c, t, strict=True))
    det = saa * scc - sac * sac
    if det <= 0:
        return fit_line(c, t)
    lat = (sat * scc - sct * sac) / det
    per_byte = (saa * sct - sac * sat) / det
    if per_byte <= 0:
        # Noise left no positive slope (sizes too small to resolve the bandwidth):
        # clamping it to ~0 priced allreduces as free (a "1e6 GB/s" link), a silently
        # wrong plan. Take the largest message's time as if it were all bytes instead:
        # a bandwidth the data shows at least, never more.
        big = max(range(len(c)), key=c.__getitem__)
        return 1e-7, t[big] / c[big]
    if lat <= 0:  # the zero-latency fit of the same points
        return 1e-7, sct / scc
    return lat, per_byte


def _host(slowdown: dict[str, float] | None) -> HostCalibration | None:
    if slowdown is None:
        return None
    return HostCalibration(
        source="measured",
        cores=len(os.sched_getaffinity(0)),
        slowdown={int(k): v for k, v in slowdown.items()},
    )
