"""Commands that must refuse a broken environment or input in one line with a fix, exit 2,
before any long work (#46, the hostile-input probe's review): `calibrate` with a home
that is a file measured for 50 s and then died in the cache's mkdir; `fleet apply` on a
damaged state DB printed 48 lines of fleet plan before the DB's one line; `data prepare`
of a FIFO hung in its open.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobctl.engine.calibration.cache import CalibrationError, save
from jobctl.engine.calibration.record import Calibration
from jobctl.engine.cli.app import app
from jobctl.engine.core.env import DB_URL, STATE_HOME

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "jobs" / "quickstart.yaml"
FLEET = ROOT / "jobs" / "fleet-sweep.yaml"


def test_calibrate_refuses_a_home_that_is_a_file_before_measuring(tmp_path, monkeypatch):
    import jobctl.engine.calibration.measure.runner as runner

    def measured(*args, **kwargs):
        raise AssertionError("calibrate measured with a home it cannot cache into")

    monkeypatch.setattr(runner, "calibrate", measured)  # a regression fails, never waits
    home = tmp_path / "home"
    home.write_text("not a folder\n")
    r = CliRunner().invoke(app, ["calibrate", str(QUICKSTART)], env={STATE_HOME: str(home)})
    assert r.exit_code == 2, (r.output, r.exception)
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: state home {home}: it is a file, not a folder; ")
    assert f"point {STATE_HOME} (or --home) at a folder" in r.stderr
    assert home.read_text() == "not a folder\n"


@pytest.mark.parametrize("layout", ["home is a file", "calibration/ is a file"])
def test_a_calibration_cache_that_cannot_be_written_is_one_line(tmp_path, layout):
    """What `calibrate` says if the write still fails after its check (a home made a
    file meanwhile): CalibrationError naming the folder, not NotADirectoryError."""
    from jobctl.engine.calibration.cache import analytic_for
    from jobctl.spec import load_spec

    home = tmp_path / "home"
    if layout == "home is a file":
        home.write_text("")
    else:
        home.mkdir()
        (home / "calibration").write_text("")
    cal: Calibration = analytic_for(load_spec(QUICKSTART))
    with pytest.raises(CalibrationError) as e:
        save(cal, home)
    said = str(e.value)
    assert said.startswith(f"calibration cache {home / 'calibration'}: cannot write it (")
    assert "\n" not in said and f"point {STATE_HOME} (or --home)" in said


def test_fleet_apply_on_a_damaged_db_is_the_db_line_alone(tmp_path):
    """As `apply` does (#46 item 9): the DB is opened before the fleet is planned."""
    home = tmp_path / "home"
    home.mkdir()
    damaged = b"not a database at all " * 100
    (home / "state.db").write_bytes(damaged)
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent), STATE_HOME: str(home)}
    env.pop(DB_URL, None)
    cmd = [sys.executable, "-m", "jobctl.engine.cli.app", "fleet", "apply", str(FLEET)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "", done.stdout  # no fleet plan
    assert done.stderr.startswith(f"error: state DB sqlite:///{home / 'state.db'}: ")
    assert done.stderr.count("\n") == 1 and "is damaged or not jobctl's" in done.stderr
    assert (home / "state.db").read_bytes() == damaged
    assert sorted(p.name for p in home.iterdir()) == ["state.db"]


@pytest.mark.timeout(30)  # the old code blocked for good in the FIFO's open
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_data_prepare_refuses_a_source_that_is_no_file_or_folder(tmp_path, kind):
    if kind == "fifo":
        source = tmp_path / "fifo.txt"
        os.mkfifo(source)
        what = "a FIFO (named pipe)"
    else:
        source, what = Path("/dev/null"), "a character device"
    out = tmp_path / "x" / "tok.bin"
    argv = ["data", "prepare", str(source), "--vocab-size", "300", "--out", str(out)]
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2, (r.output, r.exception)
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: SOURCE {source} is {what}, not a corpus file or folder;")
    assert "give a corpus file (.txt, .jsonl, .parquet, .arrow) or a dataset folder" in r.stderr
    assert not out.parent.exists()  # nothing trained, nothing written


GATE = """
import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, h):
        if h.sum() > 0:  # a branch on a tensor's value: torch.export cannot trace it
            return self.lin(h)
        return h


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.gate, self.head = nn.Embedding(64, 16), Gate(), nn.Linear(16, 64)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.gate(self.emb(input_ids)))
        if labels is None:
            return logits
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def make():
    return Net()
"""


@pytest.mark.parametrize("command", ["plan", "calibrate"])
def test_a_model_torch_export_cannot_trace_is_one_error_with_its_fix(
    tmp_path, monkeypatch, command
):
    """validate does not trace, so `plan` was the first to meet a model with a branch on
    a tensor's value: a TraceError traceback, exit 1 (and `calibrate` after its bar)."""
    import yaml

    (tmp_path / "gated_net.py").write_text(GATE)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = yaml.safe_load(QUICKSTART.read_text())
    spec["model"] = {"import": "gated_net:make", "seq_len": 32, "vocab": 64}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(spec))
    env = {STATE_HOME: str(tmp_path / "home"), "COLUMNS": "200"}
    r = CliRunner().invoke(app, [command, str(job)], env=env)
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (r.output, r.exception)
    said = r.stderr.splitlines()
    assert said[0].startswith(f"error: {job}: cannot {command}: torch.export could not trace")
    assert said[-1].startswith("  fix: make that code independent of tensor values")
    assert "Traceback" not in r.output
