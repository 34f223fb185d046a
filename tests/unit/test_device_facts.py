"""The known-device table and the roofline priced from it (spec.devices, analytic_device)."""

from __future__ import annotations

import pytest

from jobctl.engine.calibration.analytic_device import GptShape, Roofline, embed_times, head_times
from jobctl.engine.calibration.cache import analytic_for
from jobctl.spec import load_spec
from jobctl.spec.devices import DEVICES, device_facts
from tests.jobrun import QUICKSTART


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_every_device_has_sane_published_figures(name):
    facts = device_facts(name)
    assert 0.5 < facts.gemm_fraction <= 1.0
    assert 0.5 < facts.bandwidth_fraction <= 1.0
    assert facts.peak_tflops["fp32"] < min(v for k, v in facts.peak_tflops.items() if k != "fp32")
    assert facts.sms > 0 and facts.memory_gb > 0


def test_h200_prices_a_large_bf16_matmul_at_the_rate_measured_on_one():
    """An 8192^3 bf16 product ran at 769-798 TFLOP/s on the lent H200s (device notes);
    the roofline may only add tile/wave quantization and one launch on top of that."""
    r = Roofline.of(device_facts("h200-sxm-141gb"), "bf16")
    n = 8192
    measured_s = 2.0 * n**3 / 798e12
    assert 1.0 <= r.gemm(n, n, n) / measured_s <= 1.1


def test_h200_streams_faster_than_h100_at_the_same_compute():
    h100 = Roofline.of(device_facts("h100-sxm-80gb"), "bf16")
    h200 = Roofline.of(device_facts("h200-sxm-141gb"), "bf16")
    assert h200.stream(1e9, 1) < h100.stream(1e9, 1)
    assert h200.gemm(4096, 4096, 4096) == pytest.approx(h100.gemm(4096, 4096, 4096))


def test_a_precision_the_device_lacks_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="fp32, fp16"):
        Roofline.of(device_facts("v100-pcie-16gb"), "bf16")


def test_v100_gemm_share_is_of_the_card_markidis_measured():
    """Markidis et al. measured 83 TFLOP/s of cuBLAS mixed precision on the 125 TFLOP/s
    (SXM2) V100: an 8192^3 fp16 product on it takes 2 * 8192^3 / 83e12 = 13.25 ms, and
    on the PCIe card (112 peak, same share) 2 * 8192^3 / (112e12 * 83 / 125) = 14.78 ms
    (it was once priced at 83 TFLOP/s on the PCIe card too: 13.25 ms)."""
    n = 8192  # 64 x 64 tiles, 4096 of them: 52 waves of 80 SMs, the last 16/80 full
    occupancy = 4096 / (52 * 80)
    sxm2 = Roofline.of(device_facts("v100-sxm2-16gb"), "fp16")
    pcie = Roofline.of(device_facts("v100-pcie-16gb"), "fp16")
    assert sxm2.gemm(n, n, n) == pytest.approx(2 * n**3 / 83e12 / occupancy + 5e-6)
    assert pcie.gemm(n, n, n) == pytest.approx(2 * n**3 / (112e12 * 83 / 125) / occupancy + 5e-6)
    assert 2 * n**3 / 83e12 == pytest.approx(13.25e-3, rel=1e-3)
    assert 2 * n**3 / (112e12 * 83 / 125) == pytest.approx(14.78e-3, rel=1e-3)


def test_autocast_gradient_path_bytes_per_weight():
    """Per micro-batch under autocast a weight's half gradient is cast back (read 2 B,
    write 4 B) and added into the fp32 .grad (read 4 + 4, write 4): 18 B; at fp32 only
    the add, 12 B. Casting a weight down reads 4 and writes 2: 6 B (nothing at fp32).
    On the V100 (750 GB/s achievable), 1e9 weights: 24 ms, 16 ms and 8 ms."""
    half = Roofline.of(device_facts("v100-pcie-16gb"), "fp16")
    full = Roofline.of(device_facts("v100-pcie-16gb"), "fp32")
    assert half.accumulate(1e9) == pytest.approx(18e9 / 750e9 + 2 * 5e-6)
    assert full.accumulate(1e9) == pytest.approx(12e9 / 750e9 + 5e-6)
    assert half.cast(1e9) == pytest.approx(6e9 / 750e9 + 5e-6)
    assert full.cast(1e9) == 0.0


def test_embedding_is_priced_in_fp32_at_every_precision():
    """Autocast leaves the lookup in its weight's dtype: the embedding's traffic is the
    same at fp16 as at fp32 (its gradient zero-filled, scattered and added in fp32)."""
    g = GptShape(1024, 1920, 20, 50257, True)
    half = Roofline.of(device_facts("v100-pcie-16gb"), "fp16")
    full = Roofline.of(device_facts("v100-pcie-16gb"), "fp32")
    assert embed_times(half, g, 2) == pytest.approx(embed_times(full, g, 2))
    table = 50257 * 1920  # zero-fill 4 B, scatter 3 n h, then the 12 B add
    n = 2 * 1024 * 1920
    assert embed_times(half, g, 2)[1] == pytest.approx(
        (3 * n + table) * 4 / 750e9 + 3 * 5e-6 + full.accumulate(table)
    )


def test_loss_on_fp32_logits_pass_by_pass():
    """lm_loss at fp16, n = 1024 tokens x v = 50257: forward the cast up (2 + 4 B) and
    log_softmax's three reads and a write (16 B) = 22 B per logit; backward nll_loss's
    zero-fill (4), log_softmax's two reads of the gradient, one of the output and a
    write (16), the cast down (4 + 2) = 26 B. The head's tied weight adds 18 B each."""
    g = GptShape(1024, 3072, 32, 50257, False)
    r = Roofline.of(device_facts("v100-pcie-16gb"), "fp16")
    n, v, h = 1024, 50257, 3072
    fwd, bwd = head_times(r, g, 1)
    ln = r.stream(2 * n * h, 2)
    assert fwd - r.gemm(n, v, h) - ln == pytest.approx(22 * n * v / 750e9 + 3 * 5e-6)
    loss_bwd = 26 * n * v / 750e9 + 3 * 5e-6
    rest = bwd - r.gemm(n, h, v) - r.gemm(h, v, n) - ln - loss_bwd
    assert rest == pytest.approx(r.accumulate(v * h + 2 * h))


def test_a_recomputed_micro_batch_casts_the_weights_again():
    """The first forward of a micro-batch recomputed later carries one cast of the
    block's weights (the recompute's autocast exit clears the cast cache); the
    embedding's lookup is fp32 and casts nothing; fp32 runs cast nothing at all."""
    for precision, per_weight in (("fp16", 6.0), ("fp32", 0.0)):
        spec = load_spec(
            QUICKSTART,
            overrides={
                "hardware.device": "cuda",
                "hardware.accelerator": "v100-pcie-16gb",
                "training.precision": precision,
            },
        )
        cal = analytic_for(spec)
        embed, layer = cal.blocks[0], cal.blocks[1]
        assert embed.forward_nograd[1].median == embed.forward[1].median
        extra = layer.forward_nograd[1].median - layer.forward[1].median
        launch = 5e-6 if per_weight else 0.0
        assert extra == pytest.approx(layer.params * per_weight / 750e9 + launch)
