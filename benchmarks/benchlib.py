"""Shared pieces of the benchmarks: a local S3 bucket and step timings of a run."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import s3fs

from jobctl.engine.supervise.launch import free_port
from tests.s3server import TEST_ENV, start_moto_server


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
    server, endpoint = start_moto_server()
    try:
        yield from _bucket_on(endpoint)
    finally:
        server.stop()


def _bucket_on(endpoint: str) -> Iterator[str]:
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
