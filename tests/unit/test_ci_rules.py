"""The CI rule of tests/conftest.py: under ``CI=true`` a test that skips because a tool
.ci/run installs is missing fails instead, so a failed install cannot empty coverage."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ci_failure

ROOT = Path(__file__).resolve().parents[2]
SHELLCHECK_TEST = "tests/unit/test_templates.py::test_scripts_pass_bash_n_and_shellcheck"


@pytest.mark.parametrize(
    "reason",
    [
        "shellcheck not installed (apt-get install shellcheck)",
        "kubectl not installed (it is the client under test)",
        "no Slurm cluster here: no slurmctld after 60 s: ...",
        "no sshd here: no ssh login after 20 s: ...",
    ],
)
def test_missing_project_tools_fail_only_in_ci(reason, monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert reason in ci_failure(reason)
    monkeypatch.delenv("CI")
    assert ci_failure(reason) is None


def test_other_skips_stay_skips_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert ci_failure("this machine's host name 'localhost' is a loopback name") is None


def _run_without_tools(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess:
    """The shellcheck test in a fresh pytest whose PATH holds only bash."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "bash").exists():
        (bin_dir / "bash").symlink_to(shutil.which("bash"))
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(PATH=str(bin_dir), **({"CI": "true"} if ci else {}))
    argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", SHELLCHECK_TEST]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_a_missing_shellcheck_fails_under_ci_and_skips_outside(tmp_path):
    outside = _run_without_tools(tmp_path, ci=False)
    assert outside.returncode == 0 and "1 skipped" in outside.stdout, outside.stdout
    assert "SKIPPED" in outside.stdout and "shellcheck not installed" in outside.stdout  # -rs
    inside = _run_without_tools(tmp_path, ci=True)
    assert inside.returncode == 1, inside.stdout
    assert "CI=true: skipped for a tool .ci/run installs" in inside.stdout
