"""Fleets in-process: the file format and its errors, planning, and the runner's
admission, stop and resume logic with fake member processes and a fake clock."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.core.process import process_token
from jobctl.engine.fleet.db import FleetDB
from jobctl.engine.fleet.loader import load_fleet, parameter_sets, sanitise
from jobctl.engine.fleet.planning import plan_fleet, record_fleet
from jobctl.engine.fleet.runner import FleetBusy, FleetRunner, admit
from jobctl.engine.state.db import StateDB
from jobctl.engine.state.leases import JobEvents
from jobctl.spec import SpecError

from ..jobrun import QUICKSTART, ROOT

NO_SUCH_PID = 4_190_000
runner = CliRunner()

TEMPLATE = """\
name: placeholder
model: {family: gpt, layers: {{ layers }}, hidden: 64, heads: 4, seq_len: 32, vocab: 256}
training:
  global_batch_size: 16
  micro_batch_size: 2
  steps: 3
  lr: {{ lr }}
hardware: {nodes: 1, processes_per_node: 4, price_per_hour: 0.5}
parallelism: {pipeline_stages: 1, data_parallel: {{ d }}}
"""


def _fleet_file(tmp_path: Path, body: str, name: str = "fleet.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _sweep(tmp_path: Path, extra: str = "", runs: str = "") -> Path:
    (tmp_path / "base.yaml").write_text(TEMPLATE)
    body = f"""\
    name: sweep
    base: base.yaml
    member_name: "sweep-{{{{ lr }}}}-{{{{ layers }}}}"
    params: {{lr: 0.01, layers: 2, d: 1}}
    matrix:
      lr: [0.01, 0.003]
      layers: [2, 4]
    {runs}
    {extra}
    """
    return _fleet_file(tmp_path, body)


def test_parameter_sets_cross_matrix_with_zip_then_add_runs(tmp_path):
    path = _fleet_file(
        tmp_path,
        """\
        name: f
        template: "name: x"
        params: {p: 0}
        matrix: {a: [1, 2]}
        zip: {b: [3, 4], c: [5, 6]}
        runs: [{a: 9}]
        """,
    )
    from jobctl.engine.fleet.spec import FleetSpec
    from jobctl.spec.source import parse_yaml

    spec = FleetSpec.model_validate(parse_yaml(path.read_text(), str(path)).data)
    assert parameter_sets(spec) == [
        {"p": 0, "a": 1, "b": 3, "c": 5},
        {"p": 0, "a": 1, "b": 4, "c": 6},
        {"p": 0, "a": 2, "b": 3, "c": 5},
        {"p": 0, "a": 2, "b": 4, "c": 6},
        {"p": 0, "a": 9},
    ]


def test_member_names_are_sanitised_to_job_name_rules():
    assert sanitise("Sweep LR=0.01 / Layers 4") == "sweep-lr-0.01-layers-4"
    assert sanitise("--x") == "x"


def test_members_render_from_the_base_with_their_parameters(tmp_path):
    fleet = load_fleet(_sweep(tmp_path, runs="runs: [{lr: 0.1, layers: 6, d: 2}]"))
    names = [m.name for m in fleet.members]
    assert names == [
        "sweep-0.01-2",
        "sweep-0.01-4",
        "sweep-0.003-2",
        "sweep-0.003-4",
        "sweep-0.1-6",
    ]
    last = fleet.members[-1].spec
    assert (last.name, last.training.lr, last.model.layers) == ("sweep-0.1-6", 0.1, 6)
    assert fleet.base_label == "base" and fleet.base.model.layers == 2


def test_a_bad_member_names_the_member_and_the_field_and_nothing_launches(tmp_path):
    # d: 9 replicas for 8 micro-batches (16 / 2) on a pool of 4 (any D trains, but
    # every replica needs a micro-batch, and the pool must hold them).
    path = _sweep(tmp_path, runs="runs: [{lr: -1, layers: 2, d: 1}, {lr: 0.1, layers: 2, d: 9}]")
    with pytest.raises(SpecError) as e:
        load_fleet(path)
    issues = {(i.member, i.path): i for i in e.value.errors}
    assert set(issues) == {
        ("sweep--1-2", "training.lr"),
        ("sweep-0.1-2", "training.global_batch_size"),
        ("sweep-0.1-2", "parallelism.pipeline_stages"),
    }
    lr = issues["sweep--1-2", "training.lr"]
    assert (lr.file, lr.line, lr.column) == (str(tmp_path / "base.yaml"), 7, 7)
    assert str(lr).startswith(f"{tmp_path / 'base.yaml'}:7:7: member sweep--1-2: training.lr:")
    home = tmp_path / "home"
    for cmd in (["fleet", "plan", str(path)], ["fleet", "apply", str(path), "--home", str(home)]):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 2, r.output
        assert "member sweep--1-2: training.lr: Input should be greater than 0" in r.output
        assert "member sweep-0.1-2: training.global_batch_size" in r.output
    assert not (home / "fleets").exists() and not (home / "runs").exists()


def test_inline_template_issues_point_into_the_fleet_file(tmp_path):
    path = _fleet_file(
        tmp_path,
        """\
        name: inline
        matrix: {steps: [3, -2]}
        template: |
          name: x
          model: {family: gpt, layers: 2, hidden: 64, heads: 4, seq_len: 32, vocab: 256}
          training: {global_batch_size: 16, micro_batch_size: 2, steps: {{ steps }}}
          hardware: {procesess_per_node: 2}
        """,
    )
    with pytest.raises(SpecError) as e:
        load_fleet(path)
    where = {(i.member, i.path): (i.line, i.column, i.suggestion) for i in e.value.errors}
    assert where[("inline-1", "training.steps")][:2] == (6, 65)  # where "{{ steps }}" is
    assert where[("inline-0", "hardware.procesess_per_node")] == (7, 14, "processes_per_node")


def test_template_errors_and_set_overrides_are_positioned(tmp_path):
    (tmp_path / "base.yaml").write_text(TEMPLATE.replace("{{ lr }}", "{{ rate }}"))
    path = _fleet_file(
        tmp_path,
        """\
        name: f
        base: base.yaml
        matrix: {lr: [0.1]}
        params: {layers: 2, d: 1}
        """,
    )
    with pytest.raises(
        SpecError, match=r"base.yaml:7:1: member f-0: cannot render: 'rate' is undefined"
    ):
        load_fleet(path)
    path.write_text(path.read_text() + "set: {training.steps: '{{ lr * -10 }}'}\n")
    (tmp_path / "base.yaml").write_text(TEMPLATE)
    with pytest.raises(SpecError) as e:
        load_fleet(path)
    [issue] = e.value.errors
    assert (issue.line, issue.column, issue.path, issue.member) == (5, 23, "training.steps", "f-0")


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        (
            "name: f\nbase: b.yaml\nmatrx: {a: [1]}\n",
            "f.yaml:3:1: matrx: unknown key 'matrx' (did you mean 'matrix'?)",
        ),
        (
            "name: f\nbase: b.yaml\nzip: {a: [1, 2], b: [1]}\n",
            "f.yaml:3:1: zip: zip lists must have one length",
        ),
        (
            "name: f\nbase: b.yaml\ntemplate: x\nruns: [{}]\n",
            "exactly one of `base` and `template`, both",
        ),
        ("name: f\nbase: b.yaml\n", "no members"),
        (
            "name: F!\nbase: b.yaml\nruns: [{}]\n",
            "f.yaml:1:7: name: 'F!' is not a valid fleet name",
        ),
        (
            "name: f\nbase: b.yaml\nruns: [{index: 3}]\n",
            "runs[0].index: 'index' is set by the fleet",
        ),
        ("name: f\ntemplate: x\nmember_name: same\nruns: [{}, {}]\n", "are both named 'same'"),
    ],
)
def test_fleet_file_issues(tmp_path, body, expect):
    path = tmp_path / "f.yaml"
    path.write_text(body.replace("template: x", f"template: {json.dumps(QUICKSTART.read_text())}"))
    with pytest.raises(SpecError) as e:
        load_fleet(path)
    assert expect in str(e.value).replace(str(tmp_path) + "/", "")


def test_fleet_plan_lists_diffs_predictions_and_the_total(tmp_path):
    path = _sweep(tmp_path, runs="runs: [{lr: 0.1, layers: 6, d: 2}]", extra="max_concurrent: 2")
    r = runner.invoke(app, ["fleet", "plan", str(path)], env={"COLUMNS": "220"})
    assert r.exit_code == 0, r.output
    assert "5 member(s)" in r.output and "pool 4 device(s), at most 2 at once" in r.output
    lines = r.output.splitlines()
    at = next(i for i, line in enumerate(lines) if "sweep-0.003-4" in line)
    assert "model.layers: 2 -> 4" in lines[at] and "P=1 D=1" in lines[at]
    assert "training.lr: 0.01 -> 0.003" in lines[at + 1]  # one changed field per line
    assert "model.layers: 2 -> 4" in r.output and "parallelism.data_parallel: 1 -> 2" in r.output
    fp = plan_fleet(load_fleet(path))
    assert [m.devices for m in fp.members] == [1, 1, 1, 1, 2]
    # each member's dollars to finish: its devices at the price for its predicted wall time
    price = fp.members[0].member.spec.hardware.price_per_hour
    for m in fp.members:
        pr = m.plan.prediction
        assert m.cost_usd == pytest.approx(pr.finish_s * m.devices * price / 3600)
        assert pr.finish_s >= 3 * pr.step_time_s  # 3 steps and the last checkpoint
    total = sum(m.plan.prediction.finish_usd for m in fp.members)
    assert fp.total_cost_usd == pytest.approx(total) and total > 0
    assert f"predicted ${total:.3g} to finish 5 member(s)" in r.output
    changes = dict((k, (a, b)) for k, a, b in fp.members[0].changes)
    assert changes == {}  # the first member is the base itself


def test_a_fleet_over_its_budget_is_refused_naming_the_dearest(tmp_path):
    total = plan_fleet(load_fleet(_sweep(tmp_path))).total_cost_usd
    path = _sweep(tmp_path, extra=f"max_total_usd: {total / 2:.8f}")
    r = runner.invoke(app, ["fleet", "plan", str(path)], env={"COLUMNS": "220"})
    assert r.exit_code == 2
    out = " ".join(r.output.split())
    where = "fleet.yaml:9:1: max_total_usd:"
    assert f"{where} the members are predicted to cost ${total:.4g}" in out, out
    assert "(dearest: sweep-0.01-4" in out and "fix: raise max_total_usd" in out
    ok = _sweep(tmp_path, extra=f"max_total_usd: {total * 2:.8f}")
    r = runner.invoke(app, ["fleet", "plan", str(ok)], env={"COLUMNS": "220"})
    assert r.exit_code == 0 and "fleet budget $" in r.output, r.output


def test_a_member_larger_than_the_pool_is_refused(tmp_path):
    path = _sweep(tmp_path, runs="runs: [{lr: 0.1, layers: 6, d: 4}]", extra="pool_devices: 2")
    r = runner.invoke(app, ["fleet", "plan", str(path)])
    assert r.exit_code == 2
    assert "member sweep-0.1-6: hardware: needs 4 devices, the fleet's pool has 2" in r.output


def test_the_example_fleet_plans():
    r = runner.invoke(app, ["fleet", "plan", str(ROOT / "jobs" / "fleet-sweep.yaml")])
    assert r.exit_code == 0, r.output
    assert "7 member(s)" in r.output


# -- the runner ------------------------------------------------------------------


def test_admit_respects_devices_order_and_the_concurrency_bound():
    pending = [("a", 2), ("b", 3), ("c", 1), ("d", 1)]
    assert admit(pending, busy=0, running=0, pool=4, max_concurrent=8) == ["a", "c", "d"]
    assert admit(pending, busy=0, running=0, pool=4, max_concurrent=2) == ["a", "c"]
    assert admit(pending, busy=3, running=1, pool=4, max_concurrent=2) == ["c"]
    assert admit(pending, busy=0, running=2, pool=4, max_concurrent=2) == []


class Sim:
    """Fake member processes that finish after a set number of ticks, and a clock."""

    def __init__(self, ticks: dict[str, int], fail: tuple[str, ...] = ()) -> None:
        self.ticks, self.fail, self.t = ticks, fail, 0.0
        self.live: dict[str, list] = {}
        self.started: list[str] = []

    def spawn(self, argv, log):
        name = Path(argv[argv.index("apply") + 1]).stem
        child = type("C", (), {})()
        child.pid = NO_SUCH_PID + len(self.started)
        left = [self.ticks[name]]
        child.poll = lambda: None if left[0] > 0 else (1 if name in self.fail else 0)
        self.live[name] = left
        self.started.append(name)
        return child

    def clock(self) -> float:
        return self.t

    def wait(self, seconds: float) -> None:
        self.t += 1.0
        for left in self.live.values():
            left[0] -= 1


def _record(tmp_path: Path, members: int = 6, max_concurrent: int = 2, pool: int = 4) -> StateDB:
    """A recorded fleet of quickstart members on one device each, as `fleet apply` makes."""
    layout = "hardware.nodes: 1, parallelism.pipeline_stages: 1, parallelism.data_parallel: 1"
    path = _fleet_file(
        tmp_path,
        f"""\
        name: sim
        base: {QUICKSTART}
        runs: {[{"i": i} for i in range(members)]}
        set: {{{layout}, hardware.processes_per_node: {pool}}}
        """,
    )
    db = StateDB(tmp_path / "home")
    record_fleet(FleetDB(db), plan_fleet(load_fleet(path), max_concurrent), now=0.0)
    return db


def _runner(db: StateDB, sim: Sim, **kw) -> FleetRunner:
    return FleetRunner(
        db, "sim", spawn=sim.spawn, clock=sim.clock, wait=sim.wait, stop=lambda c: None, **kw
    )


def test_runner_admits_at_most_max_concurrent_and_records_every_member(tmp_path):
    db = _record(tmp_path)
    sim = Sim({f"sim-{i}": 2 + i % 3 for i in range(6)}, fail=("sim-4",))
    assert _runner(db, sim).run() == "failed"  # one member failed, the others completed
    rows = FleetDB(db).members("sim")
    assert [r["state"] for r in rows] == ["completed"] * 4 + ["failed", "completed"]
    assert all(r["launches"] == 1 for r in rows)
    spans = [(r["started_at"], r["ended_at"]) for r in rows]
    for t in range(int(max(e for _, e in spans)) + 1):
        assert sum(s <= t < e for s, e in spans) <= 2
    assert max(sum(s <= t < e for s, e in spans) for t in range(10)) == 2
    assert FleetDB(db).get("sim")["state"] == "failed"


def test_resume_skips_completed_members_and_reruns_the_rest(tmp_path):
    db = _record(tmp_path, members=4)
    fleets = FleetDB(db)
    first = Sim({f"sim-{i}": 2 for i in range(4)})
    killed = _runner(db, first)
    killed.start()
    while fleets.members("sim")[1]["state"] != "completed":
        killed.step()
        first.wait(1)
    fleets.update("sim", 0.0, runner_pid=NO_SUCH_PID)  # the runner dies here, members too
    assert [m["state"] for m in fleets.members("sim")] == [
        "completed",
        "completed",
        "running",
        "running",
    ]

    second = Sim({f"sim-{i}": 2 for i in range(4)})
    assert _runner(db, second).run() == "completed"
    assert second.started == ["sim-2", "sim-3"]
    assert [m["launches"] for m in fleets.members("sim")] == [1, 1, 2, 2]
    skips = [e["message"] for e in JobEvents(db, "fleet").list("sim", "skip")]
    assert [s.split(":")[0] for s in skips] == ["sim-0", "sim-1"]


def test_resume_adopts_a_member_that_outlived_its_runner(tmp_path):
    db = _record(tmp_path, members=2, max_concurrent=1)
    fleets = FleetDB(db)
    me, token = os.getpid(), process_token(os.getpid())  # a live process stands in
    fleets.update_member("sim", "sim-0", state="running", pid=me, pid_token=token, launches=1)
    sim = Sim({"sim-0": 1, "sim-1": 1})
    r = _runner(db, sim)
    r.start()
    r.step()
    assert sim.started == [] and r.children["sim-0"].pid == me  # adopted; bound: 1 at once
    r.children["sim-0"].token = "another-process"  # the member's process is gone
    while r.step():
        sim.wait(1)
    assert sim.started == ["sim-1"]
    assert [m["launches"] for m in fleets.members("sim")] == [1, 1]


def test_stop_and_a_second_runner(tmp_path):
    db = _record(tmp_path, members=3, max_concurrent=3)
    sim = Sim({f"sim-{i}": 100 for i in range(3)})
    r = _runner(db, sim)
    r.start()
    r.step()
    with pytest.raises(FleetBusy):
        _runner(db, Sim({})).start()  # this process' runner is alive
    out = runner.invoke(
        app, ["fleet", "stop", "sim", "--home", str(db.home)], env={"COLUMNS": "200"}
    )
    assert out.exit_code == 0, out.output
    assert not r.step()
    r.fleets.release_runner("sim", r.owner, "stopped", 0.0)
    assert [m["state"] for m in FleetDB(db).members("sim")] == ["stopped"] * 3
    status = runner.invoke(
        app, ["fleet", "status", "sim", "--home", str(db.home)], env={"COLUMNS": "200"}
    )
    assert "stopped" in status.output and "sim-2" in status.output
