"""A worker that trained to the end, and the run host, exit without the interpreter's
teardown of torch (seconds per process on a busy host, paid after every attempt), yet
with nothing lost that a normal exit keeps: the worker's events reach the channel and
its non-daemon threads (a checkpoint upload) finish first; the host's log is flushed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from jobctl.engine.channel.server import ChannelServer, new_secret

WORKER = """
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from jobctl.engine.channel.client import ChannelSink
from jobctl.engine.checkpoint.upload import UPLOAD_THREAD
from jobctl.engine.worker import process

url, secret, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])

class Done:  # what _finish reads of a trainer: its event sink
    events = ChannelSink(url, secret, src="rank-0", interval=5.0)

def upload():  # a checkpoint upload still running as the training loop ends
    time.sleep(0.5)
    (out / "uploaded").write_text("yes")

threading.Thread(target=upload, name=UPLOAD_THREAD, daemon=False).start()
readers = ThreadPoolExecutor(2, thread_name_prefix="jobctl-blocks")  # the data's pool:
readers.submit(time.sleep, 0.01).result()  # its idle workers wait for work forever
atexit.register(lambda: (out / "teardown").write_text("ran"))
Done.events.write("step", step=7, loss=1.5, samples_per_s=9.0)
print("leaving", flush=True)
process._finish(Done())
print("not reached", flush=True)
"""

HOST = """
import logging, sys
from jobctl.engine.channel import host
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
logging.getLogger("h").info("logged before leaving")
print("printed", end="")
host.leave(3)
"""


def test_a_finished_worker_delivers_its_events_and_threads_then_leaves(tmp_path):
    secret = new_secret()
    server = ChannelServer("127.0.0.1", 0, secret, tmp_path / "metrics.jsonl").start()
    try:
        t0 = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-c", WORKER, server.url, secret, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout == "leaving\n"  # _finish never returns
        # The upload thread was waited for (0.5 s), the idle data pool was not (it
        # hung a finished run until its 240 s timeout), the event posted before the exit
        # (its batch interval, 5 s, was not waited out: close() flushed it).
        assert (tmp_path / "uploaded").read_text() == "yes"
        recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert [(r["kind"], r["step"], r["loss"]) for r in recs if r["kind"] == "step"] == [
            ("step", 7, 1.5)
        ]
        assert time.monotonic() - t0 < 60
        # No interpreter teardown: atexit callbacks (torch's among them) never ran.
        assert not (tmp_path / "teardown").exists()
    finally:
        server.close()


def test_the_run_host_flushes_its_log_and_exits_with_the_code(tmp_path):
    run = subprocess.run([sys.executable, "-c", HOST], capture_output=True, text=True, timeout=120)
    assert run.returncode == 3, run.stderr
    assert run.stdout == "logged before leaving\nprinted"
