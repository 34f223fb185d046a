"""Hostile events (#24 items 11 and 17): the channel answers 400 and counts every
malformed request; the monitor skips what it cannot read and goes on.

Before: a ``step`` without ``samples_per_s`` posted with the run's secret crashed the
supervisor (KeyError), and ``Content-Length: abc``, ``seq: Infinity`` or deep JSON
closed the connection with no answer and a traceback in the log.
"""

from __future__ import annotations

import json
import socket

import pytest

from jobctl.engine.core.event_schema import problem

from .test_monitor_queue import DONE, RUNNING, _monitor, _step, _write

BEAT = {"kind": "heartbeat", "step": 1, "rank": 0, "stage": 0, "node": 0, "compute_s": 0.1}
HOSTILE_STEP = {"kind": "step", "step": 99999, "loss": -1.0, "run": "other-run"}


def raw_post(server, body: bytes, length: str | None = None) -> tuple[int, dict]:
    """POST ``body`` with a hand-written Content-Length; the status and JSON answer."""
    head = (
        f"POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.secret}\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n"
        "Connection: close\r\n\r\n"
    )
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer, "the server closed the connection without an answer"
    status = int(answer.split(b" ", 2)[1])
    return status, json.loads(answer.split(b"\r\n\r\n", 1)[1] or b"{}")


def batch(*events, seq=0) -> bytes:
    return json.dumps({"src": "rank-0", "seq": seq, "events": list(events)}).encode()


def test_an_event_missing_a_field_its_kind_needs_is_a_counted_400(server, tmp_path):
    status, body = raw_post(server, batch(HOSTILE_STEP))
    assert status == 400 and "samples_per_s" in body["error"]
    assert server._server.malformed == 1
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    "body, length, words",
    [
        (b"{}", "abc", "Content-Length"),
        (b"{}", "-1", "Content-Length"),
        (b'{"src": "a", "seq": Infinity, "events": []}', None, "seq"),
        (b'{"src": "a", "seq": 1e400, "events": []}', None, "seq"),
        (b"[" * 100_000 + b"]" * 100_000, None, "too deep"),
        (b"\xff\xfe", None, "not JSON"),
        (batch({**BEAT, "rank": "0"}), None, "rank"),
        (batch({"kind": "step", "step": 1, "loss": 1.0, "samples_per_s": 1e400}), None, "finite"),
        (batch({"kind": "rm -rf"}), None, "unknown event kind"),
        (batch([1, 2]), None, "JSON object"),
    ],
)
def test_handler_errors_are_answered_400(server, body, length, words):
    status, answer = raw_post(server, body, length)
    assert status == 400 and words in answer["error"], answer
    assert server._server.malformed == 1


def test_a_malformed_event_is_set_aside_and_the_rest_of_its_batch_archived(server, tmp_path):
    """Leftover (c): one bad event refused the whole batch (and the sender retried it
    forever); now the valid ones are archived, the bad ones counted and named."""
    good = [{"kind": "step", "step": s, "loss": 2.0, "samples_per_s": 4.0} for s in (1, 2)]
    status, answer = raw_post(server, batch(good[0], HOSTILE_STEP, good[1], [1]))
    assert status == 200 and answer["accepted"] == 2, answer
    assert [r["event"] for r in answer["rejected"]] == [1, 3]
    assert "samples_per_s" in answer["rejected"][0]["error"]
    archived = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in archived] == [1, 2]
    stats = server._server.stats()
    assert (stats["invalid_events"], stats["malformed"], stats["accepted"]) == (2, 0, 2)
    # A retry of that batch is a duplicate: nothing archived or counted twice.
    status, answer = raw_post(server, batch(good[0], HOSTILE_STEP, good[1], [1]))
    assert (status, answer) == (200, {"accepted": 0, "duplicate": True})
    assert server._server.stats()["invalid_events"] == 2


def test_a_sender_does_not_retry_a_batch_refused_whole(server, tmp_path):
    from jobctl.engine.channel.client import ChannelSink

    sink = ChannelSink(server.url, server.secret, "rank-0", batch=1, interval=0.02)
    sink.write("step", step=1, loss=1.0)  # no samples_per_s: refused whole (400)
    sink.write("step", step=2, loss=1.0, samples_per_s=3.0)
    assert sink.flush(20) and sink.close(5)
    assert sink.refused == 1 and "samples_per_s" in sink.last_error
    archived = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in archived] == [2]


def test_the_channel_still_serves_after_hostile_requests(server, tmp_path):
    raw_post(server, b"[" * 100_000, None)
    good = {"kind": "step", "step": 1, "loss": 2.0, "samples_per_s": 4.0}
    assert raw_post(server, batch(good, seq=1)) == (200, {"accepted": 1, "duplicate": False})
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["step"] == 1


def test_every_kind_the_workers_write_passes_its_schema():
    assert problem(_step(1)) is None
    beat = {"kind": "heartbeat", "step": 3, "rank": 1, "stage": 0, "node": 0, "compute_s": 0.2}
    assert problem(beat) is None
    assert problem({"kind": "step", "step": 1, "loss": None, "samples_per_s": 2.0}) is None
    for loss in (float("inf"), float("nan")):  # a diverged run still reports its steps
        assert problem({"kind": "step", "step": 1, "loss": loss, "samples_per_s": 2.0}) is None
    assert problem({"kind": "node_sigterm", "node": 0, "ts": 1.5}) is None


def test_the_monitor_never_dies_on_a_record(tmp_path):
    mon, _, db = _monitor(tmp_path, [RUNNING, RUNNING, DONE], total=2)
    _write(mon.run.dir, HOSTILE_STEP, {"kind": "heartbeat", "node": "x"}, _step(1))
    with open(mon.run.dir / "metrics.jsonl", "a") as f:
        f.write("not json\n" + "[" * 50_000 + "\n" + "[1, 2]\n")
    assert mon.poll_once() is None
    assert mon.records.malformed == 2 and db.get_run("r")["step"] == 1
    _write(mon.run.dir, _step(2), {"kind": "checkpoint", "step": 2, "ts": 0.0})
    outcome = mon.poll_once() or mon.poll_once()
    assert outcome is not None and outcome.ok and db.get_run("r")["step"] == 2


def test_a_flood_batch_is_refused_before_it_is_read_or_archived(server, tmp_path):
    """#46 item 7: 500,000 events (12 MB) were archived under the lock every sender
    waits on, past their 5 s timeout. Now a body over MAX_BODY is refused on its
    Content-Length and a batch over MAX_EVENTS before any schema check, both 413."""
    from jobctl.engine.channel.server import MAX_BODY, MAX_EVENTS

    flood = batch(*[{"kind": "channel_dropped"}] * 500_000)
    assert len(flood) > 12 << 20 > MAX_BODY
    status, body = raw_post(server, flood)
    assert status == 413 and "at most" in body["error"]
    many = batch(*[{"kind": "channel_dropped"}] * (MAX_EVENTS + 1))
    assert len(many) < MAX_BODY
    status, body = raw_post(server, many)
    assert status == 413 and f"at most {MAX_EVENTS}" in body["error"]
    assert not (tmp_path / "metrics.jsonl").exists()
    good = {"kind": "step", "step": 1, "loss": 2.0, "samples_per_s": 4.0}
    assert raw_post(server, batch(good, seq=1))[0] == 200


def test_a_sender_that_hangs_up_is_one_line_not_a_traceback(server, caplog):
    """#46 item 7: a sender gone before its answer made the server log BrokenPipeError
    tracebacks; now it is counted and logged in one line, and the channel serves on."""
    import logging
    import time

    good = {"kind": "step", "step": 1, "loss": 2.0, "samples_per_s": 4.0}
    body = batch(good)
    head = (
        f"POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.secret}\r\n"
        f"Content-Length: {len(body) + 10}\r\n\r\n"
    )
    with caplog.at_level(logging.INFO, logger="jobctl.channel"):
        server._server.RequestHandlerClass.timeout = 0.5  # then the body is late
        try:
            with socket.create_connection((server.host, server.port), timeout=10) as sock:
                sock.sendall(head.encode() + body)  # 10 bytes short: the read times out
                time.sleep(1.5)
        finally:
            server._server.RequestHandlerClass.timeout = 60.0
        deadline = time.monotonic() + 10
        while server._server.broken < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert server._server.stats()["broken"] == 1
    lost = [r for r in caplog.records if "connection from" in r.getMessage()]
    assert len(lost) == 1 and lost[0].exc_info is None
    assert raw_post(server, batch(good, seq=1))[0] == 200


def test_a_sender_splits_big_batches_and_never_retries_one_too_large(server, tmp_path):
    """The sink keeps a batch within the server's bounds (about BATCH_BYTES), and an
    event over MAX_BODY on its own is refused (413) once, counted, not retried for ever."""
    from jobctl.engine.channel import client
    from jobctl.engine.channel.server import MAX_BODY

    sink = client.ChannelSink(server.url, server.secret, "rank-0", interval=0.02)
    pad = "x" * (client.BATCH_BYTES // 40)
    for i in range(100):  # 2.5 BATCH_BYTES in all: three batches
        sink.write("upload_error", error=pad, step=i)
    assert sink.flush(30)
    sink.write("upload_error", error="x" * MAX_BODY)
    sink.write("upload_error", error="after")
    assert sink.flush(30) and sink.close(5)
    assert sink.refused == 1 and sink.last_error.startswith("413")
    archived = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["error"] for r in archived[-1:]] == ["after"] and len(archived) == 101
    assert sink._seq >= 4  # three batches of the 100, then "after"


def test_records_beyond_the_plan_are_skipped_and_counted(tmp_path):
    """#46 item 5: schema-valid records with impossible values were followed: an
    ``uploaded`` at step 2**53 stayed in status as the last upload, a heartbeat for
    rank 999 added a row. The monitor now bounds step, rank, node and stage by the
    plan (P = 1 x D = 2 on one node, four blocks, four steps) and `status` does too."""
    from jobctl.engine.supervise.figures import rank_compute, run_bounds, tail_records

    monitor, _, db = _monitor(tmp_path, [RUNNING])
    run_dir = tmp_path / "run"
    (run_dir / "plan.json").write_text(monitor.run.plan.model_dump_json())
    beat = {**BEAT, "ts": 0.0, "fwd_ms": 1.0, "bwd_ms": 1.0}
    impossible = [
        {"kind": "uploaded", "step": 2**53, "ts": 0.0},
        {**beat, "rank": 999},
        {**beat, "node": 3},
        {**beat, "stage": 4},
        {"kind": "checkpoint", "step": 5, "ts": 0.0},
    ]
    _write(run_dir, {"kind": "uploaded", "step": 4, "ts": 0.0}, beat, *impossible)
    assert monitor.poll_once() is None
    assert monitor.records.malformed == len(impossible)
    row = db.get_run("r")
    assert row["last_upload"] == 4 and row["last_checkpoint"] is None
    recs = tail_records(run_dir, bounds=run_bounds(row))
    assert [r["rank"] for r in rank_compute(recs)] == [0]
    assert len(tail_records(run_dir)) == len(impossible) + 2  # unbounded: all of them
