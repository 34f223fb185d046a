"""Published results the device model is judged against, as job specs: Varuna's Table 7
(sec. 7: GPT-2 2.5B and 8.3B on NC24_v3 VMs, 4 x V100 16 GB on PCIe per VM, 10 Gbps
Ethernet, fp16, global batch 8192, the Varuna schedule) and Megatron-LM v1.0's 1.2B
GPT-2 iteration. Shared by tests/unit/test_paper_tables.py and the benchmarks that print
them (``python -m benchmarks run paper_tables``, ``megatron_check``): the specs and their
pricing live here so the tests need no benchmark code."""

from __future__ import annotations

import math
from pathlib import Path

from jobctl.engine.calibration.analytic_device import (
    GptShape,
    Roofline,
    embed_times,
    head_times,
    layer_times,
    optimizer_time,
)
from jobctl.engine.calibration.cache import analytic_for
from jobctl.engine.calibration.record import Calibration
from jobctl.engine.core.plan import Plan
from jobctl.engine.planner.resolver import plan_priced
from jobctl.engine.planner.search import Candidate
from jobctl.engine.planner.simulator.simulation import SimResult
from jobctl.spec import JobSpec, load_spec
from jobctl.spec.devices import device_facts

MODELS = {"8.3B": (72, 3072, 32), "2.5B": (54, 1920, 20)}  # layers, hidden, heads
TABLE7 = [  # model, P, D, Varuna's estimate, measured (s per mini-batch)
    ("8.3B", 36, 3, 142.8, 140.3),
    ("8.3B", 36, 2, 198.7, 201.3),
    ("8.3B", 36, 1, 368.3, 390.0),
    ("8.3B", 24, 4, 144.7, 149.9),
    ("8.3B", 24, 2, 272.4, 280.4),
    ("8.3B", 18, 6, 139.6, 139.1),
    ("8.3B", 18, 4, 202.6, 203.1),
    ("8.3B", 18, 3, 266.6, 263.8),
    ("2.5B", 27, 2, 115.7, 116.8),
    ("2.5B", 18, 3, 92.6, 96.6),
    ("2.5B", 9, 7, 68.9, 70.1),
    ("2.5B", 6, 10, 77.5, 75.2),
]
SPEC = """\
name: varuna-{name}-{P}x{D}
model: {{family: gpt, layers: {L}, hidden: {h}, heads: {a}, seq_len: 1024, vocab: 50257,
        dropout: 0.1}}
training: {{global_batch_size: 8192, micro_batch_size: {m}, steps: 100, precision: fp16}}
hardware:
  backend: slurm
  nodes: {nodes}
  processes_per_node: 4
  device: cuda
  accelerator: v100-pcie-16gb
  memory_gb: 16
  interconnect: {{intra_node_gbps: 126, inter_node_gbps: 10, latency_us: 50}}
parallelism: {{pipeline_stages: {P}, data_parallel: {D}, schedule: varuna,
              placement: pipeline_major}}
"""


def write_spec(folder: Path, name: str, P: int, D: int, m: int | str) -> Path:
    """One Table 7 configuration as a job spec file."""
    L, h, a = MODELS[name]
    path = folder / f"varuna-{name}-{P}x{D}-m{m}.yaml"
    nodes = math.ceil(P * D / 4)
    path.write_text(
        SPEC.format(name=name.replace(".", "-").lower(), P=P, D=D, L=L, h=h, a=a, m=m, nodes=nodes)
    )
    return path


def analytic(spec: JobSpec) -> Calibration:
    """The analytic calibration of ``spec`` (its device model)."""
    return analytic_for(spec)


def predict(folder: Path, row: tuple, m: int | str = 1) -> tuple[Plan, SimResult, Candidate]:
    """The planner's plan, simulated step and chosen layout (its stage costs) of one
    Table 7 row at micro-batch size ``m`` (``"auto"``: the planner's own)."""
    name, P, D = row[:3]
    spec = load_spec(write_spec(folder, name, P, D, m))
    plan, sim, choice = plan_priced(spec, calibration=analytic(spec))
    return plan, sim, choice.found.ranked[0]


# Megatron-LM v1.0 (NVIDIA ADLR blog "MegatronLM's Supercharged V1.0", 2020): the 1.2B
# GPT-2 of the Megatron-LM paper's Table 1 (40 layers of 1536, 16 heads, sequence 1024,
# vocabulary padded to 51200) at batch 8 on one DGX-2H V100: 1288 ms per iteration,
# 62.4 TFLOP/s, "48 % of the theoretical peak" (so about 130 TFLOP/s: a 450 W card).
MEGATRON_V1 = (40, 1536, 16, 51200, 8, 1.288)  # layers, hidden, heads, vocab, batch, s


def megatron_step() -> float:
    """``MEGATRON_V1``'s iteration priced on the V100 SXM2 facts (125 TFLOP/s, 300 W), in
    seconds. 62.4 TFLOP/s at 1288 ms is 8.0e13 FLOPs per iteration, 8 x params x tokens:
    the count includes activation recompute, so every layer runs a forward without
    graph, its recompute and its backward; then the embedding, the head and the
    optimizer."""
    L, h, a, v, b, _ = MEGATRON_V1
    r = Roofline.of(device_facts("v100-sxm2-16gb"), "fp16")
    g = GptShape(1024, h, a, v, True)
    f, back = layer_times(r, g, b)
    params = L * (12 * h * h + 13 * h) + (v + 1024) * h + 2 * h
    step = L * (2 * f + back) + sum(head_times(r, g, b)) + sum(embed_times(r, g, b))
    return step + optimizer_time(r, params, "fp16")
