"""The benchmarks' index (issue #48): ``python -m benchmarks list`` names every benchmark
with its question and baseline, the one-off investigations are gone, ``run`` refuses an
unknown name in one line, keeps every run's output as a dated file, and no test imports
benchmark code.

Everything here runs the runner as a subprocess or reads files: the tests import
nothing from ``benchmarks``.
"""

from __future__ import annotations

import ast
import datetime
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
SHARED = {"lib"}
REMOVED = [  # one-off investigations of past changes: docs/benchmarks.md keeps them
    "attempt_end",
    "commit_overhead",
    "step_overhead",
    "backward_split",
    "reform_in_place",
    "loss_scale_overhead",
    "calibration_noise",
    "mobius_auto_cost",
]


def _runner(*args: str, results: Path | None = None) -> subprocess.CompletedProcess:
    """The runner as a subprocess; its result files go to ``results`` (a run writes
    one: never into the tree's benchmarks/results from a test)."""
    cmd = [sys.executable, "-m", "benchmarks", *args]
    env = {k: v for k, v in os.environ.items() if k != "BENCHMARKS_RESULTS"}
    if results is not None:
        env["BENCHMARKS_RESULTS"] = str(results)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _modules() -> set[str]:
    """group/name of every module in the benchmark subpackages but the shared ones."""
    return {
        f"{p.parent.name}/{p.stem}"
        for p in BENCH.glob("*/*.py")
        if p.stem != "__init__"
        and p.parent.name not in SHARED
        and (p.parent / "__init__.py").exists()
    }


def _listed(text: str) -> dict[str, dict[str, str]]:
    """``list``'s blocks: a ``group/name`` line, then ``question`` and ``baseline``
    fields whose wrapped lines continue indented."""
    found: dict[str, dict[str, str]] = {}
    name = field = None
    for line in text.splitlines():
        if re.fullmatch(r"[a-z_]+/[a-z_0-9]+", line):
            name, field = line, None
            found[name] = {}
        elif name and (m := re.match(r"  (question|baseline) (.*)", line)):
            field = m[1]
            found[name][field] = m[2].strip()
        elif name and field and line.startswith("   "):
            found[name][field] += " " + line.strip()
    return found


def test_list_names_every_benchmark_with_its_question_and_baseline():
    done = _runner("list")
    assert done.returncode == 0, done.stderr
    listed = _listed(done.stdout)
    assert set(listed) == _modules()
    for name, said in listed.items():
        assert said.get("question") and said.get("baseline"), name
        assert "(not stated)" not in said.values(), name
    assert max(len(line) for line in done.stdout.splitlines()) <= 80


def test_the_one_off_investigations_are_gone():
    left = [p for name in REMOVED for p in BENCH.rglob(f"{name}.py")]
    assert not left
    assert not (BENCH / "gpu" / "NOTES.md").exists()  # now dated files in results/


def test_no_test_imports_benchmarks():
    importers = []
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            if any(n == "benchmarks" or n.startswith("benchmarks.") for n in names):
                importers.append(str(path.relative_to(ROOT)))
    assert not importers


def test_run_of_an_unknown_name_exits_2_in_one_line():
    done = _runner("run", "simulator_sped")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "simulator_speed" in lines[0]
    assert done.stdout == ""


def test_a_quick_benchmark_runs_through_the_runner(tmp_path):
    """The exact partition against brute force, 20 instances (well under a second)."""
    done = _runner("run", "planner/partition_optimality", "--instances", "20", results=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "max 1.000, min 1.000 over 20 instances" in done.stdout


def test_every_run_keeps_its_output_as_a_dated_file(tmp_path):
    """What a run printed lands in YYYY-MM-DD-NAME.txt under $BENCHMARKS_RESULTS (or
    --results DIR), headed by its command and machine, its exit last; a second run the
    same day gets -2; --help writes nothing."""
    args = ("run", "partition_optimality", "--instances", "3")
    first = _runner(*args, results=tmp_path)
    assert first.returncode == 0, first.stderr
    day = datetime.date.today().isoformat()
    kept = (tmp_path / f"{day}-partition_optimality.txt").read_text().splitlines()
    assert kept[0] == "$ python -m benchmarks run partition_optimality --instances 3"
    assert kept[1].startswith(f"# {day} ") and "cpus" in kept[1]
    assert "\n".join(kept[3:-1]) == first.stdout.rstrip("\n")  # as printed, live
    assert kept[-1] == "# exit 0"
    other = tmp_path / "elsewhere"
    again = _runner("run", "--results", str(other), *args[1:], results=tmp_path)
    assert again.returncode == 0 and (other / f"{day}-partition_optimality.txt").exists()
    _runner(*args, results=tmp_path)
    assert (tmp_path / f"{day}-partition_optimality-2.txt").exists()
    _runner("run", "partition_optimality", "--help", results=tmp_path)
    assert len(list(tmp_path.glob("*.txt"))) == 2
