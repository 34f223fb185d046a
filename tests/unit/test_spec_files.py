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
