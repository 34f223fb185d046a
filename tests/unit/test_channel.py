"""The event channel: authentication, ordering, batching, retries, heartbeat timeout."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from pathlib import Path

import pytest

from jobctl.engine.channel.client import ChannelSink, event_sink
from jobctl.engine.channel.liveness import HeartbeatWatch
from jobctl.engine.channel.server import ChannelServer, bearer, new_secret
from jobctl.engine.core.events import EventLog, read_metrics
from jobctl.engine.supervise.launch import free_port

from ..jobrun import wait_for


def _lines(path: Path) -> list[dict]:
    return read_metrics(path, 0)[0]  # whole lines only: the server may be appending


def _request(server: ChannelServer, method: str, path: str, body: dict | None, headers: dict):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **headers})
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read() or b"{}")
    conn.close()
    return out


# Events as the workers write them: every field the supervisor reads (event_schema).
BEAT = {"rank": 3, "stage": 0, "node": 0, "compute_s": 0.1}
STEP = {"loss": 2.5, "samples_per_s": 8.0}
BATCH = {
    "src": "rank-0",
    "seq": 0,
    "events": [{"kind": "step", "step": 1, "loss": 2.5, "samples_per_s": 8.0}],
}


def test_request_without_secret_is_rejected_and_counted(server, tmp_path, caplog):
    status, body = _request(server, "POST", "/v1/events", BATCH, {})
    assert status == 401 and "secret" in body["error"]
    assert server.rejected == 1
    assert not (tmp_path / "metrics.jsonl").exists()
    assert any("no secret" in r.getMessage() for r in caplog.records)


def test_request_with_wrong_secret_is_rejected(server, tmp_path):
    status, _ = _request(server, "POST", "/v1/events", BATCH, bearer(new_secret()))
    assert status == 401
    status, _ = _request(server, "GET", "/v1/health", None, bearer(server.secret[:-1]))
    assert status == 401
    assert server.rejected == 2
    assert not (tmp_path / "metrics.jsonl").exists()


def test_request_with_right_secret_is_archived_once(server, tmp_path):
    status, body = _request(server, "POST", "/v1/events", BATCH, bearer(server.secret))
    assert (status, body) == (200, {"accepted": 1, "duplicate": False})
    # A retry of the same batch (its answer was lost, say) is acknowledged, not re-archived.
    status, body = _request(server, "POST", "/v1/events", BATCH, bearer(server.secret))
    assert (status, body) == (200, {"accepted": 0, "duplicate": True})
    (line,) = _lines(tmp_path / "metrics.jsonl")
    assert line.pop("ts") > 0  # stamped on arrival: the batch carried none
    assert line == {"kind": "step", "step": 1, "loss": 2.5, "samples_per_s": 8.0, "src": "rank-0"}
    status, stats = _request(server, "GET", "/v1/health", None, bearer(server.secret))
    assert status == 200 and stats == {
        "accepted": 1,
        "duplicates": 1,
        "rejected": 0,
        "malformed": 0,
        "invalid_events": 0,
        "broken": 0,
    }


def test_malformed_batch_is_a_400(server, tmp_path):
    bad = {"src": "x", "seq": 0, "events": [{"no_kind": 1}]}
    status, body = _request(server, "POST", "/v1/events", bad, bearer(server.secret))
    assert status == 400 and "kind" in body["error"]
    assert not (tmp_path / "metrics.jsonl").exists()


def test_sink_keeps_order_and_batches(server, tmp_path):
    sink = ChannelSink(server.url, server.secret, "rank-3", batch=100, interval=0.05)
    for i in range(1000):
        sink.write("heartbeat", step=i, **BEAT)
    assert sink.flush(30)
    recs = _lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in recs] == list(range(1000))
    assert all(r["src"] == "rank-3" and r["kind"] == "heartbeat" for r in recs)
    # Batched: far fewer requests than events (each request carries up to 100).
    assert sink._seq <= 1000 // 10
    assert sink.close(5)


def test_concurrent_senders_each_in_order(server, tmp_path):
    sinks = [ChannelSink(server.url, server.secret, f"rank-{r}", interval=0.02) for r in range(4)]

    def produce(sink):
        for i in range(300):
            sink.write("step", step=i, **STEP)

    threads = [threading.Thread(target=produce, args=(s,)) for s in sinks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(s.close(30) for s in sinks)
    recs = _lines(tmp_path / "metrics.jsonl")
    for r in range(4):
        assert [e["step"] for e in recs if e["src"] == f"rank-{r}"] == list(range(300))


def test_sink_retries_until_the_server_is_back(tmp_path):
    """Events written while nobody listens are delivered, once each, when it comes up."""
    secret, port = new_secret(), free_port()
    sink = ChannelSink(f"http://127.0.0.1:{port}", secret, "rank-0", interval=0.02, timeout=1)
    for i in range(50):
        sink.write("step", step=i, **STEP)
    wait_for(lambda: sink.failures >= 2, 30, "failed posts")
    t0 = time.perf_counter()
    sink.write("step", step=50, **STEP)  # never blocks training, server down or not
    assert time.perf_counter() - t0 < 0.05
    with ChannelServer("127.0.0.1", port, secret, tmp_path / "metrics.jsonl"):
        assert sink.flush(30)
        assert [e["step"] for e in _lines(tmp_path / "metrics.jsonl")] == list(range(51))
    sink.close(1)


def test_sink_with_wrong_secret_delivers_nothing(server, tmp_path):
    sink = ChannelSink(server.url, new_secret(), "rank-0", interval=0.02)
    sink.write("step", step=1, **STEP)
    assert not sink.flush(1.0)
    assert "401" in sink.last_error and server.rejected >= 1
    assert not (tmp_path / "metrics.jsonl").exists()
    sink.close(0.1)


def test_bounded_queue_drops_oldest_and_says_so(tmp_path):
    secret, port = new_secret(), free_port()
    sink = ChannelSink(f"http://127.0.0.1:{port}", secret, "rank-0", max_queue=10, timeout=1)
    for i in range(25):
        sink.write("heartbeat", step=i, **BEAT)
    assert len(sink._q) <= 10
    with ChannelServer("127.0.0.1", port, secret, tmp_path / "metrics.jsonl"):
        assert sink.flush(30)
    recs = _lines(tmp_path / "metrics.jsonl")
    steps = [r["step"] for r in recs if r["kind"] == "heartbeat"]
    dropped = sum(r["count"] for r in recs if r["kind"] == "channel_dropped")
    assert steps == sorted(steps) and steps[-1] == 24  # the newest survive, in order
    assert len(steps) + dropped == 25 and dropped > 0
    sink.close(0.1)


def test_idle_sink_sends_alive_events(server, tmp_path):
    sink = ChannelSink(
        server.url,
        server.secret,
        "rank-1",
        interval=0.05,
        alive={"rank": 1, "node": 0},
        alive_s=0.2,
    )
    wait_for(lambda: len(_lines(tmp_path / "metrics.jsonl")) >= 3, 30, "alive events")
    sink.write("step", step=1, **STEP)
    assert sink.close(10)
    recs = _lines(tmp_path / "metrics.jsonl")
    alive = [r for r in recs if r["kind"] == "alive"]
    assert len(alive) >= 3 and all(r["node"] == 0 and r["rank"] == 1 for r in alive)
    gaps = [b["ts"] - a["ts"] for a, b in zip(alive, alive[1:], strict=False)]
    assert min(gaps) >= 0.15  # only while idle, every alive_s
    # A sink without liveness fields never pings.
    quiet = ChannelSink(server.url, server.secret, "rank-2", interval=0.05, alive_s=0.1)
    time.sleep(0.5)
    assert quiet.close(5) and quiet.sent == 0


def test_event_sink_falls_back_to_the_file(tmp_path, monkeypatch):
    monkeypatch.delenv("JOBCTL_CHANNEL_URL", raising=False)
    monkeypatch.delenv("JOBCTL_EVENTS", raising=False)
    sink = event_sink(tmp_path, 0)
    assert isinstance(sink, EventLog)
    sink.write("step", step=1, **STEP)
    assert _lines(tmp_path / "metrics.jsonl")[0]["step"] == 1
    monkeypatch.setenv("JOBCTL_EVENTS", "network")
    with pytest.raises(RuntimeError, match="JOBCTL_CHANNEL_URL"):
        event_sink(tmp_path, 0)


def test_event_sink_uses_the_channel(server, tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_CHANNEL_URL", server.url)
    monkeypatch.setenv("JOBCTL_CHANNEL_SECRET", server.secret)
    sink = event_sink(tmp_path / "elsewhere", 2)
    assert isinstance(sink, ChannelSink)
    sink.write("sigterm", rank=2, node=1)
    assert sink.close(10)
    assert _lines(tmp_path / "metrics.jsonl")[0]["src"] == f"rank-2-{os.getpid()}-0"
    # Re-formed in place (a new rank, the same process): a new sender, numbered from 0.
    monkeypatch.setenv("JOBCTL_EPOCH", "1")
    again = event_sink(tmp_path / "elsewhere", 2)
    again.write("sigterm", rank=2, node=1)
    assert again.close(10)
    assert _lines(tmp_path / "metrics.jsonl")[1]["src"] == f"rank-2-{os.getpid()}-1"


def test_heartbeat_watch_flags_only_silent_running_nodes():
    now = [0.0]
    w = HeartbeatWatch(30.0, clock=lambda: now[0])
    assert w.silent([None, None]) == []  # nobody reported yet: start-up is not counted
    w.saw(0)
    w.saw(1)
    now[0] = 20.0
    w.saw(1)
    assert w.silent([None, None]) == []
    now[0] = 31.0
    assert w.silent([None, None]) == [0]
    assert w.silent([0, None]) == []  # node 0 exited: the exit code tells, not silence
    assert w.silent([None]) == [0]  # one handle for all nodes (Slurm): still running
    now[0] = 51.0
    assert w.silent([None, None]) == [0, 1]
    assert HeartbeatWatch(None).silent([None]) == []


def test_the_archive_stamps_a_missing_ts_and_keeps_a_given_one(tmp_path):
    """#46 item 5: a heartbeat without ``ts`` (optional on the wire) was archived
    without one, and `jobctl report` then died on KeyError 'ts'."""
    from jobctl.engine.channel.server import EventArchive
    from jobctl.engine.core.events import read_metrics

    seen: list[dict] = []
    archive = EventArchive(tmp_path / "metrics.jsonl", seen.extend)
    before = time.time()
    beat = {"kind": "heartbeat", "step": 3, "rank": 0, "stage": 0, "compute_s": 0.1}
    assert archive.add("rank-0", 0, [beat, {**beat, "ts": 12.5}])
    recs, _ = read_metrics(tmp_path / "metrics.jsonl", 0)
    assert before <= recs[0]["ts"] <= time.time() and recs[1]["ts"] == 12.5
    assert [r["ts"] for r in seen] == [r["ts"] for r in recs]  # the supervisor sees them too
