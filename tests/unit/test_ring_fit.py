"""The allreduce calibration's fit of the ring model to measured points
(``engine.calibration.measure.comm._fit_ring``): t = 2(r-1) latency + 2(r-1)/r bytes
per_byte."""

from __future__ import annotations

import pytest

from jobctl.engine.calibration.measure.comm import _fit_ring


def _points(lat: float, per_byte: float, noise=(0.0, 0.0, 0.0)):
    rows = [(2, 4096, 0.0), (2, 65536, 0.0), (4, 65536, 0.0)]
    return [
        (r, b, 2 * (r - 1) * lat + 2 * (r - 1) / r * b * per_byte + e)
        for (r, b, _), e in zip(rows, noise, strict=True)
    ]


def test_exact_points_give_the_model_back():
    lat, per_byte = _fit_ring(_points(50e-6, 1e-9))
    assert lat == pytest.approx(50e-6) and per_byte == pytest.approx(1e-9)


def test_noise_that_bends_the_slope_negative_never_prices_bytes_free():
    # latency-dominated points whose larger messages happened to run faster
    rows = [(2, 4096, 300e-6), (2, 65536, 250e-6), (4, 4096, 900e-6), (4, 65536, 880e-6)]
    lat, per_byte = _fit_ring(rows)
    # not a ~1e15 B/s link: the largest message's time taken as all bytes
    assert per_byte == pytest.approx(880e-6 / (2 * 3 / 4 * 65536))
    assert 1 / per_byte < 1e9  # under 1 GB/s, as the points show at least
