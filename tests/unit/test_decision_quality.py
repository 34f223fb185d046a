"""Regret and Kendall's tau of the planner's order against measured runs."""

from __future__ import annotations

import pytest

from benchmarks.decision_quality import kendall_tau, regret, summarise


def test_kendall_tau_counts_agreeing_pairs():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # One swapped neighbour pair of 6 pairs: (5 - 1) / 6.
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # tau-b with a tie in the second ordering: 5 concordant, 0 discordant, 1 tie.
    assert kendall_tau([1, 2, 3, 4], [1, 2, 3, 3]) == pytest.approx(5 / (6 * 5) ** 0.5)


def test_regret_is_the_pick_against_the_best_measured():
    # Predicted best is the second config (0.9 measured); the best measured is 1.0.
    assert regret([1.0, 3.0, 2.0], [1.0, 0.9, 0.5]) == pytest.approx(0.1)
    assert regret([3.0, 1.0], [2.0, 1.0]) == 0.0
    found = summarise([2.0, 1.0, 1.5], [1.0, 1.0, 1.0])
    assert (found["configs"], found["median_error"], found["max_error"]) == (3, 0.5, 1.0)
