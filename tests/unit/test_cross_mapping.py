"""Mobius's cross mapping (sec. 3.3, eqs. 12-13): Figure 4's example and exhaustive
search over every device order."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest
from pydantic import ValidationError

from jobctl.engine.mobius.planning.cross_mapping import (
    Topology,
    contention,
    cross_mapping,
    topology_of,
)
from jobctl.spec import SpecError, load_spec_text


def test_figure_4_cross_maps_stage_5_and_6_to_p1_and_p3() -> None:
    """8 stages on 4 GPUs, P1 and P2 under one root complex, P3 and P4 under another
    (devices 0-3 here). Sequential mapping puts stages 5 and 6 on P1 and P2; cross
    mapping puts them on P1 and P3 (Figure 4b), alternating the complexes."""
    fig4 = Topology(root_complexes=[[0, 1], [2, 3]])
    m = cross_mapping(8, fig4)
    assert m.stage_devices == (0, 2, 1, 3, 0, 2, 1, 3)
    assert (m.stage_devices[4], m.stage_devices[5]) == (0, 2)
    # Eq. 13 by hand: each complex holds stages 2 apart (1/2 + 1/4 + 1/6 + 1/2 + 1/4 +
    # 1/2 = 13/6), times 2 GPUs sharing it, for both complexes: 26/3. Sequential: pairs
    # at 1, 4, 5, 3, 4, 1 -> 91/30, x 2 x 2 = 182/15.
    assert m.contention == Fraction(26, 3)
    assert m.sequential == Fraction(182, 15)
    assert contention(m.stage_devices, fig4) == m.contention


def test_contention_by_hand() -> None:
    topo = Topology(root_complexes=[[0, 2], [1]])
    # stages on 0, 1, 2: only stages 0 and 2 share a complex (2 devices), 2 apart.
    assert contention([0, 1, 2], topo) == Fraction(1)
    assert contention([0, 2, 1], topo) == Fraction(2)
    assert contention([1, 1], topo) == Fraction(1)  # a lone device shares with itself


def _random_topology(rng: random.Random) -> Topology:
    n = rng.randint(1, 6)
    devices = list(range(n))
    rng.shuffle(devices)
    cuts = sorted(rng.sample(range(1, n), rng.randint(0, n - 1))) if n > 1 else []
    bounds = [0, *cuts, n]
    return Topology(root_complexes=[devices[a:b] for a, b in itertools.pairwise(bounds)])


def test_search_equals_every_device_order() -> None:
    rng = random.Random(13)
    for _ in range(25):
        topo = _random_topology(rng)
        N = topo.devices
        S = rng.randint(1, 3 * N)
        brute = min(
            (contention([o[s % N] for s in range(S)], topo), o)
            for o in itertools.permutations(range(N))
        )
        m = cross_mapping(S, topo)
        assert (m.contention, m.order) == brute, topo
        assert m.contention <= m.sequential


def test_eight_gpus_four_per_complex() -> None:
    """The paper's sec. 4.4 server: 8 GPUs, 4 under each root complex, 16 stages:
    the complexes alternate stage by stage and the cost is below sequential mapping."""
    topo = Topology(root_complexes=[[0, 1, 2, 3], [4, 5, 6, 7]])
    m = cross_mapping(16, topo)
    assert m.order == (0, 4, 1, 5, 2, 6, 3, 7)
    assert m.contention < m.sequential


@pytest.mark.parametrize(
    "complexes, message",
    [
        ([[0, 1], [1, 2]], "exactly once"),
        ([[0, 2]], "exactly once"),
        ([[0], []], "lists no device"),
        ([], "at least 1"),
    ],
)
def test_topology_rejects_bad_lists(complexes, message) -> None:
    with pytest.raises(ValidationError, match=message):
        Topology(root_complexes=complexes)


def test_no_stages_is_an_error() -> None:
    with pytest.raises(ValueError, match="stages"):
        cross_mapping(0, Topology(root_complexes=[[0]]))


SPEC = """\
name: mobius
model:
  layers: 2
training:
  global_batch_size: 8
  steps: 5
hardware:
  processes_per_node: 4
  topology:
    root_complexes: {complexes}
"""


def test_hardware_topology_feeds_the_cross_mapping() -> None:
    spec = load_spec_text(SPEC.format(complexes="[[0, 1], [2, 3]]"))
    topo = topology_of(spec.hardware)
    assert topo == Topology(root_complexes=[[0, 1], [2, 3]])
    assert cross_mapping(8, topo).order == (0, 2, 1, 3)
    assert topology_of(load_spec_text(SPEC.split("  topology:")[0]).hardware) is None


@pytest.mark.parametrize(
    "complexes, message, fix",
    [
        ("[[0, 1], [2, 4]]", "device 4 is not on a node of 4", "indices 0 .. 3"),
        ("[[0, 1], [1, 2, 3]]", "device 1 is under more than one", "exactly one"),
        ("[[0, 1], [2]]", "devices [3] are under no root complex", "a list of its own"),
        ("[[0, 1, 2, 3], []]", "lists no device", "drop the empty list"),
    ],
)
def test_hardware_topology_errors_name_the_field_line_and_fix(complexes, message, fix) -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text(SPEC.format(complexes=complexes), "jobs/mobius.yaml")
    (issue,) = info.value.errors
    assert issue.path == "hardware.topology.root_complexes"
    assert (issue.file, issue.line) == ("jobs/mobius.yaml", 10)
    assert message in issue.message and fix in issue.fix
