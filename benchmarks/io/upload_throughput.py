"""Checkpoint upload throughput: Uploader + CheckpointStore vs one plain batched fs.put.

Creates ~64 MB of random shards published as a local checkpoint (``publish_local``:
the production path, sha256 computed at publish time), starts a local moto S3 server,
and times, per round (order rotating): (a) a plain ``s3fs.put(list_of_files,
list_of_keys)``; (b) ``Uploader.submit(..., then_commit=...)`` of the published folder
until committed (part record and manifest included, digests reused); (c) the same from
a folder without manifest, so every file is also hashed during the upload. The sha256
that (b) reuses was computed when the checkpoint was published (on the writer thread,
before the upload): that time is measured (publishing the shards once, median of
three) and added to (b) in the headline. Prints the medians and, last, the throughput
ratio (b incl. its publish-time sha256) / (a) (target >= 0.9).

    python -m benchmarks run upload_throughput [--total-mb 64] [--shards 12] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import s3fs

from jobctl.engine.checkpoint.store.checkpoint_store import (
    CheckpointStore,
    publish_local,
    stage_dir,
)
from jobctl.engine.checkpoint.upload import Uploader

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for tests.s3server

from tests.s3server import TEST_ENV, start_moto_server  # noqa: E402

QUESTION = "How fast does the checkpoint Uploader move a checkpoint to S3?"
BASELINE = "One plain batched s3fs put of the same files."


def make_checkpoint(root: Path, total_mb: int, shards: int) -> tuple[Path, Path, list[str]]:
    """Random (incompressible) shards published as a local checkpoint, and a raw copy.

    Returns the published folder (its manifest already holds every sha256), a folder
    with the same files (hard links) and no manifest, and the shard names.
    """
    size = total_mb * 2**20 // shards
    names = [f"layers/{i:02d}.pt" for i in range(shards)]
    published = _publish(root / "local", 1, names, size)
    for name in names:
        (root / "raw" / name).parent.mkdir(parents=True, exist_ok=True)
        os.link(published / name, root / "raw" / name)
    return published, root / "raw", names


def _publish(local: Path, step: int, names: list[str], size: int) -> Path:
    staging = stage_dir(local, step)
    for name in names:
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_bytes(os.urandom(size))
    published = publish_local(local, step, "rank0", names)
    assert published is not None  # a single expected part publishes at once
    return published


def publish_seconds(root: Path, total_mb: int, shards: int) -> float:
    """Median seconds of ``publish_local`` (the sha256 of every shard, the manifest,
    the rename) of a fresh checkpoint of the same size, over three."""
    size, names, times = total_mb * 2**20 // shards, [f"x/{i:02d}.pt" for i in range(shards)], []
    for step in range(3):
        staging = stage_dir(root / "publish", step)
        for name in names:
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(os.urandom(size))
        start = time.perf_counter()
        publish_local(root / "publish", step, "rank0", names)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_plain(fs: s3fs.S3FileSystem, local: Path, names: list[str], i: int) -> float:
    """Seconds for one batched fs.put of every shard."""
    prefix = f"bench/plain{i}"
    start = time.perf_counter()
    fs.put([str(local / n) for n in names], [f"{prefix}/{n}" for n in names])
    elapsed = time.perf_counter() - start
    fs.rm(prefix, recursive=True)
    return elapsed


def time_uploader(store: CheckpointStore, local: Path, names: list[str], step: int) -> float:
    """Seconds from submit to a committed checkpoint."""
    uploader = Uploader(store)
    start = time.perf_counter()
    uploader.submit(step, "rank0", local, names, then_commit=(["rank0"], {"bench": True}))
    if not uploader.wait_idle(timeout=600):
        raise RuntimeError("upload did not finish in 600 s")
    elapsed = time.perf_counter() - start
    status = uploader.status()
    uploader.close()
    if status["last_committed_step"] != step:
        raise RuntimeError(f"upload failed: {status['last_error']}")
    store.delete(step)
    return elapsed


def one_round(
    fs: s3fs.S3FileSystem, store: CheckpointStore, dirs: tuple[Path, Path, list[str]], i: int
) -> dict[str, float]:
    """Seconds of each contender; the order rotates every round to cancel order bias."""
    published, raw, names = dirs
    contenders = {
        "plain": partial(time_plain, fs, published, names, i),
        "published": partial(time_uploader, store, published, names, 2 * i),
        "raw": partial(time_uploader, store, raw, names, 2 * i + 1),
    }
    order = list(contenders)[i % 3 :] + list(contenders)[: i % 3]
    return {name: contenders[name]() for name in order}


def run(total_mb: int, shards: int, rounds: int, workers: int) -> None:
    server, endpoint = start_moto_server()
    os.environ.update(TEST_ENV, AWS_ENDPOINT_URL=endpoint)
    try:
        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        fs.mkdir("bench")
        store = CheckpointStore("s3://bench/ckpt", workers=workers)
        with tempfile.TemporaryDirectory() as tmp:
            dirs = make_checkpoint(Path(tmp), total_mb, shards)
            timings = [one_round(fs, store, dirs, i) for i in range(rounds + 1)]
            publish_s = publish_seconds(Path(tmp), total_mb, shards)
        medians = {k: statistics.median(t[k] for t in timings[1:]) for k in timings[0]}
        medians["publish"] = publish_s
        medians["published+hash"] = medians["published"] + publish_s
        report(total_mb, shards, workers, rounds, medians)  # round 0 warmed connections
    finally:
        server.stop()


def report(total_mb: int, shards: int, workers: int, rounds: int, s: dict[str, float]) -> None:
    print(f"{total_mb} MiB in {shards} shards to moto S3, workers={workers}, median of {rounds}")
    rows = [
        ("plain fs.put(list)", "plain"),
        ("Uploader, published local ckpt", "published"),
        ("Uploader, raw files (hashing)", "raw"),
        ("publish_local (sha256, manifest)", "publish"),
        ("Uploader + its publish sha256", "published+hash"),
    ]
    for label, key in rows:
        print(f"{label:32s} {s[key]:6.3f} s  {total_mb / s[key]:7.1f} MiB/s")
    print(f"ratio raw files / plain:          {s['plain'] / s['raw']:.2f}x")
    print(f"ratio Uploader alone / plain:     {s['plain'] / s['published']:.2f}x")
    print(
        f"ratio (Uploader incl. publish-time sha256 / plain throughput): "
        f"{s['plain'] / s['published+hash']:.2f}x"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-mb", type=int, default=64)
    parser.add_argument("--shards", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args(argv)
    run(args.total_mb, args.shards, args.rounds, args.workers)


if __name__ == "__main__":
    main()
