"""A spec path that is not a regular file is refused before it is read (#46 item 6).

Before, ``jobctl validate FIFO`` blocked for good in ``open`` waiting for a writer; a
character device such as ``/dev/zero`` would never end. Now the file is opened without
blocking and its own type checked: anything but a regular file is a located error
naming the path, exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from jobctl.engine.cli.common import check_data
from jobctl.engine.fleet.loader import load_fleet
from jobctl.spec import SpecError, load_spec
from jobctl.spec.files import NotARegularFile, read_regular

from ..spec_texts import MINIMAL

ROOT = Path(__file__).resolve().parents[2]


def _within(seconds: float, fn):
    """``fn()``'s result or exception, failing the test if it has not returned in time."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 -- handed back to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds} s"
    return box.get("error", box.get("value"))


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "job.yaml"
    os.mkfifo(path)
    return path


def test_validate_refuses_a_fifo_at_once(fifo):
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    cmd = [sys.executable, "-m", "jobctl.engine.cli.app", "validate", str(fifo)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert str(fifo) in done.stderr and "FIFO" in done.stderr and "regular file" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_the_loaders_refuse_what_is_not_a_regular_file(fifo, tmp_path, kind):
    path = {"fifo": fifo, "device": Path("/dev/zero"), "folder": tmp_path}[kind]
    for load in (load_spec, load_fleet):
        error = _within(10, lambda load=load: load(path))
        assert isinstance(error, SpecError), error
        (issue,) = error.errors
        assert "not a regular file" in issue.message and str(path) in issue.message
        assert issue.fix and "regular file" in issue.fix


def test_a_fifo_as_the_hf_config_path_is_a_violation(fifo, tmp_path):
    spec = tmp_path / "hf.yaml"
    spec.write_text(
        MINIMAL.replace(
            "model: {}",
            f"model:\n  huggingface:\n    class: GPT2LMHeadModel\n    config_path: {fifo}",
        )
    )
    error = _within(60, lambda: check_data(load_spec(spec), spec))
    assert isinstance(error, SpecError), error
    assert any("config_path" in str(i) and "FIFO" in str(i) for i in error.errors), error


def test_a_regular_file_reads_as_before(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_bytes(b"a: 1\n")
    assert read_regular(path) == b"a: 1\n"
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing")
    with pytest.raises(NotARegularFile):
        read_regular(tmp_path)


@pytest.mark.parametrize("source", ["tokens", "text"])
def test_a_fifo_as_the_data_path_is_a_violation_at_once(fifo, tmp_path, source):
    """#46 item 6: a FIFO as ``data.path`` (source tokens) blocked `validate` in the
    token file's open; now a located violation says what it is, for text too."""
    data = tmp_path / "train.fifo"
    os.mkfifo(data)
    spec = tmp_path / "data.yaml"
    spec.write_text(
        (ROOT / "jobs" / "quickstart.yaml")
        .read_text()
        .replace("  source: synthetic", f"  source: {source}\n  path: {data}")
    )
    loaded = load_spec(spec)
    assert loaded.data.source == source
    error = _within(60, lambda: check_data(loaded, spec))
    assert isinstance(error, SpecError), error
    (issue,) = [i for i in error.errors if i.path == "data.path"]
    assert "a FIFO (named pipe), not a regular file" in issue.message and issue.line


def test_a_planted_calibration_is_skipped_not_a_hang(tmp_path):
    """#46 item 6: a FIFO or a damaged record in the calibration cache hung `plan` or
    raised a traceback (``[]``: AttributeError); each is a CalibrationError, which
    the cache's reader treats as no calibration."""
    from jobctl.engine.calibration.cache import CalibrationError, load
    from jobctl.engine.calibration.record import CALIBRATION_VERSION

    planted = tmp_path / "cal.json"
    os.mkfifo(planted)
    (tmp_path / "list.json").write_text("[]")
    (tmp_path / "old.json").write_text('{"version": 999}')
    (tmp_path / "shape.json").write_text(f'{{"version": {CALIBRATION_VERSION}, "names": 3}}')
    for path in (planted, *(tmp_path / f"{n}.json" for n in ("list", "old", "shape"))):
        error = _within(10, lambda path=path: load(path))
        assert isinstance(error, CalibrationError), error
        assert str(path) in str(error) and "\n" not in str(error)
