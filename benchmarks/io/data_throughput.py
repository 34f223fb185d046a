"""Real data costs no step time, and ``jobctl data prepare`` against a plain loop.

(1) Step time: the quickstart job (2 stages x 2 replicas, m = 2, 4 CPU worker
processes) trains with the synthetic source, with a 100 MB token file (uint16, 50M
ids) on local disk, and with the same file on a local moto S3 server (its own process
at ``--moto-nice``, 19 by default; read one ranged GET per block of ``data.block_mb``),
same model and plan. The runs are
interleaved (one of each per round, order rotated) and each reports the median
``step_time_s`` after warm-up; prints each source's median over rounds and its ratio
to synthetic (target: within 2 %, i.e. ratio <= 1.02).

(2) ``data prepare``: tokens/s of ``engine.data.prepare.prepare`` (a process per core)
and of a plain single-process loop (one ``encode`` per document) over the same
parquet corpus and tokenizer (trained here), printed with their ratio.

    python -m benchmarks run data_throughput [--rounds 2] [--steps 30] [--mb 100] [--docs 100000]
        [--skip-steps | --skip-prepare]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import s3fs

from benchmarks.lib.benchlib import _bucket_on
from benchmarks.lib.jobbench import job_spec, measure
from jobctl.engine.data import prepare as prep
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.supervise.launch import free_port
from tests.corpus import train_tokenizer, write_parquet

QUESTION = (
    "Does real data (a local file or S3) cost step time, and how fast is jobctl data prepare?"
)
BASELINE = "The synthetic source in the same rounds; a plain single-process encode loop."


@contextlib.contextmanager
def moto_bucket(nice: int) -> Iterator[str]:
    """``s3://bucket/prefix`` on a moto server in its own process at ``nice`` (19: the
    server takes only idle CPU, as remote storage would; 0: it competes with training)."""
    port = free_port()
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
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.nice(nice)
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}", timeout=180.0)
        yield from _bucket_on(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _wait_http(url: str, timeout: float) -> None:
    """Until ``url`` answers: a niced server on a busy machine starts slowly."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def token_file(path: Path, mb: int) -> Path:
    rng = np.random.default_rng(0)
    rng.integers(0, 256, mb * (1 << 20) // 2, dtype=np.uint16).tofile(path)
    return path


def step_times(sources: dict[str, dict], steps: int, rounds: int, home: Path) -> dict:
    """Median step seconds per source and round, the sources interleaved."""
    got: dict[str, list[float]] = {name: [] for name in sources}
    names = list(sources)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            spec = job_spec(**{"training.steps": steps, **sources[name]})
            m = measure(spec, make_plan(spec), home / f"{name}-{r}", deadline_s=1200.0)
            got[name].append(m.step_s)
            print(
                f"round {r} {name:<10} {m.step_s * 1000:8.1f} ms/step "
                f"(other load {m.interference:.0%})",
                flush=True,
            )
    return got


def print_steps(got: dict[str, list[float]]) -> None:
    base = statistics.median(got["synthetic"])
    print(f"{'source':<12}{'ms/step':>10}{'vs synthetic':>14}")
    for name, times in got.items():
        t = statistics.median(times)
        print(f"{name:<12}{t * 1000:>10.1f}{t / base:>14.3f}")


def prepare_speed(d: Path, docs: int) -> None:
    tok = train_tokenizer(d)
    corpus = write_parquet(d / "corpus.parquet", n=docs)
    plain = prep.Job(str(corpus), str(tok), str(d / "plain.bin"))
    par = prep.Job(str(corpus), str(tok), str(d / "par.bin"))
    t0 = time.perf_counter()
    n_plain = prep.single_process(plain)
    t1 = time.perf_counter()
    n_par = prep.prepare(par)
    t2 = time.perf_counter()
    assert n_par == n_plain and (d / "par.bin").read_bytes() == (d / "plain.bin").read_bytes()
    a, b = n_plain / (t1 - t0), n_par / (t2 - t1)
    print(f"data prepare: {n_par:,} tokens from {docs:,} documents")
    print(f"  plain loop  {a:>12,.0f} tokens/s")
    print(f"  prepare     {b:>12,.0f} tokens/s  ({b / a:.2f}x)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--docs", type=int, default=100000)
    ap.add_argument("--moto-nice", type=int, default=19, help="the S3 server's niceness")
    ap.add_argument("--skip-steps", action="store_true", help="only the prepare benchmark")
    ap.add_argument("--skip-prepare", action="store_true", help="only the step times")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        if not args.skip_steps:
            path = token_file(d / "train.bin", args.mb)
            with moto_bucket(args.moto_nice) as bucket:
                url = bucket.rsplit("/", 1)[0] + "/data/train.bin"
                s3fs.S3FileSystem(skip_instance_cache=True).put(str(path), url)
                sources = {
                    "synthetic": {},
                    "local": {"data.source": "tokens", "data.path": str(path)},
                    "s3": {"data.source": "tokens", "data.path": url},
                }
                print_steps(step_times(sources, args.steps, args.rounds, d))
        if not args.skip_prepare:
            prepare_speed(d, args.docs)


if __name__ == "__main__":
    main()
