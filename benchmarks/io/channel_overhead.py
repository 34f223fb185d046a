"""Event channel cost on the training thread, and its delivery rate.

Times ``write()`` of N heartbeat-sized events on the training thread for (a) the file
sink (``EventLog``: one append per event, what workers did before the channel) and
(b) the channel sink (``ChannelSink``: queued, posted in batches by a background
thread to a real ``ChannelServer`` on 127.0.0.1 with the secret), then how long the
channel takes to archive them all (flush). The poster thread's CPU time (its own
thread clock, from the first write to the end of the flush) is measured too: on a
worker it competes with training for the same cores. Prints the per-event costs, the
delivery rate, the training-thread ratio (b) / (a) and, last, the ratio with the
poster's CPU added to (b) (below 1: the channel costs the worker less than the file
it replaces).

    python -m benchmarks run channel_overhead [--events 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from jobctl.engine.channel.client import ChannelSink
from jobctl.engine.channel.server import ChannelServer, new_secret
from jobctl.engine.core.events import EventLog

QUESTION = "What does the event channel cost the training thread, and how fast does it deliver?"
BASELINE = "The file sink (one append per event) it replaces."

FIELDS = {"rank": 3, "stage": 1, "node": 1, "compute_s": 0.0123, "max_rss_mb": 327.1}


def _file_round(d: Path, n: int) -> float:
    sink = EventLog(d / "file.jsonl")
    t0 = time.perf_counter()
    for i in range(n):
        sink.write("heartbeat", step=i, **FIELDS)
    return time.perf_counter() - t0


def _channel_round(d: Path, n: int, k: int) -> tuple[float, float, float]:
    """(training-thread seconds, write + flush seconds, poster thread CPU seconds)."""
    secret = new_secret()
    with ChannelServer("127.0.0.1", 0, secret, d / f"channel-{k}.jsonl") as srv:
        sink = ChannelSink(srv.url, secret, "bench", max_queue=n + 1)
        poster = time.pthread_getcpuclockid(sink._thread.ident)  # the sender thread's clock
        cpu0 = time.clock_gettime(poster)
        t0 = time.perf_counter()
        for i in range(n):
            sink.write("heartbeat", step=i, **FIELDS)
        t1 = time.perf_counter()
        assert sink.flush(120), sink.last_error
        t2 = time.perf_counter()
        cpu = time.clock_gettime(poster) - cpu0
        sink.close(1)
        lines = (d / f"channel-{k}.jsonl").read_text().count("\n")
        assert lines == n, (lines, n)
    return t1 - t0, t2 - t0, cpu


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    files, chans, totals, posts = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for k in range(a.rounds):
            files.append(_file_round(d, a.events))
            w, total, post = _channel_round(d, a.events, k)
            chans.append(w)
            totals.append(total)
            posts.append(post)
    f, c, t, post = (statistics.median(x) for x in (files, chans, totals, posts))
    n = a.events
    print(f"file sink write:    {1e6 * f / n:.2f} us/event (median of {a.rounds})")
    print(f"channel sink write: {1e6 * c / n:.2f} us/event on the training thread")
    print(f"channel delivery:   {n / t:,.0f} events/s archived (write + flush)")
    print(f"poster thread CPU:  {1e6 * post / n:.2f} us/event (background, same process)")
    print(f"training-thread time ratio channel/file: {c / f:.2f}")
    print(f"worker time ratio channel (training thread + poster CPU)/file: {(c + post) / f:.2f}")


if __name__ == "__main__":
    main()
