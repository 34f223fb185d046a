"""The block timings' passes: 2 x ``repeats`` timed runs per block spread over the
passes (``COMPUTE_PASSES``, or another count ``calibrate(passes=)`` is given), the least
disturbed pass kept per micro-batch size."""

from __future__ import annotations

from jobctl.engine.calibration.analytic import analytic_calibration
from jobctl.engine.calibration.cache import fingerprint
from jobctl.engine.calibration.measure import runner
from jobctl.engine.calibration.record import Stat

from ..jobrun import tiny_spec


def _slowed(blocks, factor: float, m: int):
    """``blocks`` with every time at micro-batch size ``m`` multiplied by ``factor``."""
    kinds = ("forward", "forward_nograd", "backward")

    def one(b):
        return b.model_copy(
            update={
                k: {**getattr(b, k), m: Stat(median=getattr(b, k)[m].median * factor)}
                for k in kinds
            }
        )

    return [one(b) for b in blocks]


def test_the_timed_runs_are_spread_over_the_passes_and_the_least_disturbed_kept(monkeypatch):
    """Six passes of a third of two passes' runs each (the calibration takes as long);
    each pass is disturbed at one micro-batch size (a different one in turn), and every
    size still gets its undisturbed times; the model's speed is taken after every pass."""
    spec = tiny_spec()
    blocks = analytic_calibration(spec, fingerprint(spec)).blocks
    ms = sorted(blocks[0].forward)
    calls: list[int] = []

    def measure_blocks(spec, ms, device, repeats, progress=None):
        calls.append(repeats)
        slow_m = ms[(len(calls) - 1) % len(ms)]  # pass k is disturbed at one m
        return _slowed(blocks, 1.5 + 0.1 * len(calls), slow_m)

    monkeypatch.setattr(runner, "measure_data", lambda spec, ms, repeats: {})
    monkeypatch.setattr(runner, "measure_blocks", measure_blocks)
    monkeypatch.setattr(runner, "_model_speed", lambda spec, m, repeats: 0.01 * repeats)
    kept, data, speed = runner._measure_compute(spec, ms, 15, lambda what, f: None, 6)
    assert calls == [5] * 6 and speed == [0.05] * 6 and data == {}
    for k, b in enumerate(kept):
        for m in ms:
            assert b.forward[m].median == blocks[k].forward[m].median
            assert b.backward[m].median == blocks[k].backward[m].median


def test_the_shipped_two_passes_take_repeats_runs_each(monkeypatch):
    """``calibrate``'s default: ``COMPUTE_PASSES`` = 2 passes of ``repeats`` runs each."""
    spec = tiny_spec()
    blocks = analytic_calibration(spec, fingerprint(spec)).blocks
    calls: list[int] = []
    monkeypatch.setattr(runner, "measure_data", lambda spec, ms, repeats: {})
    monkeypatch.setattr(runner, "_model_speed", lambda spec, m, repeats: 1.0)
    monkeypatch.setattr(
        runner,
        "measure_blocks",
        lambda spec, ms, dev, repeats, progress=None: calls.append(repeats) or blocks,
    )
    ms = sorted(blocks[0].forward)
    runner._measure_compute(spec, ms, 15, lambda what, f: None, runner.COMPUTE_PASSES)
    assert calls == [15, 15]
