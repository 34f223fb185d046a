"""Varuna Table 7's device model against a second public V100 measurement.

``python -m benchmarks.paper_tables`` prints it after Table 7: the same analytic device
model (``engine.calibration.analytic_device``) that prices every Table 7 row, on a
measurement Varuna did not make, so a row-by-row error cannot hide in fitted facts.
"""

from __future__ import annotations

from jobctl.engine.calibration.analytic_device import (
    GptShape,
    Roofline,
    embed_times,
    head_times,
    layer_times,
    optimizer_time,
)
from jobctl.spec.devices import device_facts

# Megatron-LM v1.0 (NVIDIA ADLR blog "MegatronLM's Supercharged V1.0", 2020): the 1.2B
# GPT-2 of the Megatron-LM paper's Table 1 (40 layers of 1536, 16 heads, sequence 1024,
# vocabulary padded to 51200) at batch 8 on one DGX-2H V100: 1288 ms per iteration,
# 62.4 TFLOP/s, "48 % of the theoretical peak" (so about 130 TFLOP/s: a 450 W card).
MEGATRON_V1 = (40, 1536, 16, 51200, 8, 1.288)  # layers, hidden, heads, vocab, batch, s


def megatron_check() -> float:
    """The device model against another public V100 measurement, not Varuna's:
    ``MEGATRON_V1`` priced on the V100 SXM2 facts (125 TFLOP/s, 300 W). 62.4 TFLOP/s at
    1288 ms is 8.0e13 FLOPs per iteration, 8 x params x tokens: the count includes
    activation recompute, so every layer runs a forward without graph, its recompute
    and its backward; then the embedding, the head and the optimizer. Returns
    predicted / measured."""
    L, h, a, v, b, real = MEGATRON_V1
    r = Roofline.of(device_facts("v100-sxm2-16gb"), "fp16")
    g = GptShape(1024, h, a, v, True)
    f, back = layer_times(r, g, b)
    params = L * (12 * h * h + 13 * h) + (v + 1024) * h + 2 * h
    step = L * (2 * f + back) + sum(head_times(r, g, b)) + sum(embed_times(r, g, b))
    step += optimizer_time(r, params, "fp16")
    print("\nthe same device model vs Megatron-LM v1.0's 1.2B GPT-2, batch 8, on one")
    print(f"DGX-2H V100 (450 W): measured {1e3 * real:.0f} ms per iteration, predicted")
    print(
        f"{1e3 * step:.0f} ms on the 300 W SXM2 facts ({100 * (step / real - 1):+.1f} %, "
        "with jobctl's fp32 gradient path)"
    )
    return step / real
