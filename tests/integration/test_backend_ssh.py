"""ssh backend against a real OpenSSH server on 127.0.0.1 (tests/sshd.py).

Two "hosts" (127.0.0.1 and localhost) reach the same server, so one machine stands in
for two. The tests skip, with the reason, where sshd is not installed or cannot start.
"Another process" is a fresh ``SshBackend`` (or a ``jobctl`` subprocess) that knows
only the handles, as ``jobctl stop``, ``jobctl logs`` and an adopting supervisor do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from jobctl.backends import BackendError, Rendered
from jobctl.backends.ssh import Node, SshBackend, kill_command, ssh_argv, start_command
from jobctl.engine.state.db import StateDB
from jobctl.spec.sections import SshSpec

from .. import sshd
from ..backend_jobs import run_on, service_fixture, two_process_spec, wait_done
from ..render_contexts import EVIL, context

WAIT_S = 30.0


def test_ssh_argv_never_lets_a_host_become_an_option():
    opts = SshSpec(user="alice", port=2222, identity_file="/k", known_hosts_file="/kh")
    assert ssh_argv(opts, "gpu-a", "true") == [
        "ssh",
        "-p",
        "2222",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-i",
        "/k",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "UserKnownHostsFile=/kh",
        "-l",
        "alice",
        "--",
        "gpu-a",
        "true",
    ]
    good = context("ssh", {"hosts": ["a", "b"]})
    # The spec refuses such a host at validate; the backend checks again for contexts
    # built some other way (model_copy does not validate).
    hosts = {"hosts": ["-oProxyCommand=touch x", "b"]}
    bad = dataclasses.replace(good, hardware=good.hardware.model_copy(update=hosts))
    with pytest.raises(BackendError, match="is not a host name"):
        SshBackend().render(bad)


def test_remote_commands_quote_every_path():
    cmd = start_command("/runs/it's here", 1)
    assert "mkdir -p '/runs/it'\"'\"'s here'/logs" in cmd
    assert cmd.endswith("</dev/null >/dev/null 2>&1 & echo $!")
    node = Node("gpu-a", 42, "/runs/it's here", 1, SshSpec())
    # Only while pid 42 is still node 1's wrapper: a later `jobctl stop` may come after
    # the pid was reused.
    assert kill_command(node, 15).endswith(
        "if ps -ww -o args= -p 42 | grep -qF -- 'jobctl-node scripts/node-1.sh'; "
        "then kill -15 $(tree 42) 2>/dev/null || true; fi"
    )
    assert node.handle == "gpu-a:42@/runs/it%27s%20here"


server = service_fixture("server", sshd.start, sshd.SshdUnavailable, "no sshd here")


def _two_hosts(server, run_dir: Path, **kw):
    hardware = {"hosts": ["127.0.0.1", "localhost"], "ssh": server.ssh_options()}
    return context("ssh", hardware, run_dir=run_dir, nproc_per_node=[1, 1], **kw)


@pytest.mark.ssh
def test_nodes_run_on_their_hosts_and_report_exit_codes(server, tmp_path):
    backend = SshBackend(status_ttl_s=0)
    ctx = _two_hosts(server, tmp_path / "run")
    stub = Rendered("ssh", {"node-0.sh": "echo zero; exit 0\n", "node-1.sh": "echo one; exit 7\n"})
    handles = backend.submit(stub, ctx)
    assert [h.split(":")[0] for h in handles] == ["127.0.0.1", "localhost"]
    statuses = wait_done(backend, handles, WAIT_S)
    assert [(s.phase, s.exit_code) for s in statuses] == [("succeeded", 0), ("failed", 7)]
    assert backend.poll(handles) == [0, 7]
    assert (tmp_path / "run" / "spec.yaml").read_text() == ctx.inputs["spec.yaml"]
    fetched = {
        p.relative_to(tmp_path / "run" / "remote-logs").as_posix()
        for p in backend.logs(handles, tmp_path / "run")
    }
    assert {"0-127.0.0.1/node-0.log", "1-localhost/node-1.log"} <= fetched
    assert (tmp_path / "run" / "remote-logs" / "1-localhost" / "node-1.log").read_text() == "one\n"


def _start_sleepers(
    server, run_dir: Path, pids: Path, prelude: str = ""
) -> tuple[list[str], list[Path]]:
    """Two stub nodes, each a shell whose child sleeps in a session of its own (as
    torchrun's workers do) after printing a line; (handles, the children's pid files).
    ``prelude`` runs first in each (a trap, say)."""
    ctx = _two_hosts(server, run_dir)
    tree = 'echo "up $1"; setsid sleep 300 & echo $! > "$JOBCTL_PIDS"-$1; wait\n'
    script = f'JOBCTL_PIDS={pids}\nset -- "$(basename "$0")"\n{prelude}{tree}'
    stub = Rendered("ssh", {"node-0.sh": script, "node-1.sh": script})
    handles = SshBackend(status_ttl_s=0).submit(stub, ctx)
    pid_files = [pids.with_name(f"{pids.name}-node-{k}.sh") for k in (0, 1)]
    deadline = time.monotonic() + WAIT_S
    while not all(p.exists() and p.read_text().strip() for p in pid_files):
        assert time.monotonic() < deadline, "the stub nodes never started"
        time.sleep(0.2)
    return handles, pid_files


@pytest.mark.ssh
def test_cancel_kills_the_remote_tree_and_reads_as_stopped(server, tmp_path):
    # Like torchrun's workers, the grandchild starts its own session.
    handles, pid_files = _start_sleepers(server, tmp_path / "run", tmp_path / "pid")
    backend = SshBackend(status_ttl_s=0)
    backend.cancel(handles)
    statuses = wait_done(backend, handles, WAIT_S)
    assert [s.phase for s in statuses] == ["stopped", "stopped"]
    assert [s.cause for s in statuses] == ["cancelled", "cancelled"]
    for pid_file in pid_files:
        assert not _alive(int(pid_file.read_text())), "a process in its own session survived"


@pytest.mark.ssh
def test_release_tells_only_the_freed_nodes_script(server, tmp_path):
    # As node.sh does, the stub ends on SIGUSR1 with exit 0; the release must reach the
    # script itself (not its wrapper, not its children) on the freed node only.
    trap = "trap 'echo released; exit 0' USR1\n"
    handles, pid_files = _start_sleepers(server, tmp_path / "run", tmp_path / "pid", trap)
    backend = SshBackend(status_ttl_s=0)
    try:
        got = SshBackend(status_ttl_s=0).release(handles, [1])  # another process, as adopt
        assert got.handles == [1] and "localhost" in got.note
        deadline = time.monotonic() + WAIT_S
        while backend.status(handles)[1].phase == "running":
            assert time.monotonic() < deadline, "the released node never ended"
            time.sleep(0.2)
        assert [s.phase for s in backend.status(handles)] == ["running", "succeeded"]
        assert (tmp_path / "run" / "logs" / "node-1.log").read_text() == "up node-1.sh\nreleased\n"
    finally:
        backend.cancel(handles, signal.SIGKILL)
        for pid_file in pid_files:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.mark.ssh
def test_another_process_follows_fetches_logs_of_and_cancels_the_nodes(server, tmp_path):
    run_dir = tmp_path / "run"
    handles, pid_files = _start_sleepers(server, run_dir, tmp_path / "pid")
    later = SshBackend(status_ttl_s=0)  # nothing in memory: only the handles
    assert [s.phase for s in later.status(handles)] == ["running", "running"]
    fetched = {
        p.relative_to(run_dir / "remote-logs").as_posix(): p.read_text()
        for p in later.logs(handles, run_dir)
    }
    assert fetched["0-127.0.0.1/node-0.log"] == "up node-0.sh\n"
    assert fetched["1-localhost/node-1.log"] == "up node-1.sh\n"
    later.cancel(handles)
    assert [s.phase for s in wait_done(later, handles, WAIT_S)] == ["stopped", "stopped"]
    for pid_file in pid_files:
        assert not _alive(int(pid_file.read_text())), "a process in its own session survived"


@pytest.mark.ssh
def test_jobctl_stop_in_a_new_shell_stops_an_ssh_run(server, tmp_path):
    home = tmp_path / "home"
    run_dir = home / "runs" / "quick-1"
    handles, pid_files = _start_sleepers(server, run_dir, tmp_path / "pid")
    db = StateDB(home)
    db.create_run("quick-1", "quick", run_dir, backend="ssh", pids=",".join(handles))
    db.set_phase("quick-1", "launching")
    db.set_phase("quick-1", "training")
    out = subprocess.run(
        [sys.executable, "-m", "jobctl.engine.cli.app", "stop", "quick-1", "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "asked 2 node(s) of quick-1 to checkpoint and stop" in out.stdout
    statuses = wait_done(SshBackend(status_ttl_s=0), handles, WAIT_S)
    assert [s.phase for s in statuses] == ["stopped", "stopped"]
    for pid_file in pid_files:
        assert not _alive(int(pid_file.read_text())), "a process in its own session survived"


def test_a_handle_without_a_record_is_a_clear_error(tmp_path):
    with pytest.raises(BackendError, match="not an ssh handle"):
        SshBackend().cancel(["gpu-a:42"])
    with pytest.raises(BackendError, match="is not recorded in .*ssh-nodes.json"):
        SshBackend().status([f"gpu-a:42@{tmp_path}"])


@pytest.mark.ssh
def test_an_unreachable_host_reads_as_stopped(server, tmp_path):
    backend = SshBackend(status_ttl_s=0)
    ctx = _two_hosts(server, tmp_path / "run")
    stub = {"node-0.sh": "exit 0\n", "node-1.sh": "exit 0\n"}
    handles = backend.submit(Rendered("ssh", stub), ctx)
    node = backend._nodes[handles[1]]
    gone = node.opts.model_copy(update={"port": 1})  # nothing listens there: a lost host
    backend._nodes[handles[1]] = dataclasses.replace(node, opts=gone)
    statuses = wait_done(backend, handles, WAIT_S)
    assert [(s.phase, s.exit_code) for s in statuses] == [("succeeded", 0), ("stopped", -9)]
    assert statuses[1].detail.startswith("unreachable: ssh ")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.ssh
def test_metacharacters_in_paths_stay_inert_over_ssh(server, tmp_path):
    short = Path(tempfile.mkdtemp(prefix="jp", dir="/tmp"))  # the path must fit NAME_MAX
    marker = short / "p"
    evil = EVIL.format(m=marker)
    run_dir = tmp_path / evil.replace("/", "_")
    backend = SshBackend(status_ttl_s=0)
    ctx = _two_hosts(server, run_dir, env={"NOTE": evil})
    rendered = backend.render(ctx)
    # The agent's python prints its arguments instead of starting torchrun.
    echo = """-c 'import sys; print(" ".join(sys.argv[1:]))'"""
    stub = {
        k: v.replace("-m jobctl.engine.worker.agent", echo, 1) for k, v in rendered.files.items()
    }
    handles = backend.submit(Rendered("ssh", stub), ctx)
    assert [s.phase for s in wait_done(backend, handles, WAIT_S)] == ["succeeded", "succeeded"]
    assert "--rdzv-id=quick-1" in (run_dir / "logs" / "node-0.log").read_text()
    backend.logs(handles, run_dir)
    assert not marker.exists()
    assert sorted(os.listdir(tmp_path)) == [run_dir.name]
    shutil.rmtree(short)


@pytest.mark.multiproc
@pytest.mark.ssh
def test_jobctl_run_completes_over_ssh(server, tmp_path):
    spec = two_process_spec(
        "ssh", **{"hardware.hosts": ["127.0.0.1"], "hardware.ssh": server.ssh_options()}
    )
    run, outcome = run_on(spec, tmp_path / "home")
    assert outcome.ok, outcome.message
    row = StateDB(tmp_path / "home").get_run(run.id)
    assert (row["phase"], row["step"]) == ("completed", spec.training.steps)
    assert row["pids"].startswith("127.0.0.1:")
    logs = sorted(p.name for p in (run.dir / "logs").iterdir())
    assert logs == ["node-0.exit", "node-0.log", "rank-0.log", "rank-1.log"]


@pytest.mark.ssh
def test_jobctl_logs_shows_what_the_nodes_wrote_on_their_hosts(server, tmp_path):
    from typer.testing import CliRunner

    from jobctl.engine.cli.app import app

    home = tmp_path / "home"
    here = home / "runs" / "quick-1"  # the supervisor's run folder: no node writes there
    here.mkdir(parents=True)
    handles, _ = _start_sleepers(server, tmp_path / "on-the-hosts", tmp_path / "pid")
    try:
        db = StateDB(home)
        db.create_run("quick-1", "quick", here, backend="ssh", pids=",".join(handles))
        result = CliRunner().invoke(app, ["logs", "quick-1", "--home", str(home)])
    finally:
        SshBackend().cancel(handles, signal.SIGKILL)
    assert result.exit_code == 0, result.output
    assert "up node-0.sh" in result.output and "up node-1.sh" in result.output
