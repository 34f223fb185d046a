"""Mobius's swapping runtime (sec. 3.1) on this CPU: step time with prefetch vs
without, and the bytes moved between the device and its tier per step against the
paper's eq. (1) and a ZeRO-offload-style eq. (2).

A GPT of ``--layers`` blocks at ``--hidden``, one block per stage (S = layers + 2) on
one device (N = 1), AdamW, trained by two ``MobiusRunner`` s in this process, one
with prefetch (the next stage uploaded on the I/O thread while this one computes)
and one without (each transfer waited for where it is issued), in interleaved
rounds (A B, then B A) so both see the same machine; the median step of each and
the ratio are printed. The tier is a folder of record files under ``$TMPDIR`` (point
it at a disk where /tmp is a tmpfs); by default their pages
stay in the kernel's page cache (the tier then costs memory copies); ``--cold``
writes them out and drops them from the cache before every step, so uploads come
from the disk.

Traffic is measured on one step after the first (the update runs on each upload),
in fp32 bytes: eq. (1) prices a step at 2 P (parameters up for the forward and the
backward) + 2 A (activations down and up) + G (gradients down), with P = G the
parameter bytes and A the activations the step offloads; eq. (2), ZeRO-offload
style over N devices, at 2 N P + 2 A + N G. Mobius's optimizer runs in DRAM where
the state lives, so the paper counts no optimizer traffic; here the tier is a disk,
so the update on upload moves gradients up and parameters and Adam's slots both
ways, printed separately.

``--partition`` measures partition quality instead: the sec. 3.2 MIP
(``mobius.planning.partition``, priced by the analytic calibration of this CPU with
the device memory ``--memory-mb`` and the tier at ``--tier-gbps``) against the even
split into the same number of stages, both trained with prefetch in interleaved
rounds; printed: each one's stages, modelled and measured median step with its
quartiles, and the ratio (of the medians, and each round's with its range).

Beside each measured median, the simulator's prediction (``mobius.planning.simulator``)
for the same stages: per-stage forward, recompute + backward and AdamW update timed
here with the weights in memory (the best of ``--probe`` runs before and after the
timed rounds), the tier's bandwidth
measured by writing and reading back a record-sized file in the tier's folder, the
record's real sections (parameters, gradients, slots) and the stage inputs' bytes;
printed: predicted, measured and their ratio, prefetch on and off.

    python -m benchmarks run mobius_runtime [--layers 10] [--hidden 256] [--rounds 6] [--cold]
    python -m benchmarks run mobius_runtime --partition [--memory-mb 48] [--tier-gbps 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from jobctl.engine.calibration.analytic import (  # noqa: E402
    analytic_calibration,
    analytic_fingerprint,
)
from jobctl.engine.data.dataset import make_data  # noqa: E402
from jobctl.engine.mobius.planning.costs import (  # noqa: E402
    MobiusConfig,
    even_sizes,
    layer_costs,
    step_time,
)
from jobctl.engine.mobius.planning.partition import mobius_partition  # noqa: E402
from jobctl.engine.mobius.planning.simulator import (  # noqa: E402
    MobiusSimConfig,
    SwapStage,
    simulate_mobius,
)
from jobctl.engine.mobius.runtime import MobiusRunner, SwapConfig  # noqa: E402
from jobctl.engine.model.blocks import Stage, model_def  # noqa: E402
from jobctl.engine.runtime.optim import build_optimizer  # noqa: E402
from jobctl.spec import load_spec  # noqa: E402

QUESTION = (
    "What does Mobius's prefetch save per step on this CPU, and do the bytes it moves "
    "match the paper's eq. (1)?"
)
BASELINE = (
    "The same runner without prefetch; eq. (1) and ZeRO-offload's eq. (2); with "
    "--partition, the even split."
)

ROOT = Path(__file__).resolve().parents[2]
MB = 2**20


def _spec(args):
    shape = {
        "model.layers": args.layers,
        "model.hidden": args.hidden,
        "model.heads": 4,
        "model.seq_len": args.seq_len,
        "model.vocab": 256,
        "training.optimizer": "adamw",
        "training.global_batch_size": args.micro_batch * args.micro_batches,
        "training.micro_batch_size": args.micro_batch,
    }
    return load_spec(ROOT / "jobs" / "quickstart.yaml", overrides=shape)


def _runner(args, folder: Path, prefetch: bool, sizes: list[int] | None = None) -> MobiusRunner:
    """A runner of one block per stage, or of stages of ``sizes`` blocks."""
    spec = _spec(args)
    mdef = model_def(spec.model, spec.training.seed, args.micro_batch)
    sizes = sizes or [1] * mdef.num_blocks
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    stages = tuple(tuple(range(a, a + n)) for a, n in zip(starts, sizes, strict=True))
    cfg = SwapConfig(folder, stages, args.micro_batch, prefetch=prefetch)
    return MobiusRunner(mdef, spec.training, make_data(spec), cfg)


def _evict(runner: MobiusRunner) -> None:
    """Write the tier's files out and drop them from the page cache."""
    runner.tier.drain()
    for fd in [*runner.tier.fds.values(), runner.tier.act_fd]:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _timed(runner: MobiusRunner, step: int, cold: bool) -> float:
    if cold:
        _evict(runner)
    t0 = time.perf_counter()
    runner.step(step)
    runner.tier.drain()  # the step's writes are part of its cost
    return time.perf_counter() - t0


def _times(args, on: MobiusRunner, off: MobiusRunner) -> tuple[list[float], list[float]]:
    a, b = [], []
    for r in range(args.rounds):
        pair = ((on, a), (off, b)) if r % 2 == 0 else ((off, b), (on, a))
        for runner, out in pair:
            out.append(_timed(runner, r + 2, args.cold))
    return a, b


def _traffic(runner: MobiusRunner, devices: list[int]) -> None:
    moved = runner.traffic.moved
    P = sum(lay.n * 4 for lay in runner.layouts.values())
    A = moved[("acts", "down")]
    measured = moved[("params", "up")] + moved[("acts", "down")] + moved[("acts", "up")]
    measured += moved[("grads", "down")]
    optim = (
        sum(v for (k, d), v in moved.items() if k in ("optim", "ties"))
        + moved[("grads", "up")]
        + moved[("params", "down")]
    )
    print(f"parameters P = G = {P / MB:.1f} MiB, activations offloaded A = {A / MB:.2f} MiB")
    print(f"{'per step':<44}{'MiB':>10}{'x P':>8}")
    print(
        f"{'measured: params up + acts + grads down':<44}{measured / MB:>10.1f}{measured / P:>8.2f}"
    )
    print(
        f"{'eq. (1) Mobius: 2P + 2A + G':<44}{(3 * P + 2 * A) / MB:>10.1f}"
        f"{(3 * P + 2 * A) / P:>8.2f}"
    )
    for N in devices:
        eq2 = 2 * N * P + 2 * A + N * P
        print(
            f"{f'eq. (2) ZeRO-offload, N = {N}: 2NP + 2A + NG':<44}{eq2 / MB:>10.1f}{eq2 / P:>8.2f}"
        )
    print(
        f"{'measured: the update on upload (not in eq. 1)':<44}{optim / MB:>10.1f}{optim / P:>8.2f}"
    )


def _best_s(fn, n: int) -> float:
    """The least of ``n`` timed runs (other load on a shared host only adds)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _tier_Bps(folder: Path, nbytes: int, n: int) -> float:  # noqa: N802
    """Bytes per second of a pwrite then a preadv of ``nbytes`` in ``folder`` (the
    runtime's calls), both directions together."""
    buf = torch.ones(nbytes // 4).numpy().view("uint8")
    fd = os.open(folder / "bandwidth.probe", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, buf, 0)
        per = _best_s(lambda: (os.pwrite(fd, buf, 0), os.preadv(fd, [buf], 0)), n)
    finally:
        os.close(fd)
    return 2 * nbytes / per


def _swap_stages(args, runner: MobiusRunner) -> list[SwapStage]:
    """Each stage's measured compute and its record's bytes."""
    spec = _spec(args)
    mdef = model_def(spec.model, spec.training.seed, args.micro_batch)
    x, y = runner.data.batch(0, args.micro_batch)
    out, S = [], len(runner.cfg.stages)
    for j, blocks in enumerate(runner.cfg.stages):
        mod, last = Stage(mdef, blocks), j == S - 1
        lay = runner.layouts[j]
        with torch.no_grad():
            fwd = _best_s(lambda m=mod, x=x: m(x), args.probe)
            nxt = mod(x)

        def back(m=mod, x=x, nxt=nxt, last=last):
            xin = x.detach().requires_grad_(x.is_floating_point())
            o = m(xin)
            (m.loss(o, y) if last else o).backward(None if last else torch.ones_like(nxt))

        bwd = _best_s(back, args.probe)
        opt = build_optimizer(list(mod.parameters()), spec.training)
        opt.step()  # the slots exist from here on
        upd = _best_s(opt.step, args.probe)
        out.append(
            SwapStage(
                fwd,
                bwd - (fwd if last else 0.0),
                lay.n * 4,
                optim_bytes=len(lay.slots) * lay.n * 4,
                update_s=upd,
                input_bytes=x.nbytes if j else 0,
                boundary_bytes=nxt.nbytes,
            )
        )
        x = nxt
    return out


def _least(a: list[SwapStage], b: list[SwapStage]) -> list[SwapStage]:
    """Per stage, the least of two probes' times (the load on a shared host varies)."""
    keep = ("forward_s", "backward_s", "update_s")
    return [
        replace(x, **{k: min(getattr(x, k), getattr(y, k)) for k in keep})
        for x, y in zip(a, b, strict=True)
    ]


def _predicted(
    args, runner: MobiusRunner, folder: Path, before: list[SwapStage]
) -> tuple[float, float, float]:
    """The simulator's step, prefetch on and off, and the tier bandwidth it used, with
    the compute probed ``before`` the timed rounds and again now, the least of each."""
    stages = _least(before, _swap_stages(args, runner))
    largest = max(lay.nbytes for lay in runner.layouts.values())
    B = max(_tier_Bps(folder, largest, args.probe) for _ in range(2))
    got = []
    for prefetch in (True, False):
        cfg = MobiusSimConfig(
            devices=1, micro_batches=args.micro_batches, tier_Bps=B, prefetch=prefetch
        )
        got.append(simulate_mobius(stages, cfg).step_time)
    return got[0], got[1], B


def _partitions(args) -> tuple[list[int], list[int], MobiusConfig, list]:
    """The MIP's stage sizes and the even split into as many stages."""
    spec = _spec(args)
    cal = analytic_calibration(spec, analytic_fingerprint(spec.hardware, "bench"))
    layers = layer_costs(cal, args.micro_batch, args.micro_batches)
    cfg = MobiusConfig(
        devices=1,
        memory_bytes=args.memory_mb * MB,
        tier_Bps=args.tier_gbps * 1e9,
        micro_batches=args.micro_batches,
    )
    mip = mobius_partition(layers, cfg).sizes
    return mip, even_sizes(len(layers), len(mip)), cfg, layers


def _partition_quality(args, tmp: Path) -> None:
    mip, even, cfg, layers = _partitions(args)
    runners = [
        _runner(args, tmp / name, True, sizes) for name, sizes in (("mip", mip), ("even", even))
    ]
    for runner in runners:
        runner.step(0)
        runner.step(1)
    a, b = _times(args, *runners)
    print(f"{'partition':<10}{'stage sizes':<30}{'model s':>9}{'median s':>10}{'q1-q3 s':>14}")
    for name, sizes, got in (("MIP", mip, a), ("even", even, b)):
        shown = ",".join(map(str, sizes))
        q = statistics.quantiles(got, n=4)
        print(
            f"{name:<10}{shown:<30}{step_time(layers, sizes, cfg):>9.3f}"
            f"{statistics.median(got):>10.3f}{f'{q[0]:.3f}-{q[2]:.3f}':>14}"
        )
    pairs = sorted(y / x for x, y in zip(a, b, strict=True))  # each round's even / MIP
    print(
        f"even / MIP (measured median): {statistics.median(b) / statistics.median(a):.3f}; "
        f"per round: median {statistics.median(pairs):.3f}, "
        f"range {pairs[0]:.3f}-{pairs[-1]:.3f} over {len(pairs)} rounds"
    )
    for runner in runners:
        runner.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--probe", type=int, default=5, help="runs per timed stage cost")
    ap.add_argument("--cold", action="store_true", help="uploads from disk, not page cache")
    ap.add_argument("--partition", action="store_true", help="MIP vs even split instead")
    ap.add_argument("--memory-mb", type=float, default=48.0, help="G for the MIP, MiB")
    ap.add_argument("--tier-gbps", type=float, default=2.0, help="B for the MIP, GB/s")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.partition:
        with tempfile.TemporaryDirectory() as tmp:
            _partition_quality(args, Path(tmp))
        return
    with tempfile.TemporaryDirectory() as tmp:
        on = _runner(args, Path(tmp) / "on", True)
        off = _runner(args, Path(tmp) / "off", False)
        for runner in (on, off):  # warm-up: the first update-on-upload step
            runner.step(0)
            runner.step(1)
        before = _swap_stages(args, on)  # compute probed on both sides of the rounds
        a, b = _times(args, on, off)
        on.traffic.reset()
        on.step(args.rounds + 2)
        on.tier.drain()
        S = on.S
        tier = "cold (disk)" if args.cold else "page-cached"
        print(
            f"S = {S} stages on N = 1 device, M = {args.micro_batches}, AdamW, "
            f"{tier} tier, {args.rounds} rounds"
        )
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"step, prefetch:    median {ma * 1e3:8.1f} ms   best {min(a) * 1e3:8.1f} ms")
        print(f"step, no prefetch: median {mb * 1e3:8.1f} ms   best {min(b) * 1e3:8.1f} ms")
        print(f"no prefetch / prefetch: median {mb / ma:.3f}, best {min(b) / min(a):.3f}")
        pa, pb, B = _predicted(args, on, Path(tmp), before)
        print(f"simulated (tier {B / 1e9:.2f} GB/s measured, compute timed per stage):")
        print(f"{'':<13}{'predicted':>10}{'median':>10}{'best':>10}{'/ median':>10}{'/ best':>10}")
        for name, p, got in (("prefetch", pa, a), ("no prefetch", pb, b)):
            m, lo = statistics.median(got), min(got)
            print(
                f"{name:<13}{p * 1e3:>8.1f}ms{m * 1e3:>8.1f}ms{lo * 1e3:>8.1f}ms"
                f"{p / m:>10.3f}{p / lo:>10.3f}"
            )
        print(f"{'off / on':<13}{pb / pa:>10.3f}{mb / ma:>10.3f}{min(b) / min(a):>10.3f}")
        _traffic(on, [1, 2, 4])
        on.close()
        off.close()


if __name__ == "__main__":
    main()
