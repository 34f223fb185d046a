"""jobctl's engine: plans, runs and supervises pipeline + data parallel training.

Each concern is a subpackage (its ``__init__`` says what it owns; ``engine/README.md``
is the map). A subpackage may import only from its own layer or the layers below it,
and subpackages of one layer must not import each other in a cycle.
``tests/unit/test_layers.py`` walks every import (module level and inside functions)
and enforces this order, low to high:
"""

from __future__ import annotations

#: The layer order, low to high. A name is a subpackage of ``jobctl.engine``;
#: ``calibration.measure`` (the probes, which run the trainer) sits above the
#: calibration record that the planner reads.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("model", "schedule", "data"),
    ("calibration",),
    ("planner",),
    ("runtime", "checkpoint", "channel", "state", "mobius"),
    ("pruning", "rebalance", "averaging"),
    ("worker", "calibration.measure"),
    ("supervise",),
    ("fleet", "recurring"),
    ("views",),
    ("cli",),
)
