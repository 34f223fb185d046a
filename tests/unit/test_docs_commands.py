"""Every command in the documentation runs as written (#48): each line of every ```bash
block of README.md and docs/*.md runs, in order per page, from a folder holding a copy
of jobs/ (its own state home ./.jobctl), at 80 columns, and exits 0 with no traceback.

Not run here, and nothing else:
* the README's two set-up commands (its first two blocks): `.ci/run` runs them
  verbatim (tests/unit/test_ci_rules.py);
* a line identical to one of the README's CLI tour: the tour test runs those
  (tests/integration/test_readme_tour.py);
* a line ending in ``# needs: gpu`` or ``# needs: cluster`` (Slurm, Kubernetes, ssh
  hosts), the only markers there are.

docs/spec.md is generated (tests/unit/test_spec_reference.py) and has no commands.
To stay a unit test, the docs keep to cheap commands (validate, plan, render, apply
--dry-run, schema, schedules); plain `jobctl` lines of those run in this process through
typer's runner (the same app the console script runs), everything else in bash. The
pages' benchmark commands (`python -m benchmarks run NAME`, each reproducing a paper's
table or a measured figure) are written in their smallest real form (a round, a few
steps), each page saying what the full run takes; together they cost this test a few
minutes, so the running itself is an integration test
(tests/integration/test_docs_run.py); this file reads the pages and checks their shape.
Their dated result files go to the temporary folder, not benchmarks/results."""

from __future__ import annotations

import re
from pathlib import Path

from ..jobrun import ROOT

OTHERS = {"spec.md"}  # generated from the spec models (test_spec_reference): no commands
NEEDS = re.compile(r"#\s*needs:\s*(\S+)\s*$")
MARKERS = {"gpu", "cluster"}
# jobctl commands cheap and self-contained enough to run in this process
IN_PROCESS = {"validate", "plan", "render", "schema", "fleet", "schedule", "status"}
SHELL = re.compile(r"[|&;<>`$]")
TOUR = re.compile(r"## CLI tour\s+```bash\n(.*?)```", re.S)


def tour_commands() -> list[str]:
    """The README's CLI tour, comments cut, as tests/integration/test_readme_tour.py
    reads and runs it."""
    block = TOUR.search((ROOT / "README.md").read_text())
    assert block, "README.md has no ## CLI tour bash block"
    return [x.split("#", 1)[0].strip() for x in block.group(1).splitlines() if x.strip()]


def pages() -> list[Path]:
    docs = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in OTHERS)
    return [ROOT / "README.md", *docs]


def blocks(page: Path) -> list[str]:
    """The page's ```bash blocks, in order (the README's set-up commands left out)."""
    found = re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.S | re.M)
    return found[2:] if page.name == "README.md" else found


def lines(page: Path) -> list[str]:
    """Every command line of the page's bash blocks (continuations joined)."""
    out: list[str] = []
    for block in blocks(page):
        pending = ""
        for raw in block.splitlines():
            line = pending + raw.strip()
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            if line and not line.startswith("#"):
                out.append(line)
    return out


def split(page: Path) -> tuple[list[str], list[str]]:
    """(commands to run, lines skipped for a `# needs:` marker)."""
    tour = set(tour_commands())
    run, needs = [], []
    for line in lines(page):
        marker = NEEDS.search(line)
        if marker:
            assert marker.group(1) in MARKERS, f"{page.name}: unknown marker: {line}"
            needs.append(line)
        elif line.split("#", 1)[0].strip() not in tour:
            run.append(line)
    return run, needs


def test_every_page_is_read_and_the_markers_are_the_only_skips():
    names = [p.name for p in pages()]
    assert "README.md" in names and "concepts.md" in names and "troubleshooting.md" in names
    for page in pages():
        commands, needs = split(page)
        skipped = set(lines(page)) - set(commands) - set(needs)
        tour = set(tour_commands())
        assert {x.split("#", 1)[0].strip() for x in skipped} <= tour, page.name
        for line in needs:  # a marked line is a real command, not prose
            assert line.split()[0] in ("jobctl", "bash", "python", "kubectl", "pip"), line
    readme = blocks(ROOT / "README.md")
    tour_block = TOUR.search((ROOT / "README.md").read_text())
    assert tour_block and tour_block.group(1) in readme  # the tour is a README block


def test_code_blocks_fit_80_columns():
    """Commands and shown output fit a new user's terminal (the set-up commands are
    exempt: they must stay verbatim)."""
    wide = []
    for page in pages():
        text = page.read_text()
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M):
            for line in block.splitlines():
                if len(line) > 80 and not line.startswith("pip install torch"):
                    wide.append(f"{page.name}: {line}")
    assert wide == []


def test_the_readme_shows_the_quickstart_spec_as_it_is():
    text = (ROOT / "README.md").read_text()
    shown = re.search(r"^```yaml\n(.*?)^```", text, re.S | re.M)
    assert shown and shown.group(1) == (ROOT / "jobs" / "quickstart.yaml").read_text()


def test_docs_link_no_file_a_clone_lacks():
    """Relative links resolve inside the repository (no ../shared); spec.md and
    benchmarks.md may still be on their way."""
    missing = []
    for page in pages():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            path = (page.parent / target).resolve()
            assert ROOT in path.parents or path == ROOT, f"{page.name}: {target}"
            if not path.exists() and path.name not in OTHERS:
                missing.append(f"{page.name}: {target}")
    assert missing == []
