"""Where one checkpoint's milliseconds go, phase by phase, against DCP (issue #55).

One rank's state, in one process: the quickstart model (jobs/quickstart.yaml's model
as a P=1 D=1 plan of the whole model) and the builtin GPT at hidden 768 (327 MiB of
parameters + AdamW state), each with an AdamW optimizer that has stepped once. First
the profile: one checkpoint through the product's own calls, in
``CheckpointManager._write``'s order (snapshot_blocks into the reused host buffers
the manager's pool gives the hook, ``checkpoint.buffers``, and the hook's meta, which
training waits for; stage_dir + write_snapshot, write_meta, publish_local,
apply_retention, the checkpoint event), each phase timed in wall time, the calling
thread's CPU time and the process's CPU time. publish_local is split by timing the
product's ``sha256_file``, ``os.fsync`` and ``replace_dir`` as it calls them. Not
covered: the events flush (a plain EventLog has none; a real run's channel does) and
the upload (no remote). Reference passes, none part of a checkpoint: the copy into
buffers allocated before, sha256 of the bytes in memory, fsync of freshly written
block files, the same bytes written raw to one file. Then torch.distributed.checkpoint
on the same tensors (model + optimizer state_dict), same disk: ``save``, and
``async_save`` as torchtitan's ``async`` mode calls it (its defaults: thread
executor, default stager; a one-rank gloo group). Every pass starts after an
``os.sync`` (untimed), so none pays for another's dirty pages.

Last, training loops (forward, backward, AdamW step on random tokens; one torch
thread by default, leaving the other core to the writer threads) interleaved in
rounds: no checkpoint; the real ``CheckpointManager`` (local only) every k steps
(coalescing on, and off for k = 1); DCP async_save every k steps, waiting on the
previous save first (as torchtitan does). Per variant: mean step, added step time
per checkpoint against the round's no-checkpoint loop, blocking per save, process CPU
per checkpoint (all threads), checkpoints written. Ratios jobctl / DCP last; an
added step time that a round measured <= 0 is reported not resolved.

    python -m benchmarks run checkpoint_profile [--quick] [--threads 1] [--dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from jobctl.engine.checkpoint import blocks as ck_blocks
from jobctl.engine.checkpoint.buffers import Buffers
from jobctl.engine.checkpoint.hook import Checkpointing
from jobctl.engine.checkpoint.manager import CheckpointManager
from jobctl.engine.checkpoint.store import format as ck_format
from jobctl.engine.checkpoint.store import local as ck_local
from jobctl.engine.checkpoint.store.checkpoint_store import CheckpointStore
from jobctl.engine.core.events import EventLog, Kind
from jobctl.engine.model.blocks import Stage, lm_loss, model_def, param_count
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.runtime.optim import build_optimizer
from jobctl.spec import load_spec, spec_hash
from jobctl.spec.phases import CheckpointSpec

QUESTION = (
    "Where do one checkpoint's milliseconds go (snapshot, torch.save, sha256, fsync, "
    "manifest, retention), and what does it cost against DCP async_save?"
)
BASELINE = (
    "torch.distributed.checkpoint save and async_save of the same rank state to the "
    "same disk, and the same training loop without checkpoints, in the same run."
)

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "jobs" / "quickstart.yaml"
WORLD_1 = {
    "hardware.nodes": 1,
    "hardware.processes_per_node": 1,
    "parallelism.pipeline_stages": 1,
    "parallelism.data_parallel": 1,
}
LARGE = {"model.hidden": 768, "model.heads": 12}  # 4 layers: 28.6 M parameters
KEEP_LAST = CheckpointSpec().keep_last


@dataclass
class Cost:
    """Seconds of one measured span: wall, the calling thread's CPU, the process's CPU."""

    wall: float = 0.0
    cpu: float = 0.0
    proc: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.wall + other.wall, self.cpu + other.cpu, self.proc + other.proc)


@contextlib.contextmanager
def timed(into: dict[str, Cost], key: str) -> Iterator[None]:
    """Add the block's wall, thread CPU and process CPU time to ``into[key]``."""
    w, c, p = time.perf_counter(), time.thread_time(), time.process_time()
    try:
        yield
    finally:
        got = Cost(time.perf_counter() - w, time.thread_time() - c, time.process_time() - p)
        into[key] = into.get(key, Cost()) + got


@contextlib.contextmanager
def spied(into: dict[str, Cost], spies: list[tuple[object, str, str]]) -> Iterator[None]:
    """Time every call of ``module.attr`` into ``into[key]`` while the block runs (the
    product's own function is called; only a timer is wrapped around it)."""
    saved = [(mod, attr, getattr(mod, attr)) for mod, attr, _ in spies]
    for (mod, attr, fn), (_, _, key) in zip(saved, spies, strict=True):

        def wrapper(*args, _fn=fn, _key=key, **kwargs):
            with timed(into, _key):
                return _fn(*args, **kwargs)

        setattr(mod, attr, wrapper)
    try:
        yield
    finally:
        for mod, attr, fn in saved:
            setattr(mod, attr, fn)


# publish_local's parts: hashing (measure_files -> FileEntry.of_local -> sha256_file),
# fsync (write_bytes_atomic of the part record and the manifest), the folder rename
PUBLISH_SPIES = [
    (ck_format, "sha256_file", "  sha256 (re-read)"),
    (os, "fsync", "  fsync (record+manifest)"),
    (ck_local, "replace_dir", "  rename"),
]


@dataclass
class Rank:
    """One rank's state: its stage of a P=1 D=1 plan, AdamW, a batch of random tokens."""

    name: str
    spec: object
    plan: object
    stage: Stage
    opt: torch.optim.Optimizer
    ties: list
    batch: tuple[torch.Tensor, torch.Tensor]
    blocks: list[int] = field(default_factory=list)
    spec_hash: str = ""  # the hook's is a cached property: computed once
    buffers: Buffers = field(default_factory=Buffers)  # the profile's reused snapshot set

    def step(self) -> None:
        x, y = self.batch
        lm_loss(self.stage(x), y).backward()
        self.opt.step()
        self.opt.zero_grad()

    def snapshot(self, into: Buffers | None = None) -> dict:
        """The hook's snapshot, into reused host tensors where given (the product's)."""
        return ck_blocks.snapshot_blocks(self.stage, self.opt, self.blocks, self.ties, into=into)

    def meta(self, step: int) -> dict:
        """The meta.json the real hook writes (``Checkpointing.meta``, no fp16 scale)."""
        hook = SimpleNamespace(spec=self.spec, spec_hash=self.spec_hash, scaler=None)
        return Checkpointing.meta(hook, self.plan, step)

    def state_dict(self) -> dict:
        return {"model": self.stage.state_dict(), "optim": self.opt.state_dict()}

    def state_bytes(self) -> int:
        snap = self.snapshot()
        return sum(t.nbytes for t in _tensors(snap))


def _tensors(tree) -> Iterator[torch.Tensor]:
    if torch.is_tensor(tree):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _tensors(v)


def build_rank(name: str, overrides: dict, batch: int, home: Path) -> Rank:
    """The rank of a one-process plan of the quickstart spec with ``overrides``, its
    AdamW stepped once (so its state exists)."""
    spec = load_spec(QUICKSTART, overrides={**WORLD_1, **overrides})
    plan = make_plan(spec, home=home)
    mdef = model_def(spec.model, spec.training.seed, plan.micro_batch_size)
    me = plan.stage_of(0)
    stage = Stage(mdef, me.blocks, me.keep_blocks)
    opt = build_optimizer(list(stage.parameters()), spec.training)
    g = torch.Generator().manual_seed(0)
    shape = (batch, spec.model.seq_len)
    tokens = [torch.randint(spec.model.vocab, shape, generator=g) for _ in range(2)]
    rank = Rank(name, spec, plan, stage, opt, mdef.ties, (tokens[0], tokens[1]))
    rank.blocks = ck_blocks.blocks_written_by(plan, 0)
    rank.spec_hash = spec_hash(spec)
    rank.step()
    return rank


def jobctl_once(rank: Rank, root: Path, step: int, events: EventLog) -> dict[str, Cost]:
    """One checkpoint through the product's calls, in ``CheckpointManager._write``'s
    order (its events flush is absent: a plain EventLog has none), phase by phase."""
    c: dict[str, Cost] = {}
    with timed(c, "snapshot (blocking)"):
        snap = rank.snapshot(rank.buffers)  # the pool's idle set, refilled each time
    with timed(c, "meta dict (blocking)"):
        meta = rank.meta(step)
    with timed(c, "write blocks (torch.save)"):
        staging = ck_local.stage_dir(root, step)
        files = ck_blocks.write_snapshot(snap, staging)
    with timed(c, "write meta.json"):
        files.append(ck_blocks.write_meta(staging, meta))
    with spied(c, PUBLISH_SPIES), timed(c, "publish_local"):
        published = ck_local.publish_local(root, step, "rank-0", files, meta, ["rank-0"])
    with timed(c, "retention"):
        CheckpointStore(str(root)).apply_retention(KEEP_LAST, None, None, committed=step)
    with timed(c, "checkpoint event"):
        events.write(Kind.CHECKPOINT, step=step, path=str(published))
    c["  rest (records, lock)"] = _rest(c)
    return c


def _rest(c: dict[str, Cost]) -> Cost:
    """publish_local less its timed parts."""
    rest = c["publish_local"]
    for _, _, key in PUBLISH_SPIES:
        got = c.get(key, Cost())
        rest = Cost(rest.wall - got.wall, rest.cpu - got.cpu, rest.proc - got.proc)
    return rest


def references(rank: Rank, root: Path) -> dict[str, Cost]:
    """Reference passes over the same state (none is part of a jobctl checkpoint): the
    snapshot's copy into buffers allocated before, sha256 of the tensors' bytes in
    memory, fsync of freshly written block files, the bytes written raw to one file."""
    c: dict[str, Cost] = {}
    live = list(_tensors(rank.state_dict()))  # the live tensors themselves, no copies
    buffers = [t.clone() for t in live]  # allocated (and touched) beforehand
    with timed(c, "copy into preallocated"):
        for dst, src in zip(buffers, live, strict=True):
            dst.copy_(src)
    with timed(c, "sha256 in memory"):
        for t in buffers:
            hashlib.sha256(memoryview(t.numpy())).hexdigest()
    os.sync()
    out = root / "fsync-probe"
    out.mkdir()
    files = ck_blocks.write_snapshot(rank.snapshot(), out)
    with timed(c, "fsync block files"):
        for name in files:
            with open(out / name, "rb+") as handle:
                os.fsync(handle.fileno())
    with timed(c, "raw write, one file"), open(out / "raw.bin", "wb") as handle:
        for t in buffers:
            handle.write(memoryview(t.numpy()))
    shutil.rmtree(out)
    os.sync()
    return c


def dcp_once(rank: Rank, path: Path, use_async: bool) -> dict[str, Cost]:
    """One DCP save (blocking: all of it) or async_save (blocking: until it returns;
    done: until its future completes) of the rank's model + optimizer state_dict."""
    c: dict[str, Cost] = {}
    w, p = time.perf_counter(), time.process_time()
    if not use_async:
        with timed(c, "blocking"):
            dcp.save(rank.state_dict(), checkpoint_id=str(path))
        c["done"] = c["blocking"]
        return c
    with timed(c, "blocking"):
        future = dcp.async_save(rank.state_dict(), checkpoint_id=str(path))
    future.result()
    c["done"] = Cost(time.perf_counter() - w, c["blocking"].cpu, time.process_time() - p)
    return c


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def profile(rank: Rank, root: Path, repeats: int) -> tuple[dict[str, list], dict[str, int]]:
    """``repeats`` rounds of jobctl, DCP save and DCP async_save after a warm-up of
    each (not counted), each to a new folder (DCP's removed after); the costs by kind,
    and the bytes each writes. jobctl's warm-up fills its retention (keep_last), so
    every counted pass deletes the oldest checkpoint, as a long run's do."""
    events = EventLog(root / "metrics.jsonl")
    for step in range(1, KEEP_LAST):
        jobctl_once(rank, root / "ckpt", step, events)
    got: dict[str, list[dict[str, Cost]]] = {"jobctl": [], "save": [], "async": []}
    size: dict[str, int] = {}
    for k in range(repeats + 1):
        for kind in got:
            path = root / f"dcp-{kind}-{k}"
            if kind == "jobctl":
                one = jobctl_once(rank, root / "ckpt", KEEP_LAST + k, events)
                path = root / "ckpt" / ck_format.step_dirname(KEEP_LAST + k)
            else:
                one = dcp_once(rank, path, kind == "async")
            size[kind] = _size(path)
            if kind != "jobctl":
                shutil.rmtree(path)
            os.sync()  # every pass starts with nothing dirty: untimed
            if k:
                got[kind].append(one)
    got["ref"] = [references(rank, root) for _ in range(repeats)]
    return got, size


class JobctlSaver:
    """The real CheckpointManager of rank 0 (local only), fed by the real snapshot."""

    def __init__(self, rank: Rank, root: Path, coalesce: bool):
        self.rank, self.events = rank, EventLog(root / "metrics.jsonl")
        cfg = CheckpointSpec(coalesce=coalesce)
        self.manager = CheckpointManager(cfg, rank.plan, 0, root / "ckpt", self.events)

    def save(self, step: int) -> None:
        """What ``Checkpointing.save`` does: a snapshot into the manager's buffers."""
        into = self.manager.buffers()
        snap = self.rank.snapshot(into)
        self.manager.save(step, snap, self.rank.meta(step), buffers=into)

    def close(self) -> int:
        """Wait for the writer; the checkpoints it wrote (its checkpoint events)."""
        self.manager.close()
        lines = self.events.path.read_text().splitlines() if self.events.path.exists() else []
        return sum(json.loads(line).get("kind") == Kind.CHECKPOINT for line in lines)


class DcpSaver:
    """DCP async_save every call, waiting on the previous save first (torchtitan)."""

    def __init__(self, rank: Rank, root: Path):
        self.rank, self.root, self.future, self.n = rank, root, None, 0

    def save(self, step: int) -> None:
        if self.future is not None:
            self.future.result()
        sd = self.rank.state_dict()
        self.future = dcp.async_save(sd, checkpoint_id=str(self.root / f"step-{step}"))
        self.n += 1

    def close(self) -> int:
        if self.future is not None:
            self.future.result()
        return self.n


@dataclass
class Run:
    """One training loop: its mean step, blocking per save, process CPU, written."""

    step: float
    blocking: list[float]
    cpu: float
    written: int
    steps: int


def train(rank: Rank, saver, steps: int, every: int) -> Run:
    """``steps`` training steps, a save after every ``every``-th (from the first)."""
    times, blocking = [], []
    cpu = time.process_time()
    for i in range(steps):
        t0 = time.perf_counter()
        rank.step()
        if saver is not None and i % every == 0:
            t1 = time.perf_counter()
            saver.save(i + 1)
            blocking.append(time.perf_counter() - t1)
        times.append(time.perf_counter() - t0)
    written = saver.close() if saver is not None else 0
    cpu = time.process_time() - cpu  # the writer's drain included
    return Run(statistics.mean(times), blocking, cpu, written, steps)


Variant = tuple[str, Callable[[Rank, Path], object] | None, int]
VARIANTS: list[Variant] = [
    ("no checkpoint", None, 1),
    ("jobctl k=1", lambda r, d: JobctlSaver(r, d, True), 1),
    ("jobctl k=1 no coal.", lambda r, d: JobctlSaver(r, d, False), 1),
    ("DCP async k=1", DcpSaver, 1),
    ("jobctl k=10", lambda r, d: JobctlSaver(r, d, True), 10),
    ("DCP async k=10", DcpSaver, 10),
]


def loops(rank: Rank, root: Path, rounds: int, steps: tuple[int, int]) -> dict[str, list[Run]]:
    """``rounds`` rounds of every variant in turn (k = 1 and none: ``steps[0]`` steps;
    k = 10: ``steps[1]``, a multiple of 10, a save at the first of every 10), each in
    a new folder, synced and removed after (untimed)."""
    got: dict[str, list[Run]] = {name: [] for name, _, _ in VARIANTS}
    for r in range(rounds):
        for j, (name, make, every) in enumerate(VARIANTS):
            where = root / f"loop-{r}-{j}"
            where.mkdir()
            saver = make(rank, where) if make is not None else None
            got[name].append(train(rank, saver, steps[every > 1], every))
            os.sync()
            shutil.rmtree(where)
    return got


def ms(xs: list[float]) -> str:
    """Median and range of seconds, in ms."""
    med = 1e3 * statistics.median(xs)
    return f"{med:8.1f} [{1e3 * min(xs):6.1f}-{1e3 * max(xs):<6.1f}]"


TOP = [  # the phases of one checkpoint, in order; indented keys are parts of the last
    "snapshot (blocking)",
    "meta dict (blocking)",
    "write blocks (torch.save)",
    "write meta.json",
    "publish_local",
    *(key for _, _, key in PUBLISH_SPIES),
    "  rest (records, lock)",
    "retention",
    "checkpoint event",
]


def totals(one: dict[str, Cost]) -> dict[str, Cost]:
    """A jobctl pass: its total, what training waits for (snapshot + meta), the rest
    (the writer thread's, in a real run)."""
    total = Cost()
    for key in TOP:
        if not key.startswith(" "):
            total = total + one[key]
    block = one["snapshot (blocking)"] + one["meta dict (blocking)"]
    return {
        "total": total,
        "blocking": block,
        "background": Cost(*(a - b for a, b in _pairs(total, block))),
    }


def _pairs(a: Cost, b: Cost) -> list[tuple[float, float]]:
    return [(a.wall, b.wall), (a.cpu, b.cpu), (a.proc, b.proc)]


def row(label: str, costs: list[Cost]) -> str:
    """``label``, median wall [range], median thread CPU and process CPU, in ms."""
    cpu = 1e3 * statistics.median(c.cpu for c in costs)
    proc = 1e3 * statistics.median(c.proc for c in costs)
    return f"{label:<27}{ms([c.wall for c in costs])}{cpu:9.1f}{proc:9.1f}"


def print_profile(got: dict[str, list[dict[str, Cost]]]) -> None:
    """The phase table: jobctl's phases, its totals, the references, DCP's."""
    print(f"{'phase, ms':<27}{'wall':>8} {'[min-max]':^15}{'thr CPU':>9}{'proc CPU':>9}")
    runs = got["jobctl"]
    for key in TOP:
        print(row(key, [r.get(key, Cost()) for r in runs]))
    for key in ("total", "blocking", "background"):
        print(row(f"= {key}", [totals(r)[key] for r in runs]))
    print("reference passes (not in a jobctl checkpoint):")
    for key in got["ref"][0]:
        print(row(f"  {key}", [r[key] for r in got["ref"]]))
    print("torch.distributed.checkpoint, same state and disk:")
    print(row("  save", [r["blocking"] for r in got["save"]]))
    print(row("  async_save: blocking", [r["blocking"] for r in got["async"]]))
    print(row("  async_save: until done", [r["done"] for r in got["async"]]))


def added(runs: list[Run], base: list[Run], every: int) -> list[float]:
    """Per round: the step time the variant added per checkpoint asked for (s)."""
    return [(r.step - b.step) * every for r, b in zip(runs, base, strict=True)]


def cpu_added(runs: list[Run], base: list[Run], every: int) -> float:
    """Median over rounds: process CPU added per checkpoint asked for (s)."""
    per = [(r.cpu / r.steps - b.cpu / b.steps) * every for r, b in zip(runs, base, strict=True)]
    return statistics.median(per)


def print_loops(got: dict[str, list[Run]]) -> dict[str, tuple[float, float]]:
    """The loop table; returns each variant's median added time (nan where a round's
    was <= 0: not resolved above the noise) and process CPU per checkpoint asked."""
    print(f"{'variant, ms':<20}{'step':>7}{'added/ck':>10} {'[min-max]':^15}", end="")
    print(f"{'block':>7}{'CPU/ck':>8}{'wrote':>8}")
    base = got["no checkpoint"]
    out = {}
    for name, _, every in VARIANTS:
        runs = got[name]
        step = 1e3 * statistics.median(r.step for r in runs)
        line = f"{name:<20}{step:7.1f}"
        if name != "no checkpoint":
            more = added(runs, base, every)
            median = statistics.median(more) if min(more) > 0 else math.nan
            out[name] = (median, cpu_added(runs, base, every))
            block = 1e3 * statistics.median(b for r in runs for b in r.blocking)
            asked = sum(len(r.blocking) for r in runs)
            wrote = f"{sum(r.written for r in runs)}/{asked}"
            line += f"  {ms(added(runs, base, every))}{block:7.1f}"
            line += f"{1e3 * cpu_added(runs, base, every):8.1f}{wrote:>8}"
        print(line)
    print("added/ckpt: (mean step - the round's no-checkpoint mean step) x k; block: time")
    print("in the save call (snapshot + queue; DCP: wait for the previous + async_save);")
    print("CPU/ck: process CPU (all threads, the writer's drain included) per checkpoint")
    return out


LOOP_RATIOS = [  # (jobctl variant, k, label): each against DCP async_save at that k
    ("k=1", 1, "k=1"),
    ("k=1 no coal.", 1, "k=1 no coal."),
    ("k=10", 10, "k=10"),
]


def compare(got: dict, loop: dict[str, tuple[float, float]] | None) -> dict[str, float]:
    """The ratios jobctl / DCP of one model, by label: one checkpoint's blocking time,
    whole time and CPU (profile), added step time and CPU per checkpoint (loops)."""
    med = statistics.median
    jc = {k: med(totals(r)[k].wall for r in got["jobctl"]) for k in ("blocking", "total")}
    cpu = med(totals(r)["total"].proc for r in got["jobctl"])
    da = med(r["blocking"].wall for r in got["async"])
    ds = med(r["blocking"].wall for r in got["save"])
    out = {
        "blocking / async_save's": jc["blocking"] / da,
        "blocking / save's": jc["blocking"] / ds,
        "whole checkpoint / save's": jc["total"] / ds,
        "CPU, all threads / async's": cpu / med(r["done"].proc for r in got["async"]),
    }
    for name, k, label in LOOP_RATIOS:
        if loop:
            jobctl, dcp_ = loop[f"jobctl {name}"], loop[f"DCP async k={k}"]
            out[f"added step time, {label}"] = jobctl[0] / dcp_[0]  # nan: not resolved
            out[f"CPU per checkpoint, {label}"] = jobctl[1] / dcp_[1] if dcp_[1] > 0 else math.nan
    return out


def print_ratios(names: list[str], got: list[dict[str, float]]) -> None:
    """One row per ratio, one column per model."""
    print(f"\n{'jobctl / DCP async_save (or save)':<36}" + "".join(f"{n:>16}" for n in names))
    for label in got[0]:
        cells = [g.get(label, math.nan) for g in got]
        print(f"{label:<36}" + "".join(f"{_cell(x):>16}" for x in cells))


def _cell(x: float) -> str:
    return "n/r" if math.isnan(x) else f"{x:.2f}"


@dataclass(frozen=True)
class Setup:
    """One model to measure and how much."""

    name: str
    overrides: dict
    batch: int
    repeats: int
    rounds: int
    steps: tuple[int, int]  # loop steps: no checkpoint and k = 1; k = 10


def measure(setup: Setup, root: Path) -> dict[str, float]:
    """Build the rank, profile it, run the loops, print; returns its ratios."""
    start = time.perf_counter()
    rank = build_rank(setup.name, setup.overrides, setup.batch, root)
    n, mb = param_count(rank.stage), rank.state_bytes() / 2**20
    print(f"\n== {setup.name}: P=1 D=1 whole model, {n:,} parameters;")
    print(f"   parameters + AdamW state {mb:.1f} MiB; {setup.repeats} repeats")
    got, size = profile(rank, root, setup.repeats)
    sizes = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in size.items())
    print(f"   bytes on disk, MiB: {sizes}")
    print_profile(got)
    loop = None
    if setup.rounds:
        print(f"training, batch {setup.batch} x {rank.spec.model.seq_len} tokens, ", end="")
        k1, k10 = setup.steps
        print(f"{setup.rounds} rounds; none, k=1: {k1} steps; k=10: {k10}")
        loop = print_loops(loops(rank, root, setup.rounds, setup.steps))
    print(f"({setup.name}: {time.perf_counter() - start:.0f} s)")
    return compare(got, loop)


QUICK = [Setup("quickstart", {}, 16, 3, 3, (10, 30))]
FULL = [
    Setup("quickstart", {}, 16, 5, 5, (20, 40)),
    Setup("GPT hidden 768", LARGE, 1, 3, 5, (6, 10)),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the quickstart model only, fewer")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--dir", help="where to write (default: a temporary folder)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", module=r"torch\.distributed")
    root = Path(tempfile.mkdtemp(prefix="ckpt-profile-", dir=args.dir))
    print(f"torch {torch.__version__}, {args.threads} torch thread(s), {os.cpu_count()} cores;")
    print(f"writing under {root}")
    print("DCP: async_save's defaults (thread executor, default stager), gloo world 1")
    print("load average at start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        setups = QUICK if args.quick else FULL
        ratios = [measure(s, root) for s in setups]
    finally:
        dist.destroy_process_group()
        shutil.rmtree(root, ignore_errors=True)
    print_ratios([s.name for s in setups], ratios)
    print("of medians; < 1: jobctl costs less; n/r: not resolved (a round measured an")
    print("added step time <= 0: the VM's noise exceeds the cost) or not run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
