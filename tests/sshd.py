"""A private OpenSSH server on 127.0.0.1 for tests of the ssh backend.

The server runs as root from its own folder: a fresh host key, a fresh client key in
``authorized_keys``, its own ``sshd_config`` on a free port. Nothing under /etc/ssh
or ~/.ssh is read or written. Debian's ``openssh-server`` provides ``sshd``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from jobctl.backends.ssh import control_dir
from jobctl.engine.supervise.launch import free_port

START_TIMEOUT_S = 20.0


class SshdUnavailable(RuntimeError):
    """sshd cannot run here; the message says why (tests skip with it)."""


@dataclass
class Sshd:
    """A running server and what a client needs to reach it."""

    root: Path
    port: int
    key: Path
    known_hosts: Path
    proc: subprocess.Popen

    def ssh_options(self) -> dict:
        """``hardware.ssh`` settings that reach this server."""
        return {
            "port": self.port,
            "identity_file": str(self.key),
            "known_hosts_file": str(self.known_hosts),
            "connect_timeout_s": 5,
        }

    def stop(self, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> None:
        """Close the backend's shared connections (their sessions outlive the listening
        sshd), stop the server and remove its folder."""
        control = control_dir()
        for host in hosts if control else ():
            subprocess.run(
                [
                    "ssh",
                    "-p",
                    str(self.port),
                    "-o",
                    f"ControlPath={control}/%C",
                    "-O",
                    "exit",
                    host,
                ],
                capture_output=True,
                timeout=15,
            )
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        shutil.rmtree(self.root, ignore_errors=True)


def missing() -> str | None:
    """Why sshd cannot start here, or None when it can."""
    absent = [b for b in ("sshd", "ssh", "ssh-keygen") if shutil.which(b) is None]
    if absent:
        return f"{', '.join(absent)} not installed (apt-get install openssh-server)"
    if os.geteuid() != 0:
        return "sshd needs root to switch to the logged-in user"
    return None


def start(timeout: float = START_TIMEOUT_S) -> Sshd:
    """Start sshd on a free port and wait (bounded) until a login works."""
    reason = missing()
    if reason:
        raise SshdUnavailable(reason)
    root = Path(tempfile.mkdtemp(prefix="jobctl-sshd-"))
    for name in ("host_key", "client_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)],
            check=True,
            timeout=30,
        )
    shutil.copy(root / "client_key.pub", root / "authorized_keys")
    port = free_port()
    (root / "sshd_config").write_text(_config(root, port))
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
    log = open(root / "sshd.log", "wb")  # noqa: SIM115 - handed to the daemon
    proc = subprocess.Popen(
        [shutil.which("sshd") or "sshd", "-D", "-e", "-f", str(root / "sshd_config")],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    server = Sshd(root, port, root / "client_key", root / "known_hosts", proc)
    try:
        _wait_for_login(server, timeout)
    except BaseException:
        server.stop()
        raise
    return server


def _config(root: Path, port: int) -> str:
    return f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {root}/host_key
PidFile {root}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
LogLevel ERROR
"""


def _wait_for_login(server: Sshd, timeout: float) -> None:
    argv = [
        "ssh",
        "-p",
        str(server.port),
        "-i",
        str(server.key),
        "-o",
        "BatchMode=yes",
        "-o",
        f"UserKnownHostsFile={server.known_hosts}",
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-o",
        "ConnectTimeout=5",
        "127.0.0.1",
        "true",
    ]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise SshdUnavailable(f"sshd exited: {_tail(server)}")
        if subprocess.run(argv, capture_output=True, timeout=15).returncode == 0:
            return
        time.sleep(0.3)
    raise SshdUnavailable(f"no ssh login after {timeout:.0f} s: {_tail(server)}")


def _tail(server: Sshd) -> str:
    return (server.root / "sshd.log").read_text(errors="replace")[-2000:]
