"""`jobctl report`: a self-contained HTML page with throughput, events, loss and timeline."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from jobctl.engine.report import collect, render_html
from jobctl.engine.state import StateDB

from .jobrun import ROOT, events, run_job, tiny_spec

VOID = {"meta", "img", "br", "hr", "link", "input", "rect", "line", "polyline", "path", "col"}


class _Checker(HTMLParser):
    """Tag balance (every non-void element closed, in order) and every URL attribute."""

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.urls += [v for k, v in attrs if k in ("src", "href", "xlink:href") and v]
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.urls += [v for k, v in attrs if k in ("src", "href", "xlink:href") and v]

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
            }  # fmt: skip
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


@pytest.mark.multiproc
def test_report_of_a_real_run(tmp_path):
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
        [sys.executable, "-m", "jobctl.engine.cli", "report", run.id],
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
    assert text.count('data-kind="checkpoint"') == 2 * ckpts
    assert text.count('data-kind="upload"') == 2 * ups
    assert 'src="data:image/png;base64,' in text and "simulated" in text
    row = StateDB(home).get_run(run.id)
    assert row["plan"].split()[0] in text

    out = tmp_path / "elsewhere.html"
    r = subprocess.run(
        [sys.executable, "-m", "jobctl.engine.cli", "report", run.id, "-o", str(out)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"wrote {out}" in r.stdout
    assert _points(check_html(out.read_text()) and out.read_text(), "loss") == steps

    bad = subprocess.run(
        [sys.executable, "-m", "jobctl.engine.cli", "report", "nope"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "no run 'nope'" in bad.stderr
