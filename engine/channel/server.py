"""The run's event channel: workers post heartbeats and events over HTTP to the run host.

Nodes without a shared run folder (ssh, Slurm, Kubernetes) cannot append to the run's
``metrics.jsonl``; they post batches of events here instead. The server is a stdlib
``ThreadingHTTPServer`` in a thread. Every request carries the run's secret as
``Authorization: Bearer <secret>`` (compared with ``hmac.compare_digest``); a request
without it or with a wrong one gets 401 and is counted and logged. Accepted events are
appended, in the order they were accepted and stamped with their sender (``src``), to
``metrics.jsonl`` in the run folder: the archive that ``logs``, ``status``, ``report``
and the supervisor's Monitor read.

Each sender numbers its batches (``src``, ``seq``); a batch is retried with the same
number until it is acknowledged, so a retry whose first try did arrive is dropped here
and every event is archived exactly once, in each sender's order.

Every event is checked against its kind's schema (engine/core/event_schema.py): the
valid ones of a batch are archived and the malformed ones set aside, counted and named
in the answer (``rejected``); a body that is not a batch, or whose every event is
malformed, is refused whole (400).

Endpoints: ``POST /v1/events`` (body ``{"src", "seq", "events": [...]}``),
``GET /v1/health`` (counters). Both need the secret.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple

from jobctl.engine.core import event_schema
from jobctl.engine.core.event_schema import MAX_INDEX

log = logging.getLogger("jobctl.channel")

# A worker's batch is at most 500 events of well under 1 KB each (client.BATCH_BYTES
# keeps it under 1 MB): these bounds leave 4x room and refuse what only a flood sends.
MAX_BODY = 4 << 20  # bytes of one batch; larger requests are refused (413)
MAX_EVENTS = 2_000  # events of one batch; more are refused (413)
DISCARD_MAX = 64 << 20  # a larger body is refused with its connection closed, unread
READ_TIMEOUT_S = 60.0  # a connection silent this long mid-request (or idle) is closed
SHUTDOWN_POLL_S = 0.05  # how often the serving thread checks for a shutdown


def new_secret() -> str:
    """A fresh per-run secret (256 bits)."""
    return secrets.token_urlsafe(32)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


class EventArchive:
    """Appends accepted events to ``metrics.jsonl``, each sender's batches once, in order."""

    def __init__(self, path: Path, on_events=None):
        self.path = Path(path)
        self.on_events = on_events  # optional callback(list[dict]) after each append
        self._lock = threading.Lock()
        self._last_seq: dict[str, int] = {}
        self.accepted = 0
        self.duplicates = 0

    def add(self, src: str, seq: int, events: list[dict]) -> bool:
        """Archive one batch; False if this sender's batch ``seq`` was archived already."""
        with self._lock:
            if seq <= self._last_seq.get(src, -1):
                self.duplicates += 1
                return False
            # ``ts`` is optional on the wire; the archive stamps its arrival where it is
            # missing, so every reader of metrics.jsonl finds one (#46 item 5).
            now = time.time()
            events = [{**e, "src": e.get("src", src), "ts": e.get("ts", now)} for e in events]
            lines = "".join(json.dumps(e) + "\n" for e in events)
            with open(self.path, "a") as f:
                f.write(lines)
            self._last_seq[src] = seq
            self.accepted += len(events)
            if self.on_events is not None:
                self.on_events(events)
        return True


class JsonHandler(BaseHTTPRequestHandler):
    """An HTTP request handler whose answers are JSON documents."""

    def reply(self, code: int, body: dict) -> None:
        """Answer with status ``code`` and ``body`` as JSON."""
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Handler(JsonHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: one connection per sender
    timeout = READ_TIMEOUT_S  # a sender that stalls mid-body frees its thread

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.client_address[0], *args)

    def _authorised(self) -> bool:
        got = self.headers.get("Authorization", "")
        want = f"Bearer {self.server.secret}"
        if hmac.compare_digest(got.encode(), want.encode()):
            return True
        self.server.note_rejected(self.client_address[0], self.path, bool(got))
        self._drain()
        self.reply(401, {"error": "missing or wrong run secret"})
        return False

    def _drain(self) -> None:
        n = self._length()
        if n is not None and 0 < n <= MAX_BODY:
            self.rfile.read(n)
        elif n != 0:
            self.close_connection = True

    def _discard(self, n: int | None) -> None:
        """Read and drop a too-large body of up to DISCARD_MAX bytes, outside every lock,
        so its sender (mid-send) reads the 413 instead of a broken pipe; a body whose end
        is unknown or beyond that closes the connection unread."""
        if n is None or n > DISCARD_MAX:
            self.close_connection = True
            return
        while n > 0:
            chunk = self.rfile.read(min(n, 1 << 20))
            if not chunk:
                break
            n -= len(chunk)

    def _length(self) -> int | None:
        """The body's Content-Length; None when it is not a count of bytes (``abc``, -1)."""
        text = (self.headers.get("Content-Length") or "0").strip()
        return int(text) if text.isdigit() else None

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        if not self._authorised():
            return
        if self.path != "/v1/health":
            self.reply(404, {"error": f"no such endpoint {self.path}"})
            return
        self.reply(200, self.server.stats())

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        if not self._authorised():
            return
        if self.path != "/v1/events":
            self._drain()
            self.reply(404, {"error": f"no such endpoint {self.path}"})
            return
        n = self._length()
        if n is None or n > MAX_BODY:
            self._discard(n)
            code, why = (400, "bad Content-Length") if n is None else (413, "batch too large")
            self.server.note_malformed(self.client_address[0], why)
            self.reply(code, {"error": f"{why} (at most {MAX_BODY} bytes)"})
            return
        try:
            data = self.rfile.read(n)
        except (ConnectionError, TimeoutError) as e:  # gone or stalled mid-body
            self.close_connection = True
            self.server.note_broken(self.client_address[0], e)
            return
        try:
            b = read_batch(data)
        except ValueError as e:
            self.server.note_malformed(self.client_address[0], str(e))
            code = 413 if isinstance(e, BatchTooLarge) else 400
            self.reply(code, {"error": f"bad batch: {e}"})
            return
        fresh = self.server.archive.add(b.src, b.seq, b.events)
        answer = {"accepted": len(b.events) if fresh else 0, "duplicate": not fresh}
        if b.invalid and fresh:
            self.server.note_invalid(self.client_address[0], b.invalid)
            answer["rejected"] = [{"event": i, "error": why} for i, why in b.invalid]
        self.reply(200, answer)


class BatchTooLarge(ValueError):
    """A batch of more than ``MAX_EVENTS`` events (413: the sender should split it)."""


class Batch(NamedTuple):
    """One request's batch: the sender ``src``, its number ``seq``, the ``events`` that
    pass their kind's schema and the ``invalid`` ones (index in the batch, why)."""

    src: str
    seq: int
    events: list[dict]
    invalid: list[tuple[int, str]]


def read_batch(data: bytes) -> Batch:
    """The batch of a request body, every event checked against its kind's schema
    (engine/core/event_schema): a malformed event is set aside, not the whole batch
    (the sender's other events are archived). ValueError saying what is wrong when the
    body is not a batch, or when it has events and none of them is valid."""
    try:
        body = json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    except ValueError as e:  # also not UTF-8
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(body, dict) or not isinstance(body.get("events"), list):
        raise ValueError("expected {'src': str, 'seq': int, 'events': [...]}")
    src, seq, events = body.get("src"), body.get("seq"), body["events"]
    if not isinstance(src, str) or type(seq) is not int or not 0 <= seq <= MAX_INDEX:
        raise ValueError("'src' must be a string and 'seq' an integer >= 0")
    if len(events) > MAX_EVENTS:  # before any schema check: a flood costs one len()
        raise BatchTooLarge(f"{len(events)} events (at most {MAX_EVENTS} a batch)")
    good, invalid = [], []
    for i, event in enumerate(events):
        why = event_schema.problem(event)
        if why is None:
            good.append(event)
        else:
            invalid.append((i, why))
    if invalid and not good:
        i, why = invalid[0]
        raise ValueError(
            f"event {i}: {why}" + (f" (and {len(invalid) - 1} more)" if len(invalid) > 1 else "")
        )
    return Batch(src, seq, good, invalid)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, secret: str, archive: EventArchive):
        super().__init__(addr, _Handler)
        self.secret, self.archive = secret, archive
        self.rejected = 0
        self.malformed = 0  # requests refused with 400/413: bad length, JSON or event
        self.invalid_events = 0  # events set aside from batches whose others were archived
        self.broken = 0  # connections lost mid-request or before their answer
        self._lock = threading.Lock()

    def handle_error(self, request, client_address) -> None:
        """A sender that hung up before its answer (or stalled past the read timeout)
        is one line at info: it retries its batch; anything else keeps the traceback."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)
            return
        self.note_broken(client_address[0], exc)

    def note_broken(self, client: str, exc: BaseException) -> None:
        with self._lock:
            self.broken += 1
            n = self.broken
        log.info("channel: connection from %s lost: %s (%d so far)", client, type(exc).__name__, n)

    def note_invalid(self, client: str, invalid: list[tuple[int, str]]) -> None:
        with self._lock:
            self.invalid_events += len(invalid)
            n = self.invalid_events
        i, why = invalid[0]
        log.warning(
            "channel: set aside %d malformed event(s) from %s, event %d: %s (%d so far)",
            len(invalid),
            client,
            i,
            why[:200],
            n,
        )

    def note_malformed(self, client: str, why: str) -> None:
        with self._lock:
            self.malformed += 1
            n = self.malformed
        log.warning("channel: refused a batch from %s: %s (%d so far)", client, why[:200], n)

    def note_rejected(self, client: str, path: str, had_header: bool) -> None:
        with self._lock:
            self.rejected += 1
            n = self.rejected
        why = "wrong secret" if had_header else "no secret"
        log.warning("channel: rejected %s from %s (%s; %d rejected so far)", path, client, why, n)

    def stats(self) -> dict:
        a = self.archive
        return {
            "accepted": a.accepted,
            "duplicates": a.duplicates,
            "rejected": self.rejected,
            "malformed": self.malformed,
            "invalid_events": self.invalid_events,
            "broken": self.broken,
        }


class ChannelServer:
    """The event channel of one run, served from a background thread."""

    def __init__(self, host: str, port: int, secret: str, metrics: Path, on_events=None):
        self.archive = EventArchive(metrics, on_events)
        self._server = _Server((host, port), secret, self.archive)
        self.host, self.port = host, self._server.server_address[1]
        # serve_forever checks for shutdown every poll_interval (0.5 s by default): the
        # supervisor waits for the run host to be gone at every attempt's end, a
        # recovery's teardown included, so that wait was up to 0.5 s of it.
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(SHUTDOWN_POLL_S,),
            name="jobctl-channel",
            daemon=True,
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def rejected(self) -> int:
        return self._server.rejected

    def start(self) -> ChannelServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ChannelServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
