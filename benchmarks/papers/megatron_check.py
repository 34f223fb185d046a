"""Varuna Table 7's device model against a second public V100 measurement.

``python -m benchmarks run paper_tables`` prints it after Table 7 (``run megatron_check``
alone): the same analytic device model (``engine.calibration.analytic_device``) that
prices every Table 7 row, on a measurement Varuna did not make, so a row-by-row error
cannot hide in fitted facts.
"""

from __future__ import annotations

import argparse

from tests.papers import MEGATRON_V1, megatron_step

QUESTION = (
    "How close is the analytic V100 device model to Megatron-LM v1.0's published 1.2B "
    "GPT-2 iteration?"
)
BASELINE = "Megatron-LM v1.0's 1288 ms per iteration on one DGX-2H V100, as published."


def megatron_check() -> float:
    """The device model against another public V100 measurement, not Varuna's:
    ``tests.papers.MEGATRON_V1`` priced on the V100 SXM2 facts (``megatron_step``).
    Returns predicted / measured."""
    real, step = MEGATRON_V1[-1], megatron_step()
    print("\nthe same device model vs Megatron-LM v1.0's 1.2B GPT-2, batch 8, on one")
    print(f"DGX-2H V100 (450 W): measured {1e3 * real:.0f} ms per iteration, predicted")
    print(
        f"{1e3 * step:.0f} ms on the 300 W SXM2 facts ({100 * (step / real - 1):+.1f} %, "
        "with jobctl's fp32 gradient path)"
    )
    return step / real


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    megatron_check()


if __name__ == "__main__":
    main()
