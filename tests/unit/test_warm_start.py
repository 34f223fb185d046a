"""Warm start (engine/worker/agent.py): a worker forked from its torchrun agent is what a
fresh interpreter would be, and torchrun sees it as it sees a Popen'd one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from jobctl.backends.base import RunContext
from jobctl.backends.nodes import node_env
from jobctl.engine.core.env import WARM_START
from jobctl.engine.worker import agent
from jobctl.spec.sections import HardwareSpec


def _probe(path: str):
    """A child's main that writes down the state a fresh interpreter would have."""

    def main() -> int:
        state = {
            "sid_is_pid": os.getsid(0) == os.getpid(),
            "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
            "sigint_default": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
            "env": os.environ.get("PROBE_VAR"),
            "agent_only": os.environ.get("AGENT_ONLY"),
            "draw": torch.rand(4).tolist(),
            "argv0": sys.argv[0],
        }
        with open(path, "w") as f:
            json.dump(state, f)
        return 0

    return main


def _wait(handler, timeout: float = 60.0) -> int:
    return handler.proc.wait(timeout)


def test_a_forked_worker_starts_as_a_fresh_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_ONLY", "inherited")
    agent_state = torch.get_rng_state()
    old = signal.signal(signal.SIGTERM, lambda *_: None)  # torchrun's, in the agent
    try:
        states = []
        for rank in (0, 1):
            out = tmp_path / f"state-{rank}.json"
            h = agent.ForkedHandler({"PROBE_VAR": "set"}, None, None, rank, main=_probe(str(out)))
            assert _wait(h) == 0
            states.append(json.loads(out.read_text()))
    finally:
        signal.signal(signal.SIGTERM, old)
    # Seeded from the OS as a new interpreter is: not the agent's stream, not a sibling's.
    agents_next = torch.rand(4).tolist()
    torch.set_rng_state(agent_state)
    assert torch.rand(4).tolist() == agents_next
    assert len({json.dumps(s["draw"]) for s in states} | {json.dumps(agents_next)}) == 3
    state = states[0]
    assert state["sid_is_pid"] and state["sigterm_default"] and state["sigint_default"]
    assert (state["env"], state["agent_only"]) == ("set", "inherited")
    assert state["argv0"].endswith("engine/worker/process.py")


def _exits(code_or_raise):
    def main():
        if isinstance(code_or_raise, BaseException):
            raise code_or_raise
        return code_or_raise

    return main


@pytest.mark.parametrize(
    ("main", "code"),
    [
        (_exits(0), 0),
        (_exits(None), 0),
        (_exits(3), 3),
        (_exits(SystemExit(4)), 4),
        (_exits(RuntimeError("boom")), 1),
    ],
)
def test_exit_codes_are_a_fresh_interpreters(tmp_path, main, code):
    err = tmp_path / "err.txt"
    h = agent.ForkedHandler({}, None, str(err), 0, main=main)
    assert _wait(h) == code
    h.close()
    if code == 1:
        assert "RuntimeError: boom" in err.read_text()


def test_output_is_unbuffered_and_a_kill_reads_as_a_signal(tmp_path):
    """A SIGKILLed worker's last print is in its log (torchrun's ``-u``); its exit
    status reads as a Popen's does (``-9``), and close() ends its whole session."""
    out = tmp_path / "out.txt"

    def main():
        print("before the kill")  # no flush
        time.sleep(60)

    h = agent.ForkedHandler({}, str(out), None, 0, main=main)
    deadline = time.monotonic() + 30
    while "before the kill" not in out.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert h.proc.poll() is None
    h.close(signal.SIGKILL)
    assert _wait(h) == -signal.SIGKILL
    assert out.read_text() == "before the kill\n"
    slow = agent.ForkedHandler({}, None, None, 0, main=main)
    with pytest.raises(subprocess.TimeoutExpired):
        slow.proc.wait(0.2)
    slow.close(signal.SIGKILL)
    assert _wait(slow) == -signal.SIGKILL


def test_only_the_worker_module_is_forked(monkeypatch):
    from torch.distributed.elastic.multiprocessing import api

    monkeypatch.setattr(api, "get_subprocess_handler", api.get_subprocess_handler)
    assert agent._install()
    started = api.get_subprocess_handler(sys.executable, ("-c", "pass"), {}, None, None, 0, None)
    assert type(started).__name__ == "SubprocessHandler"
    assert started.proc.wait(60) == 0


@pytest.mark.parametrize(
    ("device", "asked", "rendered"),
    [("cpu", None, "1"), ("cpu", "0", "0"), ("cuda", None, "0"), ("cuda", "1", "0")],
)
def test_warm_start_is_rendered_for_cpu_runs_only(monkeypatch, tmp_path, device, asked, rendered):
    if asked is None:
        monkeypatch.delenv(WARM_START, raising=False)
    else:
        monkeypatch.setenv(WARM_START, asked)
    ctx = RunContext("r", tmp_path, 1, [2], "127.0.0.1:1", hardware=HardwareSpec(device=device))
    assert node_env(ctx)[WARM_START] == rendered


def test_a_sigterm_while_the_agent_imports_the_worker_still_stops_it(tmp_path):
    """A `jobctl stop` just after launch reaches the agent while it imports the worker's
    modules (seconds), whose import installs the worker's SIGTERM note: the agent took
    that note for its own, ignored the signal and started its workers, and the node
    trained on to the end. Now the signal is held back until the agent's own handler is
    back, and the agent ends by it before any worker starts."""
    marker = tmp_path / "worker-ran"
    script = tmp_path / "entry.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    argv = [sys.executable, "-m", "jobctl.engine.worker.agent", "--standalone"]
    argv += ["--nnodes", "1", "--nproc-per-node", "1", str(script)]
    env = {**os.environ, WARM_START: "1"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.3)  # importing torch and the worker's modules takes seconds
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == -signal.SIGTERM, proc.stderr.read().decode()[-2000:]
    assert not marker.exists()
