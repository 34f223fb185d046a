"""kill_tree signals only the trees jobctl started (session leaders): a stale pid
recorded in the state DB must never take down pid 1, this process's own ancestry or
an unrelated process that reused the pid (a test's `jobctl stop` of a run recorded
with pids "1,2" once killed the whole container)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from jobctl.engine.core.process import _own_session_leader, kill_tree

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_session_leader_and_its_children_are_killed():
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "time.sleep(60)",
        ],
        start_new_session=True,
    )
    time.sleep(0.5)
    kill_tree(leader.pid, signal.SIGKILL)
    assert leader.wait(timeout=10) == -signal.SIGKILL


def test_a_process_in_another_session_is_left_alone():
    plain = subprocess.Popen(SLEEP)  # in this session: not a tree jobctl started
    try:
        kill_tree(plain.pid, signal.SIGKILL)
        time.sleep(0.2)
        assert plain.poll() is None
    finally:
        plain.kill()
        plain.wait()


def test_init_and_this_process_are_never_signalled():
    assert not _own_session_leader(1)
    assert not _own_session_leader(0)
    assert not _own_session_leader(os.getpid())
    assert not _own_session_leader(os.getppid())
