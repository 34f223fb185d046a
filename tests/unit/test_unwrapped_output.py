"""What a user copies is exactly what runs: paths, commands and scripts that jobctl
prints are never cut into lines by Rich, at 80 columns or in a pipe (the console
script run as a user runs it, its output piped, from a folder with a long path)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RULE = re.compile(r"^─+ (\S+) ─+$")


def _jobctl(cwd: Path, *args: str) -> str:
    """``jobctl ARGS`` from ``cwd``, stdout piped, a new user's 80-column terminal."""
    exe = shutil.which("jobctl") or str(Path(sys.executable).with_name("jobctl"))
    env = {k: v for k, v in os.environ.items() if k not in ("JOBCTL_HOME", "JOBCTL_DB_URL")}
    env["COLUMNS"] = "80"
    run = subprocess.run(
        [exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def _long_folder(tmp_path: Path) -> Path:
    """A folder whose path alone is longer than a terminal line, holding jobs/."""
    deep = tmp_path / ("a-folder-with-a-rather-long-name-" * 3) / "and-another-one-below-it"
    shutil.copytree(ROOT / "jobs", deep / "jobs")
    assert len(str(deep)) > 100
    return deep


def test_render_prints_whole_paths(tmp_path):
    deep = _long_folder(tmp_path)
    out = _jobctl(deep, "render", "jobs/quickstart.yaml", "--out", str(deep / "out"))
    wrote = [line.removeprefix("wrote ") for line in out.splitlines() if line.startswith("wrote ")]
    assert len(wrote) >= 3, out
    for line in wrote:
        path = Path(line.split(": `bash ", 1)[0])
        assert path.is_file(), f"printed {line!r}: no such file (cut by a wrap?)"
    start = deep / "out" / "start.sh"
    assert f"wrote {start}: `bash {start}` starts the run without jobctl" in out.splitlines()


def test_a_piped_dry_run_prints_scripts_that_are_valid_shell(tmp_path):
    deep = _long_folder(tmp_path)
    out = _jobctl(deep, "apply", "jobs/quickstart.yaml", "--dry-run", "--home", str(tmp_path))
    sections: dict[str, list[str]] = {}
    name = None
    for line in out.splitlines():
        rule = RULE.match(line)
        if rule:
            name = rule.group(1)
            sections[name] = []
        elif name is not None:
            sections[name].append(line)
    scripts = {n: "\n".join(lines) + "\n" for n, lines in sections.items() if n.endswith(".sh")}
    assert set(scripts) == {"node-0.sh", "node-1.sh"}, list(sections)
    for n, text in scripts.items():
        assert max(len(line) for line in text.splitlines()) > 80  # long lines stay whole
        check = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
        assert check.returncode == 0, f"{n} as printed is not valid shell: {check.stderr}"
