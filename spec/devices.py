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
# cuBLAS mixed-precision GEMM at up to 83 TFLOP/s on a V100 whose peak their abstract
# gives as 125 TFLOP/s, i.e. the SXM2 card (300 W, 1530 MHz boost): 83 / 125 of a card's
# own peak. The PCIe card is the same chip at 1380 MHz boost under 250 W; ASSUMED (no
# public PCIe measurement found) to reach the same share of its 112 (about 74 TFLOP/s,
# not 83: the share was once taken of 112, pricing every V100 PCIe matrix multiply
# 12.5 % fast; a 250 W card may sustain a lower clock still). bandwidth_fraction:
# Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking"
# (arXiv:1804.06826, sec. 3) measured 750 GB/s of the 900 GB/s. launch_us: the same
# report's order of magnitude for a kernel launch, ~5 us (host side, PyTorch eager adds
# its own dispatch; negligible at the shapes planned here).
_V100_PCIE = DeviceFacts(
    peak_tflops={"fp32": 14.0, "fp16": 112.0},
    memory_gbps=900.0,
    memory_gb=16.0,
    sms=80,
    gemm_fraction=83.0 / 125.0,
    bandwidth_fraction=750.0 / 900.0,
    launch_us=5.0,
)
# SXM2 column of the same datasheet: 15.7 TFLOP/s single, 125 tensor, 900 GB/s; same
# chip (80 SMs), so the same measured fractions (83 / 125 is this card's own, measured).
_V100_SXM2 = _V100_PCIE.model_copy(update={"peak_tflops": {"fp32": 15.7, "fp16": 125.0}})

# NVIDIA H100 Tensor Core GPU datasheet (2023, SXM5 column): 989 TFLOP/s dense BF16/FP16
# tensor (1,979 with sparsity), 67 TFLOP/s FP32, 3.35 TB/s HBM3, 80 GB; 132 SMs: "NVIDIA
# H100 Tensor Core GPU Architecture" whitepaper (2022), Table 3. gemm_fraction and
# bandwidth_fraction: measured on this project's lent H100 machines (recorded in the
# workplace's device notes, 2026-11-13): an 8192^3 bf16 torch.matmul at 798 TFLOP/s, a
# device-to-device copy at 3.0 TB/s counting bytes read and written.
_H100_SXM = DeviceFacts(
    peak_tflops={"fp32": 67.0, "fp16": 989.0, "bf16": 989.0},
    memory_gbps=3350.0,
    memory_gb=80.0,
    sms=132,
    gemm_fraction=798.0 / 989.0,
    bandwidth_fraction=3000.0 / 3350.0,
    launch_us=5.0,
)
# NVIDIA H200 Tensor Core GPU datasheet (2024, SXM column): the H100's compute (989 TFLOP/s
# dense BF16/FP16, 67 FP32), 4.8 TB/s HBM3e, 141 GB, same GH100 chip (132 SMs).
# gemm_fraction and bandwidth_fraction: measured on the lent H200 machines (device notes,
# 2026-10-28 and 2026-11-04): 769-798 TFLOP/s on the same bf16 matmul, 4.3 TB/s copy.
_H200_SXM = _H100_SXM.model_copy(
    update={"memory_gbps": 4800.0, "memory_gb": 141.0, "bandwidth_fraction": 4300.0 / 4800.0}
)

DEVICES: dict[str, DeviceFacts] = {
    "h100-sxm-80gb": _H100_SXM,
    "h200-sxm-141gb": _H200_SXM,
    "v100-pcie-16gb": _V100_PCIE,
    "v100-sxm2-16gb": _V100_SXM2,
}


def device_facts(name: str) -> DeviceFacts:
    """The facts of a known accelerator (the spec's Literal has already checked it)."""
    return DEVICES[name]
