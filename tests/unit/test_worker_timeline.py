"""A worker's start-up timeline (engine/worker/timeline.py)."""

from __future__ import annotations

from jobctl.engine.worker.timeline import mark, read_marks


def test_marks_round_trip_through_a_log(capsys):
    mark("process", 100.25)
    mark("imported", 101.5)
    mark("process", 200.0)  # a later attempt appends to the same rank log
    text = "rank 0 on node 0\n" + capsys.readouterr().out + "jobctl-startup broken\n"
    assert read_marks(text) == {"process": 200.0, "imported": 101.5}
