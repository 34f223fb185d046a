"""Where CSR beats dense for a pruned linear layer on this device (DynPipe Fig. 3.2).

A crossover record holds, per device (its name, torch version and intra-op threads)
and shape class (out features, in features, tokens per micro-batch), the CSR / dense
time ratio of one training micro-batch of the layer (forward, input and weight
gradients; CSR adds the values gather after each optimizer step, amortised over the
step's micro-batches) at a ladder of sparsities, and the crossover: the lowest measured
sparsity from which CSR is faster by at least ``1 - MARGIN`` at every higher one
(None: dense always wins). Records live beside the calibrations, in
``<home>/calibration/sparse-<device key>.json``.

``pruning.sparse_threshold: auto`` switches a layer to CSR only when its sparsity is at
or above the crossover of its shape class; ``resolve`` finds each needed class in the
cache and measures the missing ones once (then caches them). ``python -m benchmarks run
sparse_crossover`` prints the whole ladder and refreshes the record.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

from jobctl.engine.calibration.cache import device_name
from jobctl.engine.core.home import default_home
from jobctl.engine.pruning.sparse import CsrWeights, csr_linear

SPARSITIES = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)
MARGIN = 0.9  # CSR must take at most 90 % of dense time: noise must not flip a layer
Shape = tuple[int, int, int]  # (out features, in features, tokens per micro-batch)


def shape_key(shape: Shape) -> str:
    out_f, in_f, tokens = shape
    return f"{out_f}x{in_f}@{tokens}"


def device_id(device: torch.device, threads: int | None = None) -> dict:
    """What a record is valid for: device name, torch version, intra-op threads (this
    process's unless given: ``jobctl plan`` asks for the workers' one thread)."""
    return {
        "device": device_name(device.type),
        "torch": torch.__version__,
        "threads": threads or torch.get_num_threads(),
    }


def record_path(home: Path | None, device: torch.device, threads: int | None = None) -> Path:
    raw = json.dumps(device_id(device, threads), sort_keys=True).encode()
    key = hashlib.sha256(raw).hexdigest()[:16]
    return Path(home or default_home()) / "calibration" / f"sparse-{key}.json"


def load(path: Path) -> dict[str, dict]:
    """Shape key -> {"crossover": float | None, "ratios": {sparsity: csr/dense}}."""
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())["shapes"]
    except (OSError, ValueError, KeyError):
        return {}  # unreadable: measured again and rewritten


def save(path: Path, shapes: dict[str, dict], device: torch.device) -> None:
    """Write the record atomically (a concurrent reader sees the old or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{time.monotonic_ns()}.tmp")
    tmp.write_text(json.dumps({**device_id(device), "shapes": shapes}, indent=1))
    tmp.replace(path)


def _best(fn, repeat: int, device: torch.device) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def time_layer(
    shape: Shape, sparsity: float, micro_batches: int, repeat: int, device: torch.device
) -> tuple[float, float]:
    """Seconds per micro-batch (dense, CSR) of one layer's forward + backward."""
    out_f, in_f, tokens = shape
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, in_f, generator=g).to(device).requires_grad_(True)
    w = torch.randn(out_f, in_f, generator=g).to(device)
    mask = (torch.rand(out_f, in_f, generator=g) >= sparsity).to(device)
    w = (w * mask).requires_grad_(True)
    b = torch.zeros(out_f, device=device, requires_grad=True)
    grad = torch.randn(tokens, out_f, generator=g).to(device)
    csr = CsrWeights(w, mask)
    dense = _best(lambda: F.linear(x, w, b).backward(grad), repeat, device)
    sparse = _best(lambda: csr_linear(x, w, b, csr).backward(grad), repeat, device)
    gather = _best(lambda: csr.refresh(w), repeat, device)
    return dense, sparse + gather / max(1, micro_batches)


def measure(
    shape: Shape,
    micro_batches: int,
    repeat: int = 10,
    device: torch.device | None = None,
    ladder: Iterable[float] = SPARSITIES,
    stop_early: bool = True,
) -> dict[float, float]:
    """CSR / dense time ratio per sparsity, from the sparsest down; ``stop_early``
    stops below the first sparsity where CSR loses (nothing lower can be a crossover)."""
    device = device or torch.device("cpu")
    ratios: dict[float, float] = {}
    for s in sorted(ladder, reverse=True):
        dense, csr = time_layer(shape, s, micro_batches, repeat, device)
        ratios[s] = csr / dense
        if stop_early and ratios[s] > MARGIN:
            break
    return ratios


def crossover(ratios: dict[float, float], margin: float = MARGIN) -> float | None:
    """Lowest sparsity from which CSR wins (ratio <= margin) at every higher one."""
    found = None
    for s in sorted(ratios, reverse=True):
        if ratios[s] > margin:
            break
        found = s
    return found


def entry(ratios: dict[float, float]) -> dict:
    return {"crossover": crossover(ratios), "ratios": {str(s): r for s, r in ratios.items()}}


def resolve(
    shapes: Iterable[Shape],
    micro_batches: int,
    home: Path | None = None,
    device: torch.device | None = None,
    measure_missing: bool = True,
) -> dict[str, float | None]:
    """Crossover per shape key: cached, else measured now and cached (or None when
    ``measure_missing`` is off: an unmeasured shape stays dense)."""
    device = device or torch.device("cpu")
    path = record_path(home, device)
    known = load(path)
    missing = sorted({s for s in shapes if shape_key(s) not in known})
    if measure_missing and missing:
        for s in missing:
            known[shape_key(s)] = entry(measure(s, micro_batches, device=device))
        save(path, known, device)
    return {k: v.get("crossover") for k, v in known.items()}


def ratio_at(record: dict, sparsity: float) -> float | None:
    """CSR / dense time of a shape at ``sparsity``: the measurement at the nearest
    sparsity at or below it (CSR gets faster with sparsity, so this is conservative);
    None if nothing at or below it was measured."""
    below = [(float(s), r) for s, r in record.get("ratios", {}).items()]
    below = [(s, r) for s, r in below if s <= sparsity + 1e-12]
    return max(below)[1] if below else None
