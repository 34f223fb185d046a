"""A worker's side of the event channel: events queued, posted in batches by a thread.

``write(kind, **fields)`` (the ``EventLog`` interface) only appends to a bounded queue,
so training never waits on the network. A background thread posts batches; a
connection error, a timeout or a 5xx answer retries the same batch (same sequence
number: the server archives it once) with backoff, so a run host that is briefly
unreachable loses nothing. A batch the server refuses whole (400: every event
malformed; 413: one event over the server's size bound) would be refused again: it is
counted (``refused``) and not retried. A batch is at most ``batch`` events and about
``BATCH_BYTES`` bytes, within the server's bounds.
``close`` (also run at interpreter exit) flushes what is queued. If the queue
overflows, the oldest events are dropped and counted; the count is reported as a
``channel_dropped`` event.

``event_sink`` picks the sink for a worker: the channel when ``JOBCTL_CHANNEL_URL`` and
``JOBCTL_CHANNEL_SECRET`` are set, otherwise the run folder's ``metrics.jsonl``
(old runs, single-machine tests without a run host). ``JOBCTL_EVENTS=network`` forbids
that fallback (a worker without a channel fails at start).
"""

from __future__ import annotations

import atexit
import collections
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from jobctl.engine.channel.server import MAX_BODY, MAX_EVENTS, bearer
from jobctl.engine.core.env import CHANNEL_FLUSH_S, CHANNEL_SECRET, CHANNEL_URL, EPOCH, EVENTS
from jobctl.engine.core.events import EventLog, Kind

BATCH_BYTES = MAX_BODY // 4  # a batch stops growing here (the server refuses MAX_BODY)


class ChannelError(RuntimeError):
    """The channel answered with an error (401, 5xx): the batch is retried."""


class ChannelSink:
    """Posts events to the run's channel from a background thread."""

    def __init__(
        self,
        url: str,
        secret: str,
        src: str,
        max_queue: int = 20_000,
        batch: int = 500,
        interval: float = 0.2,
        timeout: float = 5.0,
        alive: dict | None = None,
        alive_s: float = 2.0,
    ):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"{CHANNEL_URL}={url!r}: expected http://HOST:PORT")
        self.host, self.port = u.hostname, u.port or 80
        self.headers = {**bearer(secret), "Content-Type": "application/json"}
        self.src, self.max_queue, self.batch = src, max_queue, batch
        self.interval, self.timeout = interval, timeout
        self.sent = self.dropped = self.failures = 0
        self.refused = 0  # events of batches the server refused whole (400, 413)
        self.last_error: str | None = None
        self._q: collections.deque[dict] = collections.deque()
        # Reentrant: a SIGTERM handler may write an event while the main thread is in write().
        self._cond = threading.Condition(threading.RLock())
        self._pending: list[dict] = []
        self._pending_real = 0  # events of the pending batch that write() queued
        self._written = self._done = 0  # events written; delivered or dropped
        self._seq = 0
        self._closing = False
        self._conn: http.client.HTTPConnection | None = None
        # Liveness: while nothing else is sent (a rank blocked in a collective on a lost
        # peer, say), an ``alive`` event with these fields goes out every ``alive_s``.
        self.alive, self.alive_s = alive, alive_s
        self._last_post = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="jobctl-events", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def write(self, kind: str, **fields) -> None:
        rec = {"kind": kind, "ts": time.time(), **fields}
        with self._cond:
            if len(self._q) >= self.max_queue:
                self._q.popleft()
                self.dropped += 1
                self._done += 1
            self._q.append(rec)
            self._written += 1
            if len(self._q) >= self.batch:
                self._cond.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything written so far is acknowledged (False on timeout)."""
        end = time.monotonic() + timeout
        with self._cond:
            target = self._written
            self._cond.notify_all()
            while self._done < target:
                left = end - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Flush (``JOBCTL_CHANNEL_FLUSH_S``, default 15 s), then stop the thread."""
        if self._closing:
            return not (self._q or self._pending)
        atexit.unregister(self.close)
        if timeout is None:
            timeout = float(os.environ.get(CHANNEL_FLUSH_S, "15"))
        ok = self.flush(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=1.0)
        if not ok:
            left = len(self._q) + len(self._pending)
            print(f"jobctl: {left} event(s) not delivered: {self.last_error}", file=sys.stderr)
        return ok

    def _next_batch(self) -> list[dict] | None:
        """The batch to post: the one not yet acknowledged, else up to ``batch`` queued
        events (the count of dropped ones first; an ``alive`` event when idle); None
        once closing with nothing left."""
        with self._cond:
            if not self._pending:
                if not self._q:
                    if self._closing:
                        return None
                    self._cond.wait(self.interval)
                self._pending = self._take()
                n = self._pending_real = len(self._pending)
                idle = time.monotonic() - self._last_post >= self.alive_s
                if not n and idle and self.alive is not None and not self._closing:
                    self._pending = [{"kind": Kind.ALIVE, "ts": time.time(), **self.alive}]
                if self.dropped:
                    lost = {"kind": Kind.CHANNEL_DROPPED, "ts": time.time(), "count": self.dropped}
                    self._pending.insert(0, lost)
                    self.dropped = 0
            return self._pending

    def _take(self) -> list[dict]:
        """Up to ``batch`` queued events and about ``BATCH_BYTES`` bytes (at least one
        event: one over the server's bound is refused there, counted, and not retried)."""
        out: list[dict] = []
        size = 0
        while self._q and len(out) < min(self.batch, MAX_EVENTS - 2) and size < BATCH_BYTES:
            out.append(self._q.popleft())
            size += len(json.dumps(out[-1])) + 2
        return out

    def _run(self) -> None:
        """The sender thread: post each batch until it is acknowledged, backing off."""
        backoff = 0.1
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            if not batch:
                continue
            try:
                refused = self._post(batch)
            except (OSError, http.client.HTTPException, ChannelError) as e:
                self.failures += 1
                self.last_error = f"{type(e).__name__}: {e}"
                self._drop_conn()
                with self._cond:
                    if self._closing:
                        return
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            self._last_post = time.monotonic()
            if refused is not None:  # the same batch would be refused again: count it
                self.refused += len(batch)
                self.last_error = refused
            with self._cond:
                self._pending = []
                self._done += self._pending_real
                self._seq += 1
                self.sent += len(batch)
                self._cond.notify_all()

    def _post(self, batch: list[dict]) -> str | None:
        """Post ``batch``; None once archived (its malformed events set aside by the
        server), the answer when the server refused all of it (400, 413: never retried)."""
        body = json.dumps({"src": self.src, "seq": self._seq, "events": batch}).encode()
        if len(body) > MAX_BODY:  # one event over the bound (_take stops under it)
            return f"413 not sent: {len(body)} bytes, the channel takes {MAX_BODY}"
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        self._conn.request("POST", "/v1/events", body=body, headers=self.headers)
        resp = self._conn.getresponse()
        text = resp.read()
        if resp.status in (400, 413):
            return f"{resp.status} {text[:200]!r}"
        if resp.status != 200:
            # 401 (wrong secret) and 5xx are retried: a restarted run host may come back.
            raise ChannelError(f"{resp.status} {text[:200]!r}")
        return None

    def _drop_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def event_sink(run_dir: Path, rank: int, node: int | None = None):
    """The channel if this process was given one, else the run folder's metrics file.

    With ``node``, the channel also sends ``alive`` events (rank, node) while idle.
    """
    url, secret = os.environ.get(CHANNEL_URL), os.environ.get(CHANNEL_SECRET)
    if url and secret:
        alive = None if node is None else {"rank": rank, "node": node}
        # A sender numbers its batches from 0: a process that trains on under a new rank
        # (re-formed in place, engine/worker/reform.py) is a new sender, its epoch says.
        src = f"rank-{rank}-{os.getpid()}-{os.environ.get(EPOCH, '0')}"
        return ChannelSink(url, secret, src=src, alive=alive)
    if os.environ.get(EVENTS) == "network":
        raise RuntimeError(
            f"{EVENTS}=network but {CHANNEL_URL} or {CHANNEL_SECRET} is not set in this "
            "worker's environment: launch it through `jobctl apply` (which hosts the channel), "
            f"or unset {EVENTS} to append to the run folder's metrics.jsonl"
        )
    return EventLog(Path(run_dir) / "metrics.jsonl")
