"""The CI rule of tests/conftest.py: under ``CI=true`` a test that skips because a tool
.ci/run installs is missing fails instead, so a failed install cannot empty coverage."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ci_failure, declared_distributions

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


@pytest.mark.parametrize(
    "reason",
    [
        "could not import 'transformers': No module named 'transformers'",
        "could not import 'jsonschema': No module named 'jsonschema'",
        "No module named 'safetensors.torch'",
        "could not import 'yaml': No module named 'yaml'",
    ],
)
def test_a_skip_for_a_declared_package_fails_only_in_ci(reason, monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert "which jobctl declares" in ci_failure(reason)
    monkeypatch.delenv("CI")
    assert ci_failure(reason) is None


def test_a_skip_for_an_undeclared_package_stays_a_skip(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert ci_failure("could not import 'wandb': No module named 'wandb'") is None


def test_no_test_skips_for_a_declared_package():
    """Declared dependencies are imported, not skipped: a broken install must fail."""
    found, call = [], "pytest." + "importorskip("  # split: this line is no call
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if call in line:
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


def readme_setup_commands() -> list[str]:
    """The README's two set-up commands: its first two bash blocks, one line each."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    commands = [b.strip() for b in blocks[:2]]
    assert len(commands) == 2 and all("\n" not in c for c in commands), commands
    return commands


def test_ci_runs_the_readme_commands_verbatim_in_a_fresh_venv():
    install, test = readme_setup_commands()
    assert install.endswith("&& jobctl apply jobs/quickstart.yaml")
    assert test.endswith("&& python -m pytest -q -rs")
    lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    code = [line for line in lines if line and not line.startswith("#")]
    assert install in code and test in code
    venv = next(i for i, line in enumerate(code) if "-m venv" in line)
    activate = next(i for i, line in enumerate(code) if "/bin/activate" in line)
    assert venv < activate < code.index(install) < code.index(test)
    assert {"ruff check .", "ruff format --check ."} <= set(code[: code.index(test)])


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]).lower()


def test_the_lock_pins_every_declared_dependency_and_the_readme_uses_it():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version and " " not in version, f"constraints.txt: not a pin: {line!r}"
            pins[_name(name)] = version
    # jobctl's installed metadata: its dependencies and every extra's
    assert sorted(declared_distributions() - {"jobctl"} - set(pins)) == []
    for command in readme_setup_commands():
        assert f"pip install torch=={pins['torch']} " in command
        assert "pip install -c constraints.txt -e " in command


def test_the_suite_never_uses_the_checkouts_state_home():
    """README command 1 leaves a run in ./.jobctl before command 2 runs the suite."""
    from jobctl.engine.core.home import default_home

    home = default_home().resolve()
    assert home != (ROOT / ".jobctl").resolve() and "jobctl-tests-home-" in home.name
    assert "JOBCTL_DB_URL" not in os.environ


def test_not_slow_is_the_unit_tier_and_slow_is_every_integration_test():
    """The developer loop ``-m "not slow"`` keeps every unit test and no integration
    test; ``-m slow`` the reverse (conftest marks tests/integration)."""

    def collected(marks: str) -> set[str]:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
            + ["-m", marks, "tests/unit/test_templates.py", "tests/integration/test_parity.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}

    assert collected("not slow") == {"tests/unit/test_templates.py"}
    assert collected("slow") == {"tests/integration/test_parity.py"}
