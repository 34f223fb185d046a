"""Shared pieces of the benchmarks: a local S3 bucket, step timings of a run, and
the launcher of hand-built rank processes (``launch_ranks``: PyTorch's pipelining
baseline, jobctl's runtime parts) with the least-disturbed-of-N rule both sides use."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from jobctl.engine.supervise.launch import free_port


@contextlib.contextmanager
def moto_process(port: int) -> Iterator[str]:
    """A moto S3 server in its own process at the lowest CPU priority.

    Real object storage runs on other machines; a moto server sharing this 2-core box
    at normal priority would bill its own CPU to the training it serves.
    """
    cmd = [
        sys.executable,
        "-c",
        "from moto.server import main; main()",
        "-H",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.nice(19)
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        _wait_http(endpoint)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def moto_bucket(separate_process: bool = False) -> Iterator[str]:
    """``s3://bucket/prefix`` on a fresh local moto server, AWS_* env set meanwhile."""
    if separate_process:
        with moto_process(free_port()) as endpoint:
            yield from _bucket_on(endpoint)
        return
    from tests.s3server import start_moto_server  # S3 pieces load only where used

    server, endpoint = start_moto_server()
    try:
        yield from _bucket_on(endpoint)
    finally:
        server.stop()


def _bucket_on(endpoint: str) -> Iterator[str]:
    import s3fs

    from tests.s3server import TEST_ENV

    saved = {k: os.environ.get(k) for k in [*TEST_ENV, "AWS_ENDPOINT_URL"]}
    os.environ.update(TEST_ENV, AWS_ENDPOINT_URL=endpoint)
    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    try:
        yield f"s3://{bucket}/ckpt"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def events(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip()]


def step_times(run_dir: Path) -> list[float]:
    """Wall seconds between consecutive step events (includes checkpoint writes)."""
    ts = [e["ts"] for e in events(run_dir) if e["kind"] == "step"]
    return [b - a for a, b in zip(ts, ts[1:], strict=False)]


def launch_ranks(args: list[str], job: dict, world: int, work: Path, what: str) -> list[float]:
    """Run ``world`` ranks of ``python ARGS work/job.json`` on 127.0.0.1 and return the
    step seconds one of them writes to ``job["out"]`` (``work/times.json``).

    Each rank gets torch.distributed's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT and
    one OpenMP thread (as jobctl's workers); ``what`` names the run in an error.
    """
    work.mkdir(parents=True, exist_ok=True)
    job = {**job, "out": str(work / "times.json")}
    (work / "job.json").write_text(json.dumps(job))
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, *args, str(work / "job.json")],
            env={
                **os.environ,
                **{"RANK": str(r), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1"},
                **{"MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"},
            },
        )
        for r in range(world)
    ]
    codes = [p.wait(timeout=600) for p in procs]
    if any(codes):
        raise RuntimeError(f"{what} failed: exit codes {codes}")
    return json.loads((work / "times.json").read_text())


def least_disturbed(run, attempts: int) -> tuple[float, float]:
    """(other processes' CPU share, median step seconds after warm-up) of the least
    disturbed of up to ``attempts`` runs of ``run()`` (its step seconds), each started
    when the CPU was quiet: ``jobbench.measure_best``'s rule, for hand-built runs."""
    from benchmarks.lib.jobbench import WARMUP_STEPS, Interference, wait_quiet

    best = None
    for _ in range(attempts):
        wait_quiet()
        with Interference() as other:
            times = run()
        got = (other.fraction, statistics.median(times[WARMUP_STEPS:]))
        best = got if best is None or got[0] < best[0] else best
        if best[0] < 0.05:
            break
    return best
