"""`jobctl status`: ETA, $ so far, upload age and lag, recoveries, stragglers, per rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.state.db import StateDB
from jobctl.engine.supervise.figures import (
    device_seconds,
    rank_compute,
    recent_rate,
    recoveries,
    run_figures,
    tail_records,
)
from jobctl.engine.views.status import RUN_COLUMNS, print_run, print_runs
from jobctl.spec import dump_yaml, load_spec

QUICKSTART = Path(__file__).resolve().parents[2] / "jobs" / "quickstart.yaml"

T0 = 1000.0
NOW = 1440.0
PRICE = 2.0  # USD per device-hour


class Clock:
    """The state DB's injected wall clock: every event gets ``t``."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _metrics(run_dir) -> None:
    """Attempt 1 trained steps 1-32 (10 s/step); attempt 2 resumed at 30: 31-45, 4 s/step."""
    recs = [{"kind": "step", "ts": T0 + 10 * s, "step": s, "loss": 5.0} for s in range(1, 33)]
    recs += [
        {"kind": "step", "ts": 1350 + 4 * (s - 31), "step": s, "loss": 3.0} for s in range(31, 46)
    ]
    for rank, (fwd, bwd) in enumerate([(2.0, 4.0), (3.0, 6.0)]):  # stage 0, rank 1 is slow
        recs.append(
            {
                "kind": "heartbeat",
                "ts": 1406.0,
                "step": 45,
                "rank": rank,
                "stage": 0,
                "node": rank,
                "fwd_ms": fwd,
                "bwd_ms": bwd,
                "compute_s": (fwd + bwd) / 1e3,
                "mem_mb": 150.0,
                "mem_kind": "rss",
                "max_rss_mb": 160.0,
            }
        )
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def _history(db: StateDB, clock: Clock, rid: str) -> None:
    """4 devices train 1010-1310, a node is lost, 2 devices train from 1340 on."""
    steps = [
        (1000, "phase", "launching: P=2 D=2 m=2 N_m=4 1f1b", None),
        (1010, "phase", "training: pid 1 supervising 2 node(s)", None),
        (1100, "checkpoint", "checkpoint at step 10 (local)", None),
        (1110, "upload", "checkpoint step 10 uploaded", None),
        (1200, "checkpoint", "checkpoint at step 20 (local)", None),
        (1215, "upload", "checkpoint step 20 uploaded", None),
        (1300, "checkpoint", "checkpoint at step 30 (local)", None),
        (1310, "phase", "morphing: lost node(s) [1]", None),
        (1320, "phase", "launching: P=1 D=2 m=2 N_m=4 1f1b", None),
        (1340, "phase", "training: pid 1 supervising 1 node(s)", None),
        (1350, "recovery", "training again 40.0 s after losing nodes", {"seconds": 40.0}),
        (1360, "recovery", "back in 12.5 s", {"recovery_s": 12.5}),
        (1400, "checkpoint", "checkpoint at step 40 (local)", None),
        (1405, "straggler", "rank(s) [1] on node(s) [0] slower", {"ranks": [1], "nodes": [0]}),
    ]
    for ts, kind, message, data in steps:
        clock.t = float(ts)
        if kind == "phase":  # the DB's own path: a legal transition and its event
            phase, note = message.split(": ", 1)
            db.set_phase(rid, phase, note)
        else:
            db.add_event(rid, kind, message, data)
    db.update_run(
        rid,
        step=45,
        loss=3.0,
        samples_per_s=4.0,
        devices=2,
        plan="P=1 D=2 m=2 N_m=4 1f1b",
        last_checkpoint=40,
        last_upload=20,
        stragglers="1",
        uploading_step=30,
    )


@pytest.fixture
def db(tmp_path):
    clock = Clock(T0)
    db = StateDB(tmp_path, clock=clock)
    spec = load_spec(
        QUICKSTART,
        {
            "training.steps": 100,
            "hardware.price_per_hour": PRICE,
            "checkpoint.remote": f"file://{tmp_path / 'remote'}",
        },
    )
    run_dir = db.runs_dir / "quick-1"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(dump_yaml(spec))
    _metrics(run_dir)
    db.create_run("quick-1", "quickstart", run_dir, total_steps=100, devices=4)
    _history(db, clock, "quick-1")
    # A second run with neither a spec nor metrics nor uploads: every unknown is "-".
    db.create_run("bare-1", "bare", tmp_path / "missing", total_steps=None)
    return db


def _figures(db: StateDB):
    return {r["id"]: run_figures(r, db.events(r["id"]), NOW) for r in db.list_runs()}


def test_figures_eta_cost_upload_lag_recoveries(db):
    f = _figures(db)["quick-1"]
    assert f.steps_per_s == pytest.approx(0.25)  # 31..45 at 4 s/step, not attempt 1's
    assert f.eta_s == pytest.approx((100 - 45) / 0.25)
    # 300 s x 4 devices (training 1010-1310) + 100 s x 2 devices (1340-now)
    assert f.device_hours == pytest.approx(1400 / 3600)
    assert f.cost_usd == pytest.approx(PRICE * 1400 / 3600)
    assert f.uploaded_at == 1215.0
    assert (f.lag_steps, f.lag_s) == (20, pytest.approx(NOW - 1300))  # step 30 waits since 1300
    assert f.recoveries == [40.0, 12.5]
    # now: 2 devices at $2/h, 4 s a step; the 55 steps left at that rate
    assert f.usd_per_step == pytest.approx(2 * PRICE / 3600 * 4)
    assert f.usd_to_finish == pytest.approx(55 * f.usd_per_step)
    bare = _figures(db)["bare-1"]
    assert (bare.eta_s, bare.cost_usd, bare.lag_steps) == (None, None, None)
    assert (bare.usd_per_step, bare.usd_to_finish) == (None, None)


def test_status_table_shows_every_column_and_the_numbers(db):
    con = Console(record=True, width=300)
    print_runs(con, db.list_runs(), _figures(db), now=NOW)
    text = con.export_text()
    header = next(line for line in text.splitlines() if "run" in line and "phase" in line)
    for col in RUN_COLUMNS:
        assert col in header, col
    assert RUN_COLUMNS == (
        "run",
        "phase",
        "step",
        "loss",
        "samples/s",
        "ETA",
        "devices",
        "plan",
        "ckpt",
        "uploaded",
        "upload lag",
        "$ so far",
        "$ to finish",
        "updated",
    )
    row = next(line for line in text.splitlines() if "quick-1" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    got = dict(zip(RUN_COLUMNS, cells, strict=True))
    assert got["step"] == "45/100" and got["devices"] == "2"
    assert got["ETA"] == "0:03:40"  # 55 steps at 0.25 steps/s
    assert got["$ so far"] == "$0.7778"  # 1400 device-s x $2/h
    assert got["$ to finish"] == "$0.2444"  # 55 steps x 4 s x 2 devices x $2/h
    assert got["uploaded"] == "20 (4m ago)"  # uploaded at 1215, 225 s before now
    assert got["upload lag"] == "20 steps / 0:02:20, uploading 30"
    bare = next(line for line in text.splitlines() if "bare-1" in line)
    cells = [c.strip() for c in bare.split("│")[1:-1]]
    got = dict(zip(RUN_COLUMNS, cells, strict=True))
    assert got["ETA"] == got["$ so far"] == got["upload lag"] == got["uploaded"] == "-"


def test_finished_run_has_no_eta_and_stops_billing(db):
    db.clock.t = 1420.0
    db.set_phase("quick-1", "stopped", "asked to stop")
    row = db.get_run("quick-1")
    f = run_figures(row, db.events("quick-1"), NOW + 1000)
    assert f.eta_s is None
    assert f.device_hours == pytest.approx((300 * 4 + 80 * 2) / 3600)  # until 1420
    assert f.lag_s == pytest.approx(1420 - 1300)  # waited until the run ended


def test_status_detail_recoveries_stragglers_ranks_events(db):
    row = db.get_run("quick-1")
    evs, recs = db.events("quick-1"), tail_records(row["run_dir"])
    ranks = rank_compute(recs)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[1]["slowdown"] == pytest.approx(0.5)  # 9 ms vs its peer's 6 ms
    con = Console(record=True, width=200)
    print_run(con, row, evs[-20:], run_figures(row, evs, NOW, recs), ranks, now=NOW)
    text = con.export_text()
    assert "recovery times" in text and "40.0 s, 12.5 s" in text
    assert "rank(s) 1 on node(s) [0]" in text
    assert "ETA" in text and "0:03:40" in text and "$0.7778" in text
    assert "$ to finish" in text and "$0.2444 at the current rate" in text
    rows = [[c.strip() for c in x.split("│")[1:-1]] for x in text.splitlines() if "%" in x]
    assert ["1", "0", "1", "45", "3.00", "6.00", "+50 %", "150.0 MiB rss"] in rows
    assert "recent events" in text and "straggler" in text and "morphing" in text


def test_status_cli_lists_the_new_columns(db, tmp_path):
    r = CliRunner().invoke(app, ["status", "--home", str(tmp_path)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    for col in ("ETA", "upload lag", "$ so far"):
        assert col in r.output
    r = CliRunner().invoke(
        app, ["status", "quick-1", "--home", str(tmp_path)], env={"COLUMNS": "200"}
    )
    assert r.exit_code == 0, r.output
    assert "recovery times" in r.output and "vs stage peers" in r.output


def test_recovery_from_the_row_when_no_event_has_it():
    assert recoveries([], {"recovery_s": 7.5}) == [7.5]
    ev = {"kind": "recovery", "message": "training again 3.0 s after losing node(s) [1]"}
    assert recoveries([ev], {"recovery_s": 7.5}) == [3.0]  # events first, each one


def test_rate_and_devices_edge_cases(tmp_path):
    assert recent_rate([{"kind": "step", "ts": 1.0, "step": 1}]) is None
    evs = [
        {"kind": "phase", "ts": 0.0, "message": "training", "data": json.dumps({"devices": 8})},
        {"kind": "phase", "ts": 10.0, "message": "completed: done"},
    ]
    assert device_seconds(evs, 2, 100.0) == 80.0  # data["devices"] wins over the row's
    (tmp_path / "metrics.jsonl").write_text('{"kind": "step"}\n{"kind": "st')  # torn line
    assert tail_records(tmp_path) == [{"kind": "step"}]


def test_status_fits_80_columns_and_keeps_the_whole_run_id(db):
    """#24 item 5: a long run id is never cut, no cell is elided, and the table fits."""
    long_id = "quickstart-20261125-233653-566f"
    db.create_run(long_id, "quickstart", db.runs_dir / "q", total_steps=60)
    con = Console(record=True, width=80)
    print_runs(con, db.list_runs(), _figures(db), now=NOW)
    text = con.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "quickstart-20261125-233653-566f" in text and "…" not in text
    header = next(line for line in text.splitlines() if "phase" in line)
    for col in ("run", "phase", "step", "loss", "ETA"):
        assert col in header
    assert "more columns" in text and "None" not in text


def test_ago_never_negative():
    from jobctl.engine.views.status import ago

    assert ago(100.4, now=100.0) == "just now" and ago(100.0, now=160.0) == "60s ago"


def test_status_json_and_watch_of_ended_runs(db, tmp_path):
    r = CliRunner().invoke(app, ["status", "--json", "--home", str(tmp_path)])
    assert r.exit_code == 0, r.output
    runs = {x["id"]: x for x in json.loads(r.output)}
    assert runs["quick-1"]["step"] == 45 and runs["quick-1"]["loss"] == 3.0
    assert runs["bare-1"]["figures"]["eta_s"] is None
    db.set_phase("quick-1", "stopped", "asked")
    db.set_phase("bare-1", "failed", "gone")
    # --watch returns once every run shown has ended
    r = CliRunner().invoke(app, ["status", "--watch", "--interval", "0.1", "--home", str(tmp_path)])
    assert r.exit_code == 0 and "quick-1" in r.output
    r = CliRunner().invoke(
        app, ["status", "quick-1", "--home", str(tmp_path)], env={"COLUMNS": "80"}
    )
    assert r.exit_code == 0 and "3.0000" in r.output and "None" not in r.output


def test_samples_per_s_and_steps_per_s_come_from_one_window(db):
    """#47: `samples_per_s 8.3` (the newest step's own figure) stood beside `steps/s
    (recent) 0.707` (11.3 samples/s): both are now the recent window's, B apart."""
    db.update_run("quick-1", samples_per_s=8.3)  # the newest step's figure, not the window's
    row, evs = db.get_run("quick-1"), db.events("quick-1")
    f = run_figures(row, evs, NOW)
    assert f.samples_per_s == pytest.approx(16 * f.steps_per_s)  # B = 16, 0.25 steps/s
    con = Console(record=True, width=200)
    print_run(con, row, evs, f, now=NOW)
    text = con.export_text()
    assert "samples/s (recent) │ 4.0" in text and "8.3" not in text
    assert "│ samples_per_s " not in text  # the row's own figure is not shown beside it
    con = Console(record=True, width=300)
    print_runs(con, [row], {"quick-1": f}, now=NOW)
    cells = next(x for x in con.export_text().splitlines() if "quick-1" in x).split("│")
    assert cells[RUN_COLUMNS.index("samples/s") + 1].strip() == "4.0"


def test_a_run_with_no_price_shows_no_dollars(db, tmp_path):
    """#47: with no hardware.price_per_hour, `$0.0000` rows and columns are left out."""
    row = db.get_run("quick-1")
    spec = load_spec(Path(row["run_dir"]) / "spec.yaml", {"hardware.price_per_hour": 0.0})
    (Path(row["run_dir"]) / "spec.yaml").write_text(dump_yaml(spec))
    f = run_figures(row, db.events("quick-1"), NOW)
    assert f.cost_usd is None and f.usd_to_finish is None and f.device_hours > 0
    con = Console(record=True, width=200)
    print_run(con, row, [], f, now=NOW)
    text = con.export_text()
    assert "$" not in text and "device time" in text
    con = Console(record=True, width=300)
    print_runs(con, [row], {"quick-1": f}, now=NOW)
    text = con.export_text()
    assert "$" not in text and "more columns" not in text


NAN = float("nan")


def test_status_json_is_json_with_a_nan_eval_loss(db, tmp_path):
    """#46 item 5: `eval_loss: NaN` (schema-valid) made `status --json` print NaN,
    which no JSON parser but Python's accepts; it is null now."""
    run_dir = Path(db.get_run("quick-1")["run_dir"])
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "eval", "ts": 1407.0, "step": 45, "eval_loss": NAN}) + "\n")

    def refuse(constant: str):
        raise AssertionError(f"{constant} in status --json")

    for args in (["status", "--json"], ["status", "quick-1", "--json"]):
        r = CliRunner().invoke(app, [*args, "--home", str(tmp_path)])
        assert r.exit_code == 0, r.output
        json.loads(r.output, parse_constant=refuse)


def test_finite_makes_any_document_json():
    from jobctl.engine.core.events import finite

    doc = {"a": NAN, "b": [1.0, float("inf"), {"c": -float("inf")}], "d": (2, NAN), "e": "x"}
    assert finite(doc) == {"a": None, "b": [1.0, None, {"c": None}], "d": [2, None], "e": "x"}
