"""Known accelerators: public device facts the analytic calibration models a device from.

``hardware.accelerator`` names one of ``DEVICES``. Each value below is a published
figure with its source in a comment; nothing here is fitted to a measurement of jobctl
or to a paper's step times. The analytic calibration (``engine.calibration.analytic``)
turns these into achievable time per operation: matrix multiplies at the tensor-core
peak times the fraction cuBLAS was measured to reach, quantized to tiles and waves over
the SMs; memory-bound operations (layer norm, softmax, GeLU, dropout, the optimizer) at
the measured achievable memory bandwidth; and a launch cost per kernel.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DeviceFacts(BaseModel):
    """One accelerator's published figures."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    peak_tflops: dict[str, float] = Field(description="precision -> peak dense TFLOP/s")
    memory_gbps: float = Field(description="peak memory bandwidth, GB/s (1e9 B/s)")
    memory_gb: float = Field(description="device memory, GB")
    sms: int = Field(description="streaming multiprocessors (a GEMM's tiles run in waves)")
    gemm_fraction: float = Field(description="share of the peak a large cuBLAS GEMM reaches")
    bandwidth_fraction: float = Field(description="share of the peak bandwidth reached")
    launch_us: float = Field(description="host-side cost per kernel launch, microseconds")


# NVIDIA Tesla V100 datasheet (2018, "NVIDIA Tesla V100 GPU Accelerator", PCIe column):
# 14 TFLOP/s single precision, 112 TFLOP/s tensor (fp16 inputs, fp32 accumulate),
# 900 GB/s HBM2, 16 GB. No bf16 on Volta. 80 SMs: "NVIDIA Tesla V100 GPU Architecture"
# whitepaper (2017), Table 1. gemm_fraction: Markidis et al., "NVIDIA Tensor Core
# Programmability, Performance & Precision" (IPDPSW 2018, arXiv:1803.04014) measured
# cuBLAS mixed-precision GEMM on a V100 PCIe at 83 TFLOP/s: 83 / 112. bandwidth_fraction:
# Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking"
# (arXiv:1804.06826, sec. 3) measured 750 GB/s of the 900 GB/s. launch_us: the same
# report's order of magnitude for a kernel launch, ~5 us (host side, PyTorch eager adds
# its own dispatch; negligible at the shapes planned here).
_V100_PCIE = DeviceFacts(
    peak_tflops={"fp32": 14.0, "fp16": 112.0},
    memory_gbps=900.0,
    memory_gb=16.0,
    sms=80,
    gemm_fraction=83.0 / 112.0,
    bandwidth_fraction=750.0 / 900.0,
    launch_us=5.0,
)
# SXM2 column of the same datasheet: 15.7 TFLOP/s single, 125 tensor, 900 GB/s; same
# chip (80 SMs), so the same measured fractions.
_V100_SXM2 = _V100_PCIE.model_copy(update={"peak_tflops": {"fp32": 15.7, "fp16": 125.0}})

DEVICES: dict[str, DeviceFacts] = {
    "v100-pcie-16gb": _V100_PCIE,
    "v100-sxm2-16gb": _V100_SXM2,
}


def device_facts(name: str) -> DeviceFacts:
    """The facts of a known accelerator (the spec's Literal has already checked it)."""
    return DEVICES[name]
