"""A real run whose workers report only over the network channel."""

from __future__ import annotations

import pytest

from jobctl.engine.channel import server as channel
from jobctl.engine.channel.host import read_host
from jobctl.engine.core.process import pid_alive
from jobctl.engine.state.db import StateDB

from ..jobrun import events, run_job, tiny_spec

STEPS = 8


@pytest.mark.multiproc
def test_run_reports_only_over_the_channel(tmp_path, monkeypatch):
    secrets: list[str] = []
    real = channel.new_secret

    def recording_secret() -> str:  # the real generator; the test only keeps a copy
        secrets.append(real())
        return secrets[-1]

    monkeypatch.setattr(channel, "new_secret", recording_secret)
    # Workers may not fall back to appending to metrics.jsonl: no channel, no start.
    monkeypatch.setenv("JOBCTL_EVENTS", "network")
    monkeypatch.delenv("JOBCTL_CHANNEL", raising=False)
    home = tmp_path / "home"
    spec = tiny_spec(**{"training.steps": STEPS, "checkpoint.interval": 4})
    run, outcome = run_job(spec, home)
    assert outcome.ok, outcome.message
    assert len(secrets) == 1

    recs = events(run.dir)
    steps = [e for e in recs if e["kind"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, STEPS + 1))  # each once, in order
    beats = [e for e in recs if e["kind"] == "heartbeat"]
    assert len(beats) == STEPS * 4  # every rank, every step
    assert {e["kind"] for e in recs} >= {"step", "heartbeat", "checkpoint"}
    # Every archived event came through the channel (the server stamps the sender).
    worker_recs = [e for e in recs if e["kind"] != "node_sigterm"]
    assert all(e.get("src", "").startswith("rank-") for e in worker_recs)
    assert len({e["src"] for e in beats}) == 4

    row = StateDB(home).get_run(run.id)
    assert row["phase"] == "completed" and row["step"] == STEPS
    assert row["loss"] == pytest.approx(steps[-1]["loss"])
    assert row["last_checkpoint"] == STEPS

    host = read_host(run.dir)
    assert host is not None and host.channel_url.startswith("http://127.0.0.1:")
    assert not pid_alive(host.pid)  # the run host ends with the run
    assert "0 request(s) rejected" in (run.dir / "run-host.log").read_text()
    scripts = "".join(p.read_text() for p in (run.dir / "scripts").iterdir())
    assert host.channel_url in scripts

    # The secret is in no file of the state home at all (not even a 0600 one).
    secret = secrets[0].encode()
    assert [p for p in home.rglob("*") if p.is_file() and secret in p.read_bytes()] == []
