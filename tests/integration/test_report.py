"""`jobctl report`: a self-contained HTML page with throughput, events, loss and timeline."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.state.db import StateDB
from jobctl.engine.views.report import collect, render_html, write_report
from jobctl.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "jobs" / "quickstart.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

VOID = {"meta", "img", "br", "hr", "link", "input", "rect", "line", "polyline", "path", "col"}


class _Checker(HTMLParser):
    """Tag balance (every non-void element closed, in order) and every URL attribute;
    ``<a href>`` links apart (following one is the reader's choice, not a fetch)."""

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.urls: list[str] = []
        self.links: list[str] = []

    def _attrs(self, tag, attrs):
        urls = [v for k, v in attrs if k in ("src", "href", "xlink:href") and v]
        if tag == "a":
            self.links += urls
        else:
            self.urls += urls

    def handle_starttag(self, tag, attrs):
        self._attrs(tag, attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self._attrs(tag, attrs)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:]}")
        else:
            self.stack.pop()


def check_html(text: str) -> _Checker:
    assert text.startswith("<!DOCTYPE html>")
    c = _Checker()
    c.feed(text)
    c.close()
    assert c.errors == [] and c.stack == [], (c.errors, c.stack)
    # Self-contained: nothing is fetched (images are data: URLs), no scripts at all.
    assert all(u.startswith(("data:", "#")) for u in c.urls), c.urls
    # Links only to the PNG files written beside the page.
    assert all(re.fullmatch(r"[\w.-]+\.png", u) for u in c.links), c.links
    assert "<script" not in text and "<link" not in text
    assert not re.search(r"url\(\s*['\"]?https?:", text)
    return c


def _points(text: str, css: str) -> int:
    m = re.search(
        rf'<polyline class="series {css}"[^>]*data-points="(\d+)"[^>]*points="([^"]*)"', text
    )
    assert m, css
    assert len(m.group(2).split()) == int(m.group(1))
    return int(m.group(1))


def test_series_devices_and_markers_from_an_archive(tmp_path):
    """Two attempts (4 then 2 devices) trained steps 1-3 and 3-4; markers from both sources."""
    run_dir = tmp_path
    lines = []
    for step, ts, ranks in [
        (1, 100.0, 4),
        (2, 101.0, 4),
        (3, 102.0, 4),
        (3, 130.0, 2),
        (4, 131, 2),
    ]:
        for r in range(ranks):
            lines.append({"kind": "heartbeat", "ts": ts, "step": step, "rank": r})
        lines.append(
            {
                "kind": "step",
                "ts": ts,
                "step": step,
                "loss": 5.0 - step,
                "step_time_s": 0.5,
                "samples_per_s": 32.0,
            }
        )
        if step == 2:
            lines.append({"kind": "checkpoint", "ts": ts + 0.1, "step": 2, "path": "x"})
            lines.append({"kind": "uploaded", "ts": ts + 0.5, "step": 2})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    db_events = [
        {"ts": 110.0, "kind": "preemption", "message": "lost node(s) [1]; 2 device(s) left"},
        {"ts": 125.0, "kind": "resume", "message": "from step 2 (local) as P=1 D=2"},
        {"ts": 131.0, "kind": "recovery", "message": "training again 21 s after"},
        {"ts": 99.0, "kind": "phase", "message": "training"},
    ]
    s = collect(run_dir, db_events, devices_now=2)
    assert [p["step"] for p in s.steps] == [1, 2, 3, 3, 4]
    assert [p["dev"] for p in s.steps] == [4, 4, 4, 2, 2]
    kinds = sorted(m.kind for m in s.markers)
    assert kinds == ["checkpoint", "morph", "preemption", "recovery", "upload"]
    assert min(m.x for m in s.markers) == pytest.approx(1.1)  # seconds after the first step
    row = {"id": "r<&>", "phase": "completed", "step": 4, "total_steps": 4, "loss": 1.0,
           "plan": "P=1 D=2", "devices": 2}  # fmt: skip
    text = render_html(row, s, db_events, None)
    check_html(text)
    assert "r&lt;&amp;&gt;" in text and "r<&>" not in text
    assert _points(text, "throughput") == 5 and _points(text, "loss") == 5
    per_dev = re.search(r'class="series per-device"[^>]*points="([^"]*)"', text).group(1)
    ys = [float(p.split(",")[1]) for p in per_dev.split()]
    assert ys[0] == ys[1] == ys[2] and ys[3] < ys[0]  # 8 samples/s/device, then 16: higher
    assert text.count('data-kind="checkpoint"') == 2  # on both throughput charts


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG, after checking its signature and header chunk."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def check_pngs(text: str, html: Path) -> dict[str, Path]:
    """The page lists and links every PNG beside it; each is a real, non-empty PNG."""
    names = {
        k: html.with_name(f"{html.stem}-{k}.png")
        for k in ("throughput", "throughput-per-device", "loss", "timeline")
    }
    for p in names.values():
        assert p.exists() and p.stat().st_size > 1000, p
        w, h = png_size(p)
        assert w > 100 and h > 100
        assert f'<a href="{p.name}">{p.name}</a>' in text
    return names


def _run_with_plan(tmp_path, plan_overrides: dict | None):
    """A run folder (quickstart spec: P=2 x D=2) with an archive of 6 steps and, unless
    ``plan_overrides`` is None, a plan.json planned from the spec with those overrides."""
    db = StateDB(tmp_path / "home", clock=lambda: 1000.0)
    run_dir = db.runs_dir / "quick-1"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(QUICKSTART.read_text())
    if plan_overrides is not None:
        plan = make_plan(load_spec(QUICKSTART, plan_overrides), 4)
        (run_dir / "plan.json").write_text(plan.model_dump_json(indent=2))
    recs = [
        {
            "kind": "step",
            "ts": 1000.0 + s,
            "step": s,
            "loss": 6.0 - 0.5 * s,
            "step_time_s": 1.0,
            "samples_per_s": 16.0,
        }
        for s in range(1, 7)
    ]
    recs.append({"kind": "checkpoint", "ts": 1003.5, "step": 3, "path": "x"})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    db.create_run("quick-1", "quickstart", run_dir, total_steps=6, devices=4, plan="P=1 D=4")
    return db, db.get_run("quick-1")


def test_report_writes_pngs_and_draws_the_runs_own_plan(tmp_path):
    # Re-planning the spec gives P=2 x D=2; the run's plan.json says P=1 x D=4.
    db, row = _run_with_plan(
        tmp_path, {"parallelism.pipeline_stages": 1, "parallelism.data_parallel": 4}
    )
    out = tmp_path / "out" / "r.html"
    out.parent.mkdir()
    path = write_report(db, row, out, tmp_path / "home")
    text = path.read_text()
    check_html(text)
    pngs = check_pngs(text, path)
    assert "P=1 D=4 m=2 N_m=2 1f1b, simulated" in text and "P=2 D=2" not in text
    assert f"plan: the run&#x27;s plan ({row['run_dir']}/plan.json)" in text
    assert "re-planned" not in text
    one_stage = png_size(pngs["timeline"])[1]

    # Without plan.json the page re-plans (P=2 x D=2) and says so.
    (Path(row["run_dir"]) / "plan.json").unlink()
    text = write_report(db, row, out, tmp_path / "home").read_text()
    check_html(text)
    check_pngs(text, path)
    assert "P=2 D=2 m=2 N_m=4 1f1b, simulated" in text
    assert "plan: re-planned for 4 device(s): the run has no plan.json" in text
    assert png_size(pngs["timeline"])[1] > one_stage  # a Gantt row per stage: taller


def test_report_png_charts_carry_the_archive(tmp_path):
    """The throughput PNG differs with the event markers: they are drawn, not only SVG."""
    from jobctl.engine.views.png import draw_png
    from jobctl.engine.views.svg import Chart, Marker, Series

    plain = Chart("Throughput", "t", "samples/s", [Series("s", [0, 1, 2], [1, 2, 3])])
    marked = Chart(**{**plain.__dict__, "markers": [Marker(1.0, "checkpoint", "ckpt 1")]})
    a, b = draw_png(plain, tmp_path / "a.png"), draw_png(marked, tmp_path / "b.png")
    assert png_size(a) == png_size(b) == (960, 280)
    assert a.read_bytes() != b.read_bytes()


@pytest.mark.multiproc
def test_report_of_a_real_run(tmp_path):
    from ..jobrun import events, run_job, tiny_spec

    steps = 12
    spec = tiny_spec(
        **{
            "training.steps": steps,
            "checkpoint.interval": 4,
            "checkpoint.remote": f"file://{tmp_path / 'remote'}",
        }
    )
    home = tmp_path / "home"
    run, outcome = run_job(spec, home)
    assert outcome.ok, outcome.message
    env = {**os.environ, "JOBCTL_HOME": str(home), "COLUMNS": "200"}
    r = subprocess.run(
        [sys.executable, "-m", "jobctl.engine.cli.app", "report", run.id],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    path = run.dir / "report.html"
    assert f"wrote {path}" in r.stdout
    text = path.read_text()
    check_html(text)
    assert _points(text, "throughput") == steps and _points(text, "loss") == steps
    recs = events(run.dir)
    ckpts = sum(e["kind"] == "checkpoint" for e in recs)
    ups = sum(e["kind"] == "uploaded" for e in recs)
    assert ckpts >= 3 and ups >= 1
    # Upload progress: bytes of each (step, part) as they go, the last one complete.
    progress = [e for e in recs if e["kind"] == "upload"]
    for e in progress:
        assert e["part"] == "all" and 0 <= e["rank"] < 4
        assert 0 <= e["bytes_done"] <= e["bytes_total"] and e["bytes_total"] > 0
    for up in (e for e in recs if e["kind"] == "uploaded"):
        last = [e for e in progress if e["step"] == up["step"]][-1]
        assert last["bytes_done"] == last["bytes_total"], last
    assert text.count('data-kind="checkpoint"') == 2 * ckpts
    assert text.count('data-kind="upload"') == 2 * ups
    assert 'src="data:image/png;base64,' in text and "simulated" in text
    row = StateDB(home).get_run(run.id)
    assert row["plan"].split()[0] in text
    check_pngs(text, path)
    assert "plan: the run&#x27;s plan" in text

    out = tmp_path / "elsewhere.html"
    r = subprocess.run(
        [sys.executable, "-m", "jobctl.engine.cli.app", "report", run.id, "-o", str(out)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"wrote {out}" in r.stdout
    assert _points(check_html(out.read_text()) and out.read_text(), "loss") == steps
    check_pngs(out.read_text(), out)  # elsewhere-*.png beside it

    bad = subprocess.run(
        [sys.executable, "-m", "jobctl.engine.cli.app", "report", "nope"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "no run 'nope'" in bad.stderr
