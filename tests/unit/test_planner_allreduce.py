"""The gradient allreduce the planner prices, on hand-computed numbers.

The runtime keeps fp32 master weights and gradients at every precision
(``runtime.step.autocast``) and sums ``p.grad`` as it is (``runtime.optim``), so a
half-precision plan moves fp32 gradients: 4 bytes per weight, as the measured record
counts them (numel x element_size). Only activations and boundary sends are half.
"""

from __future__ import annotations

import pytest

from jobctl.engine.calibration.cache import analytic_for
from jobctl.engine.planner.layout import Hosting, Layout
from jobctl.engine.planner.stage_costs import BlockTimes, stage_costs
from jobctl.spec import load_spec_text

SPEC = """
name: ar
model: {{family: gpt, layers: 8, hidden: 256, heads: 4, seq_len: 128, vocab: 1000}}
training: {{global_batch_size: 96, micro_batch_size: 2, steps: 1, precision: {precision}}}
hardware:
  backend: slurm
  nodes: 3
  processes_per_node: 4
  device: cuda
  memory_gb: 16
  flops_tflops: 100
  interconnect: {{intra_node_gbps: 100, inter_node_gbps: 10, latency_us: 50}}
parallelism: {{pipeline_stages: 4, data_parallel: 3, placement: pipeline_major}}
"""
LAYER_PARAMS = 12 * 256**2 + 13 * 256  # 4 weight matrices + biases + 2 layer norms


def _cal(precision: str):
    spec = load_spec_text(SPEC.format(precision=precision))
    return analytic_for(spec)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precision_halves_sends_not_gradients(precision):
    half, full = _cal(precision), _cal("fp32")
    layer = half.blocks[1]
    assert layer.params == LAYER_PARAMS
    assert layer.param_bytes == 4 * LAYER_PARAMS == full.blocks[1].param_bytes
    assert half.blocks[0].tied_bytes == 4 * 1000 * 256 == full.blocks[0].tied_bytes
    assert layer.boundary_bytes == pytest.approx(full.blocks[1].boundary_bytes / 2)
    assert layer.act_bytes == pytest.approx(full.blocks[1].act_bytes / 2)


def test_a_middle_stage_allreduce_is_its_fp32_ring_on_a_shared_nic():
    """Stage 1 holds 2 layers of 256: 2 x 789,760 weights, 6,318,080 fp32 bytes. Its
    ring: D = 3 replicas on 3 nodes (pipeline-major: ranks 1, 5, 9), 4 stages' rings
    on each node's 10 Gbit/s NIC (1.25e9 B/s shared by 4). Ring time 2 (D-1) x 50 us
    + 2 (D-1)/D x bytes x 4 / 1.25e9 = 2e-4 + 4/3 x 25,272,320 / 1.25e9 s."""
    cal = _cal("fp16")
    stages = [[0, 1, 2], [3, 4], [5, 6], [7, 8, 9]]
    layout = Layout(P=4, D=3, m=2, M=16, schedule="1f1b")
    host = Hosting(4, 3, 4, "pipeline_major", one_host=False, share_cores=False)
    assert host.rings_sharing(1) == 4 and not host.same_node((1, 0), (1, 2))
    ar = stage_costs(cal, layout, stages, host, BlockTimes.at(cal, 2)).ar
    assert 2 * LAYER_PARAMS * 4 == 6_318_080
    assert ar[1] == pytest.approx(2e-4 + 4 / 3 * 25_272_320 / 1.25e9, rel=1e-12)
    assert ar[1] == pytest.approx(0.027157141333, rel=1e-9)
    assert ar[2] == ar[1]  # same blocks, same ring
