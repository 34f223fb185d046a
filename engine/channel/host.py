"""The run host: a small detached process per attempt that hosts the run's rendezvous
store (a c10d ``TCPStore`` server) and its event channel.

Why not in the ``jobctl apply`` process itself: torchrun agents poll the c10d store
while their workers train, and an agent whose store is gone raises
``RendezvousConnectionError`` and takes its workers down (measured: training stopped
within seconds of a SIGKILL of the supervisor). Hosted here, in its own session, both
survive the supervisor: workers keep training and posting events, which keep landing
in ``metrics.jsonl``, and a new ``jobctl resume RUN`` adopts the run
(engine/supervise/adoption.py) by reading ``host.json`` and following the archive.

The secret reaches this process only through its environment. The host writes
``<run dir>/host.json`` (pid, endpoints; never the secret) once both servers listen.
It exits on SIGTERM/SIGINT (the supervisor stops it when the attempt ends), or, once
its supervisor is gone, after ``idle_exit_s`` without an accepted event (a run nobody
adopts must not leave a process behind forever).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from jobctl.engine.channel.server import ChannelServer
from jobctl.engine.core.env import CHANNEL_SECRET, HOST_CONF, HOST_IDLE_S
from jobctl.engine.core.process import pid_alive, process_token

HOST_FILE = "host.json"
HOST_LOG = "run-host.log"  # beside host.json; logs/ holds the nodes' and ranks' logs


@dataclass
class RunHost:
    """A started run host, as recorded in ``host.json``."""

    pid: int
    rdzv_endpoint: str
    channel_url: str
    run_dir: Path
    supervisor: int = 0  # the process that started it, or adopted the run since
    # Start times of both (``process_token``): a pid alone may name a later process.
    token: str | None = None
    supervisor_token: str | None = None

    def alive(self) -> bool:
        return pid_alive(self.pid, self.token)

    def supervised(self) -> bool:
        """Does the recorded supervisor still run (the same process, not a reused pid)?"""
        return bool(self.supervisor) and pid_alive(self.supervisor, self.supervisor_token)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it lingers (works for a host another process started)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        end = time.monotonic() + timeout
        while pid_alive(self.pid) and time.monotonic() < end:
            _reap(self.pid)
            time.sleep(0.05)
        if pid_alive(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        _reap(self.pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def read_host(run_dir: Path) -> RunHost | None:
    path = Path(run_dir) / HOST_FILE
    if not path.exists():
        return None
    d = json.loads(path.read_text())
    sup = int(d.get("supervisor", 0))
    return RunHost(
        int(d["pid"]),
        d["rdzv_endpoint"],
        d["channel_url"],
        Path(run_dir),
        sup,
        d.get("token"),
        d.get("supervisor_token"),
    )


def spawn_run_host(
    run_dir: Path,
    rdzv_endpoint: str,
    channel_port: int = 0,
    secret: str | None = None,
    idle_exit_s: float | None = None,
) -> subprocess.Popen:
    """Start the detached run host (no channel without a secret); see ``wait_run_host``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (run_dir / HOST_FILE).unlink()
    if idle_exit_s is None:
        idle_exit_s = float(os.environ.get(HOST_IDLE_S, "600"))
    host = rdzv_endpoint.rsplit(":", 1)[0]
    conf = {
        "run_dir": str(run_dir),
        "rdzv_endpoint": rdzv_endpoint,
        "channel": [host, channel_port] if secret else None,
        "idle_exit_s": idle_exit_s,
        "supervisor": os.getpid(),
        "supervisor_token": process_token(os.getpid()),
    }
    env = {**os.environ, HOST_CONF: json.dumps(conf)}
    env.pop(CHANNEL_SECRET, None)
    if secret:
        env[CHANNEL_SECRET] = secret
    with open(run_dir / HOST_LOG, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "jobctl.engine.channel.host"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_run_host(run_dir: Path, proc: subprocess.Popen, timeout: float = 120.0) -> RunHost:
    """Wait until the host started by ``spawn_run_host`` listens; its ``host.json``."""
    run_dir = Path(run_dir)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = read_host(run_dir)
        if got is not None and got.pid == proc.pid:
            return got
        if proc.poll() is not None:
            tail = (run_dir / HOST_LOG).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"run host exited {proc.returncode}:\n{tail}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"run host did not start within {timeout:.0f} s")


def _write_host_file(run_dir: Path, conf: dict, url: str) -> None:
    """Publish this host in ``host.json`` (replaced whole: a reader never sees half)."""
    info = {
        "pid": os.getpid(),
        "token": process_token(os.getpid()),
        "rdzv_endpoint": conf["rdzv_endpoint"],
        "channel_url": url,
        "supervisor": conf["supervisor"],
        "supervisor_token": conf.get("supervisor_token"),
    }
    tmp = run_dir / f".{HOST_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(info))
    tmp.replace(run_dir / HOST_FILE)


def _serve_while_needed(
    run_dir: Path, stop: threading.Event, idle: float, last: list[float]
) -> None:
    """Return on a signal, or once no supervisor is left and no event came for ``idle`` s
    (``last[0]``: when the last one came)."""
    while not stop.wait(1.0):
        # host.json names the supervisor now (a `jobctl resume` may have adopted the run)
        me = read_host(run_dir)
        if (me is None or not me.supervised()) and time.monotonic() - last[0] > idle:
            print(f"supervisor gone and no event for {idle:.0f} s: exiting", flush=True)
            return


def main() -> int:
    """The run host: the workers' rendezvous store and the event channel, kept up while
    a supervisor lives or events come in (``conf`` from ``spawn_run_host``)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    conf = json.loads(os.environ[HOST_CONF])
    secret = os.environ.pop(CHANNEL_SECRET, None)
    run_dir = Path(conf["run_dir"])
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    from torch.distributed import TCPStore

    host, port = conf["rdzv_endpoint"].rsplit(":", 1)
    store = TCPStore(host, int(port), is_master=True, wait_for_workers=False)  # noqa: F841
    last = [time.monotonic()]

    def seen(_events) -> None:
        last[0] = time.monotonic()

    server = None
    if conf["channel"] and secret:
        chost, cport = conf["channel"]
        server = ChannelServer(chost, int(cport), secret, run_dir / "metrics.jsonl", seen).start()
    url = server.url if server else ""
    _write_host_file(run_dir, conf, url)
    print(f"run host {os.getpid()}: store {conf['rdzv_endpoint']}, channel {url or 'off'}")
    sys.stdout.flush()
    _serve_while_needed(run_dir, stop, float(conf["idle_exit_s"]), last)
    if server is not None:
        server.close()
        print(f"run host stopping ({server.rejected} request(s) rejected)", flush=True)
    return 0


def leave(code: int) -> None:
    """Exit with ``code`` once the logs are flushed, without the interpreter's teardown
    of torch (the store): that took about a second on a busy host, and the supervisor
    waits for the host to be gone at the end of every attempt."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
