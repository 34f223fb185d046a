"""Analytic per-block costs of a model: FLOPs, parameters, state and activation bytes.

These describe a model without building it and feed the analytic calibration
(``calibration.analytic``): a laptop can plan a 1,024-GPU job from the spec alone.
A measured calibration (``jobctl calibrate``) replaces them when one matches.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobctl.engine.model.blocks import model_def, param_count
from jobctl.spec import JobSpec, ModelSpec

# Bytes of training state per parameter in fp32 AdamW: weight, grad, exp_avg, exp_avg_sq.
STATE_BYTES_PER_PARAM = {"adamw": 16, "adam": 16, "sgd": 12}
DEFAULT_TFLOPS = {"cpu": 0.05, "cuda": 100.0}


@dataclass(frozen=True)
class ModelCosts:
    """Per-block costs, index = block (cut-point section)."""

    names: list[str]
    params: list[int]  # parameter elements
    flops: list[float]  # forward FLOPs per sample
    state_bytes: list[float]  # training state (weights, grads, optimizer state), bytes
    act_bytes: list[float]  # activation bytes kept per sample for backward
    boundary_bytes: list[float]  # bytes per sample of the block's output (what a send moves)
    device_flops: float  # sustained FLOP/s of one device

    @property
    def num_blocks(self) -> int:
        return len(self.flops)


def gpt_block_params(h: int, t: int, v: int) -> tuple[int, int, int]:
    """Parameter counts of the embedding, one transformer block, and the head.

    A tied head still holds its own copy of the embedding when it sits on another stage.
    """
    return v * h + t * h, 12 * h * h + 13 * h, 2 * h + v * h


def model_costs(spec: JobSpec) -> ModelCosts:
    """Analytic costs of the spec's model on the spec's device."""
    hw, m = spec.hardware, spec.model
    per_param = STATE_BYTES_PER_PARAM[spec.training.optimizer]
    rate = (hw.flops_tflops or DEFAULT_TFLOPS[hw.device]) * 1e12
    if m.import_ or m.huggingface is not None:
        return _imported_costs(m, spec.training.seed, per_param, rate)
    h, t, v, L = m.hidden, m.seq_len, m.vocab, m.layers
    embed, block, head = gpt_block_params(h, t, v)
    params = [embed] + [block] * L + [head]
    flops = [2.0 * t * h] + [24.0 * t * h * h + 4.0 * t * t * h] * L + [2.0 * t * h * v]
    acts = [4.0 * t * h] + [4.0 * t * (16 * h + 2 * m.heads * t)] * L + [4.0 * t * (h + 2 * v)]
    boundary = [4.0 * t * h] * (L + 1) + [4.0 * t * v]
    names = ["embed"] + [f"block{i}" for i in range(1, L + 1)] + ["head"]
    state = [p * per_param for p in params]
    return ModelCosts(names, params, flops, state, acts, boundary, rate)


def _imported_costs(model: ModelSpec, seed: int, per_param: int, rate: float) -> ModelCosts:
    """Costs of a user model: a traced one's from its subgraphs' real shapes
    (``model.graph.profile``); hand-cut blocks at 2 FLOPs per parameter per token."""
    mdef = model_def(model, seed)
    if mdef.graph is not None:
        from jobctl.engine.model.graph.profile import profile

        costs = profile(mdef.graph, 1)
        params = [c.params for c in costs]
        flops = [c.flops for c in costs]
        acts = [float(c.act_bytes) for c in costs]
        boundary = [float(c.out_bytes) for c in costs]
        state = [c * per_param for c in params]
        return ModelCosts(mdef.names, params, flops, state, acts, boundary, rate)
    counts = [param_count(mdef.block(i)) for i in range(mdef.num_blocks)]
    t = model.seq_len
    flops = [2.0 * c * t for c in counts]
    acts = [4.0 * t * 64] * len(counts)
    state = [c * per_param for c in counts]
    return ModelCosts(mdef.names, counts, flops, state, acts, acts, rate)
