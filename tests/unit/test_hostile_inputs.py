"""Hostile command-line input (#24 items 16, 18, 19): a run id that leaves the state
home, rich markup in user strings, a damaged or locked state DB.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.core.home import require_run_id

from ..jobrun import QUICKSTART

runner = CliRunner()


@pytest.mark.parametrize("run_id", ["../../x", "a/b", ".hidden", "", "x\ny", "A" * 200])
def test_a_run_id_that_leaves_the_state_home_is_refused(tmp_path, monkeypatch, run_id):
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    result = runner.invoke(app, ["apply", str(QUICKSTART), "--home", str(home), "--run-id", run_id])
    assert result.exit_code == 2 and "is not a run id" in result.output
    assert not (tmp_path / "x").exists() and not home.exists()
    with pytest.raises(ValueError, match="is not a run id"):
        require_run_id(run_id)


def test_run_ids_jobctl_makes_pass():
    assert require_run_id("quickstart-20261125-231500-0a1b") == "quickstart-20261125-231500-0a1b"
