"""Analytic calibration: a Calibration derived from the job spec alone.

Compute times: for a named ``hardware.accelerator`` (public device facts,
``spec.devices``) and the builtin GPT, each operation of a block priced as the device
runs it (``analytic_device``: matrix multiplies at the measured share of the peak with
tile and wave quantization, memory-bound operations at the achievable bandwidth, kernel
launches); otherwise the analytic FLOPs of ``model.costs.model_costs`` at
``hardware.flops_tflops`` taken as the sustained rate, plus a fixed per-block overhead
(kernel launches, Python), so that F(m)/m improves with m and then flattens as on real
devices. ``training.precision`` sets the bytes of activations, boundary sends and
gradients (2 per element in fp16 / bf16); training state stays 16 bytes per parameter
under AdamW either way (half weights and gradients plus fp32 master weights and
moments: 2 + 2 + 12, Rajbhandari et al., ZeRO, sec. 3.1). Links and allreduces come
from ``hardware.interconnect`` (latency + bytes / bandwidth, ring allreduce). This is
what lets a laptop plan a 1,024-GPU job, and it supplies the inter-node values of a
measured calibration on a single machine, where they cannot be measured.
"""

from __future__ import annotations

import os
import time

import torch

from jobctl.engine.calibration.analytic_device import (
    ELEMENT_BYTES,
    GptShape,
    Roofline,
    embed_times,
    head_times,
    layer_times,
    optimizer_time,
)
from jobctl.engine.calibration.record import (
    AllreduceCalibration,
    BlockCalibration,
    Calibration,
    Fingerprint,
    HostCalibration,
    LinkCalibration,
    Stat,
)
from jobctl.engine.model.costs import model_costs
from jobctl.spec import HardwareSpec, JobSpec, ModelSpec
from jobctl.spec.devices import device_facts

ANALYTIC_M = tuple(2**k for k in range(10))  # 1 .. 512
BLOCK_OVERHEAD_S = {"cpu": 1e-4, "cuda": 1e-4}  # launches and Python per block pass
MEMORY_BANDWIDTH_BPS = {"cpu": 2e10, "cuda": 1.5e12}
OPTIMIZER_BYTES_PER_PARAM = 28  # AdamW reads weight, grad, 2 moments; writes 3 of them


def link_from_spec(hardware: HardwareSpec, same_node: bool) -> LinkCalibration:
    """Point-to-point link of ``hardware.interconnect``: latency + bytes / bandwidth."""
    ic = hardware.interconnect
    gbps = ic.intra_node_gbps if same_node else ic.inter_node_gbps
    return LinkCalibration(
        source="analytic", latency_s=ic.latency_us * 1e-6, bandwidth_Bps=gbps * 1e9 / 8
    )


def allreduce_from_spec(hardware: HardwareSpec, same_node: bool) -> AllreduceCalibration:
    """Ring allreduce over the interconnect's links (no measured points)."""
    link = link_from_spec(hardware, same_node)
    return AllreduceCalibration(
        source="analytic", latency_s=link.latency_s, bandwidth_Bps=link.bandwidth_Bps
    )


def host_from_spec(hw: HardwareSpec) -> HostCalibration:
    """CPU workers of the local backend share this machine's cores; others do not share."""
    if hw.device == "cpu" and hw.backend == "local":
        cores = len(os.sched_getaffinity(0))
        slowdown = {k: max(1.0, k / cores) for k in range(2, 2 * cores + 1)}
        return HostCalibration(source="analytic", cores=cores, slowdown=slowdown)
    return HostCalibration(source="analytic", cores=hw.processes_per_node, slowdown={})


def analytic_fingerprint(hw: HardwareSpec, model_hash: str, threads: int = 1) -> Fingerprint:
    """The fingerprint of an analytic record: the model, and the device at its rate."""
    rate = hw.accelerator or (f"{hw.flops_tflops}TF" if hw.flops_tflops else "default")
    return Fingerprint(
        model=model_hash,
        device=f"{hw.device}:analytic:{rate}",
        torch=torch.__version__,
        threads=threads,
    )


def analytic_calibration(spec: JobSpec, fingerprint: Fingerprint) -> Calibration:
    """A Calibration computed from the spec: model FLOPs, device rate, interconnect."""
    costs = model_costs(spec)
    device = spec.hardware.device
    overhead = BLOCK_OVERHEAD_S[device]
    scale = ELEMENT_BYTES[spec.training.precision] / 4  # model_costs counts fp32 bytes
    # Weights and gradients stay fp32 at every precision: the runtime computes under
    # autocast over fp32 master weights (``runtime.step.autocast``) and sums p.grad as
    # it is (``runtime.optim.allreduce_grads``), as the measured record counts them
    # (numel x element_size); only activations and sends are half at fp16 / bf16.
    tied = _tied_param_bytes(spec.model, costs.num_blocks)
    blocks = [_block(costs, i, overhead, tied[i], device, scale) for i in range(costs.num_blocks)]
    if spec.hardware.accelerator and not spec.model.import_:
        blocks = device_blocks(spec, blocks)
    return Calibration(
        source="analytic",
        fingerprint=fingerprint,
        created=time.time(),
        micro_batch_sizes=list(ANALYTIC_M),
        blocks=blocks,
        data={},
        p2p_intra=link_from_spec(spec.hardware, True),
        p2p_inter=link_from_spec(spec.hardware, False),
        allreduce_intra=allreduce_from_spec(spec.hardware, True),
        allreduce_inter=allreduce_from_spec(spec.hardware, False),
        host=host_from_spec(spec.hardware),
    )


def _block(
    costs, i: int, overhead: float, tied: float, device: str, scale: float = 1.0
) -> BlockCalibration:
    """One block's analytic costs: FLOPs at the device rate plus a fixed overhead;
    bytes of activations and sends at ``scale`` x their fp32 size, weights and their
    gradients at fp32."""
    params = costs.params[i]
    step = costs.flops[i] / costs.device_flops  # forward seconds per sample
    fwd = {m: Stat(median=overhead + m * step) for m in ANALYTIC_M}
    acts, out = costs.act_bytes[i] * scale, costs.boundary_bytes[i] * scale
    return BlockCalibration(
        name=costs.names[i],
        params=params,
        param_bytes=4.0 * params,
        state_bytes=costs.state_bytes[i],
        tied_bytes=tied,
        act_bytes=acts,
        boundary_bytes=out,
        forward=fwd,
        forward_nograd=fwd,
        backward={m: Stat(median=overhead + 2 * m * step) for m in ANALYTIC_M},
        optimizer=Stat(median=params * OPTIMIZER_BYTES_PER_PARAM / MEMORY_BANDWIDTH_BPS[device]),
        peak_bytes={m: costs.state_bytes[i] + m * (acts + 2 * out) for m in ANALYTIC_M},
    )


def device_blocks(spec: JobSpec, blocks: list[BlockCalibration]) -> list[BlockCalibration]:
    """``blocks`` with compute and optimizer times from the accelerator's facts
    (``analytic_device``): embedding, transformer layers, head."""
    roof = Roofline.of(device_facts(spec.hardware.accelerator), spec.training.precision)
    md = spec.model
    shape = GptShape(md.seq_len, md.hidden, md.heads, md.vocab, md.dropout > 0)
    last = len(blocks) - 1
    out = []
    for i, b in enumerate(blocks):
        price = embed_times if i == 0 else head_times if i == last else layer_times
        times = {m: price(roof, shape, m) for m in ANALYTIC_M}
        fwd = {m: Stat(median=f) for m, (f, _) in times.items()}
        bwd = {m: Stat(median=x) for m, (_, x) in times.items()}
        # A micro-batch recomputed later casts the weights again (the recompute's
        # autocast exit clears the cast cache; analytic_device); the embedding is fp32.
        recast = 0.0 if i == 0 else roof.cast(b.params)
        first = {m: Stat(median=f + recast) for m, (f, _) in times.items()}
        opt = Stat(median=optimizer_time(roof, b.params, spec.training.precision))
        update = {"forward": fwd, "forward_nograd": first, "backward": bwd, "optimizer": opt}
        out.append(b.model_copy(update=update))
    return out


def _tied_param_bytes(m: ModelSpec, n: int) -> list[float]:
    """Bytes of the tied embedding on the first and last block (builtin GPT only)."""
    tied = [0.0] * n
    if not m.import_ and m.tie_embeddings and n > 1:
        tied[0] = tied[-1] = 4.0 * m.vocab * m.hidden
    return tied
