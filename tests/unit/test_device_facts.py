"""The known-device table and the roofline priced from it (spec.devices, analytic_device)."""

from __future__ import annotations

import pytest

from jobctl.engine.calibration.analytic_device import Roofline
from jobctl.spec.devices import DEVICES, device_facts


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
