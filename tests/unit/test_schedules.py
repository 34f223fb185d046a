"""Schedule generators: validity, shapes from the papers, activation peaks, errors."""

from __future__ import annotations

import re

import pytest

from jobctl.engine.core.actions import B, F, Op, R, format_actions, format_schedule, parse_actions
from jobctl.engine.schedule.checks import ActivationPeak, peak_activations, validate
from jobctl.engine.schedule.generators import (
    SCHEDULES,
    advance_forward,
    advance_num_range,
    generate,
    gpipe,
    one_f_one_b,
    shifted_critical_path,
)
from jobctl.engine.schedule.varuna import varuna

GRID = [(P, M) for P in range(1, 9) for M in range(1, 3 * P + 1)]


def _all_schedules(P: int, M: int):
    for name in SCHEDULES:
        yield name, generate(name, P, M)
    yield "gpipe+recompute", gpipe(P, M, recompute=True)
    yield "1f1b+recompute", one_f_one_b(P, M, recompute=True)
    low, high = advance_num_range(P, M)
    for advance_num in range(low, high + 1):
        yield f"advance_forward({advance_num})", advance_forward(P, M, advance_num)


def _parse_schedule(text: str):
    return [parse_actions(line.split(":", 1)[1]) for line in text.splitlines()]


@pytest.mark.parametrize("P,M", GRID)
def test_every_generator_is_valid_and_round_trips(P: int, M: int) -> None:
    for name, stages in _all_schedules(P, M):
        validate(stages, P, M, varuna_rules=name == "varuna")
        assert _parse_schedule(format_schedule(stages)) == stages, name


def test_generate_dispatches_and_rejects_unknown_names() -> None:
    assert generate("1f1b", 3, 4, recompute=True) == one_f_one_b(3, 4, recompute=True)
    assert generate("advance_forward", 3, 6, advance_num=4) == advance_forward(3, 6, 4)
    with pytest.raises(ValueError, match="valid schedules: 1f1b, advance_forward, gpipe"):
        generate("pipedream", 4, 8)
    with pytest.raises(ValueError, match="P >= 1"):
        generate("gpipe", 0, 8)


def test_gpipe_and_1f1b_shapes() -> None:
    assert format_schedule(gpipe(2, 3)) == "S0: F0 F1 F2 B0 B1 B2\nS1: F0 F1 F2 B0 B1 B2"
    assert format_schedule(one_f_one_b(3, 4)) == (
        "S0: F0 F1 F2 B0 F3 B1 B2 B3\nS1: F0 F1 B0 F2 B1 F3 B2 B3\nS2: F0 B0 F1 B1 F2 B2 F3 B3"
    )
    # GPipe with recompute: R(i) right before B(i), except the last stage's last micro-batch
    assert gpipe(2, 2, recompute=True) == [
        [F(0), F(1), R(0), B(0), R(1), B(1)],
        [F(0), F(1), R(0), B(0), B(1)],
    ]
    assert one_f_one_b(2, 2, recompute=True)[1] == [F(0), R(0), B(0), F(1), R(1), B(1)]


def test_shifted_critical_path_matches_merak_fig3c() -> None:
    """Merak Fig. 3c (4 stages, 5 micro-batches), read off the figure."""
    assert format_schedule(shifted_critical_path(4, 5)) == "\n".join(
        [
            "S0: F0 F1 F2 F3 R0 B0 F4 R1 B1 R2 B2 R3 B3 R4 B4",
            "S1: F0 F1 F2 R0 B0 F3 R1 B1 F4 R2 B2 R3 B3 R4 B4",
            "S2: F0 F1 F2 R0 B0 R1 B1 F3 R2 B2 F4 R3 B3 R4 B4",
            "S3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4",
        ]
    )


@pytest.mark.parametrize("P,M", GRID)
def test_1f1b_peak_activations(P: int, M: int) -> None:
    for s, actions in enumerate(one_f_one_b(P, M)):
        assert peak_activations(actions) == ActivationPeak(full=min(P - s, M), stashed=0)
    for s, actions in enumerate(one_f_one_b(P, M, recompute=True)):
        assert peak_activations(actions) == ActivationPeak(full=1, stashed=min(P - s, M))


def test_peak_activations_counts_full_and_stashed() -> None:
    assert peak_activations(gpipe(1, 5)[0]) == ActivationPeak(5, 0)
    # GPipe's last stage keeps F4 and recomputes the rest: 1 kept + 1 recomputed at once
    assert peak_activations(gpipe(2, 5, recompute=True)[1]) == ActivationPeak(2, 4)
    assert peak_activations(parse_actions("F0 F1 R0 B0 R1 B1")) == ActivationPeak(1, 2)


@pytest.mark.parametrize("P,M", GRID)
def test_varuna_rules(P: int, M: int) -> None:
    stages = varuna(P, M)
    assert not any(a.op is Op.RECOMPUTE for a in stages[-1]), "last stage recomputes"
    for actions in stages[:-1]:
        assert {a.micro_batch for a in actions if a.op is Op.RECOMPUTE} == set(range(M))
        for k, a in enumerate(actions):
            if a.op is Op.RECOMPUTE:  # rule 2: the very next action is its backward
                assert actions[k + 1] == B(a.micro_batch)


def test_varuna_4x5_shape_and_forwards_interspersed() -> None:
    """Varuna Fig. 5: forwards interleaved later in the schedule on stage 3 (index 2)."""
    stages = varuna(4, 5)
    assert format_actions(stages[3]) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4"
    assert format_actions(stages[2]) == "F0 F1 F2 R0 B0 R1 B1 R2 B2 F3 F4 R3 B3 R4 B4"
    assert varuna(4, 5) is not varuna(4, 5)  # cached, but callers get their own lists


@pytest.mark.parametrize("P,M", GRID)
def test_advance_forward_spans_1f1b_to_gpipe(P: int, M: int) -> None:
    low, high = advance_num_range(P, M)
    assert advance_forward(P, M, low) == one_f_one_b(P, M)
    assert advance_forward(P, M, high) == gpipe(P, M)
    for advance_num in range(low, high + 1):
        for s, actions in enumerate(advance_forward(P, M, advance_num)):
            assert peak_activations(actions).full == min(advance_num - s + 1, M)


def test_advance_forward_alg1_first_stage_and_range() -> None:
    # Alg. 1 on the first GPU with K=2, M=4, advance_num=2: two forwards in advance,
    # then forward/backward pairs, then the deferred backwards (Fig. 7c: 3 stashed)
    assert advance_forward(2, 4, 2)[0] == parse_actions("F0 F1 F2 B0 F3 B1 B2 B3")
    assert advance_forward(2, 4) == advance_forward(2, 4, 2)
    with pytest.raises(ValueError, match=r"outside \[3, 10\]"):
        advance_forward(4, 8, 2)
    with pytest.raises(ValueError, match=r"outside \[3, 10\]"):
        advance_forward(4, 8, 11)


@pytest.mark.parametrize(
    "text,M,message",
    [
        ("F0 B0 F1", 2, "no B for micro-batches [1]"),
        ("F0 F0 B0", 1, "F0 appears twice, at positions 0 and 1"),
        ("B0 F0", 1, "B0 at position 0 comes before F0 at 1"),
        (
            "F0 B0 R0",
            1,
            "R0 at position 2 must come after F0 (position 0) and before B0 (position 1)",
        ),
        ("F0 F3 B0", 1, "F3 at position 1 is outside micro-batches 0..0"),
    ],
)
def test_validate_rejects_bad_stages(text: str, M: int, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"stage 0: {message}")):
        validate([parse_actions(text)], 1, M)


def test_validate_detects_deadlock_and_stage_count() -> None:
    # stage 0 waits for B0's gradient before it sends F1; stage 1 needs F1 before B0
    stages = [parse_actions("F0 B0 F1 B1"), parse_actions("F0 F1 B0 B1")]
    with pytest.raises(ValueError, match="deadlocks: stage 0 waits at B0 .* stage 1 waits at F1"):
        validate(stages, 2, 2)
    with pytest.raises(ValueError, match="expected P=3"):
        validate(stages, 3, 2)


def test_validate_varuna_rules() -> None:
    rule2 = [parse_actions("F0 F1 R0 F2 B0 R1 B1 R2 B2"), parse_actions("F0 B0 F1 B1 F2 B2")]
    validate(rule2, 2, 3)
    with pytest.raises(ValueError, match="stage 0: F2 at position 3 runs between R0 and B0"):
        validate(rule2, 2, 3, varuna_rules=True)
    with pytest.raises(ValueError, match="last stage never recomputes"):
        validate(one_f_one_b(2, 2, recompute=True), 2, 2, varuna_rules=True)
