"""A private single-node Slurm cluster (munged + slurmctld + slurmd) for tests.

Everything lives in one temporary folder: its own munge key and socket, a generated
``slurm.conf`` on free ports, state, spool, pid and log files. Nothing under /etc is
touched, so several clusters (one per test session) can run on one machine side by
side. Clients find the cluster through ``SLURM_CONF``.

``python tests/slurm_cluster.py install`` installs Debian's ``slurm-wlm`` and ``munge``
(root, apt); ``python tests/slurm_cluster.py start`` starts a cluster and prints the
``SLURM_CONF`` to export (for trying jobctl by hand). With ``JOBCTL_KEEP_SLURM=DIR``
set, a stopped cluster's folder (slurmctld and slurmd logs, state) is copied under DIR
first, for a look at what Slurm did in a failed test.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from jobctl.engine.supervise.launch import free_port

PACKAGES = ["slurm-wlm", "munge"]
DAEMONS = ["munged", "slurmctld", "slurmd"]
START_TIMEOUT_S = 60.0
# A requeued job may start again only once its step credentials have expired
# (slurm.conf's AuthInfo cred_expire, 120 s by default): the requeue test waited that
# long for nothing. Credentials are checked as a step starts, seconds after they are
# made, so 20 s still leaves a loaded machine room.
CRED_EXPIRE_S = 20


class ClusterUnavailable(RuntimeError):
    """Slurm cannot run here; the message says why (tests skip with it)."""


@dataclass
class Cluster:
    """A running private cluster: its folder, config and daemon processes."""

    root: Path
    conf: Path
    procs: list[subprocess.Popen]

    @property
    def env(self) -> dict[str, str]:
        """Environment that points Slurm's client commands at this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def stop(self) -> None:
        """Cancel every job, stop the daemons this object started (slurmd first) and
        remove the folder. Job steps (slurmstepd) outlive slurmd, so jobs go first."""
        self._drain()
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        keep = os.environ.get("JOBCTL_KEEP_SLURM")
        if keep:
            shutil.copytree(
                self.root,
                Path(keep) / f"cluster-{os.getpid()}-{time.time():.0f}",
                ignore=shutil.ignore_patterns("*.socket", "*.sock", "munge*"),
            )
        shutil.rmtree(self.root, ignore_errors=True)

    def _drain(self, timeout: float = 30.0) -> None:
        if len(self.procs) < len(DAEMONS) or any(p.poll() is not None for p in self.procs):
            return
        env = {**os.environ, **self.env}
        user = f"--user={os.getuid()}"  # every job of this private cluster is ours
        subprocess.run(["scancel", "--full", user], env=env, capture_output=True, timeout=30)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = subprocess.run(
                [
                    "squeue",
                    "--noheader",
                    "--states=CONFIGURING,PENDING,RUNNING,COMPLETING,SUSPENDED",
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            if out.returncode or not out.stdout.strip():
                return
            time.sleep(0.5)


def install() -> None:
    """Install the Debian packages (needs root and apt)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, timeout=600)
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    subprocess.run(cmd, check=True, env=env, timeout=900)


def missing() -> str | None:
    """Why a cluster cannot start here, or None when it can."""
    absent = [d for d in DAEMONS + ["sbatch", "squeue"] if shutil.which(d) is None]
    if absent:
        return f"{', '.join(absent)} not installed (python tests/slurm_cluster.py install)"
    if os.geteuid() != 0:
        return "slurmd must run as root"
    return None


def start(timeout: float = START_TIMEOUT_S, nodes: int = 1) -> Cluster:
    """Start a private cluster and wait (bounded) until its nodes are idle.

    ``nodes`` > 1 runs that many slurmd daemons on this machine, each a Slurm node of its
    own (``n0``, ``n1``, ...; own port, spool and pid file), for multi-node jobs.
    """
    reason = missing()
    if reason:
        raise ClusterUnavailable(reason)
    # Short path: the munge socket path must fit in sockaddr_un (108 bytes).
    root = Path(tempfile.mkdtemp(prefix="jobctl-slurm-", dir="/tmp"))
    cluster = Cluster(root, root / "slurm.conf", [])
    try:
        _prepare(root, nodes)
        _start_daemons(cluster, nodes)
        _wait_idle(cluster, timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _prepare(root: Path, nodes: int = 1) -> None:
    for sub in ("state", "spool", "munge"):
        (root / sub).mkdir()
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    conf = slurm_conf(root, free_port(), free_port())
    if nodes > 1:
        conf = _multi_node(conf, root, nodes)
    (root / "slurm.conf").write_text(conf)


def slurm_conf(root: Path, ctld_port: int, slurmd_port: int) -> str:
    """A one-node slurm.conf for this machine, everything under ``root``."""
    host = socket.gethostname()
    cpus = os.cpu_count() or 1
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return f"""\
ClusterName=jobctl-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.sock,cred_expire={CRED_EXPIRE_S}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=600
KillWait=5
SchedulerParameters=sched_interval=2
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _multi_node(conf: str, root: Path, nodes: int) -> str:
    """``conf`` with ``nodes`` Slurm nodes on this machine instead of one."""
    per_node = ("NodeName=", "SlurmdPidFile=", "SlurmdSpoolDir=", "SlurmdLogFile=")
    lines = [x for x in conf.splitlines() if not x.startswith(per_node)]
    (node_line,) = [x for x in conf.splitlines() if x.startswith("NodeName=")]
    resources = node_line.split(" CPUs=", 1)[1]
    host = socket.gethostname()
    lines += [
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmdLogFile={root}/slurmd-%n.log",
    ]
    for k in range(nodes):
        lines.append(
            f"NodeName=n{k} NodeHostname={host} NodeAddr=127.0.0.1 "
            f"Port={free_port()} CPUs={resources}"
        )
    partition = next(i for i, x in enumerate(lines) if x.startswith("PartitionName="))
    lines.append(lines.pop(partition))  # after the nodes it names
    return "\n".join(lines) + "\n"


def _start_daemons(cluster: Cluster, nodes: int = 1) -> None:
    root, env = cluster.root, {**os.environ, **cluster.env}
    munge = root / "munge"
    commands = [
        [
            "munged",
            "--foreground",
            "--force",
            f"--socket={munge}/munge.sock",
            f"--key-file={munge}/munge.key",
            f"--pid-file={munge}/munged.pid",
            f"--log-file={munge}/munged.log",
            f"--seed-file={munge}/munged.seed",
        ],
        ["slurmctld", "-D", "-i", "-f", str(cluster.conf)],
    ]
    commands += (
        [["slurmd", "-D", "-f", str(cluster.conf)]]
        if nodes == 1
        else [["slurmd", "-D", "-N", f"n{k}", "-f", str(cluster.conf)] for k in range(nodes)]
    )
    for cmd in commands:
        name = cmd[0] + (f"-{cmd[3]}" if "-N" in cmd else "")
        log = open(root / f"{name}.out", "wb")  # noqa: SIM115 - handed to the daemon
        cluster.procs.append(
            subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        log.close()
        if cmd[0] == "munged":
            _wait_for(lambda: (munge / "munge.sock").exists(), 10.0, "munged socket", cluster)


def _wait_idle(cluster: Cluster, timeout: float) -> None:
    env = {**os.environ, **cluster.env}

    def idle() -> bool:
        out = subprocess.run(
            ["sinfo", "--noheader", "--format=%t"],
            capture_output=True,
            text=True,
            env=env,
            timeout=10,
        )
        return out.returncode == 0 and set(out.stdout.split()) == {"idle"}

    _wait_for(idle, timeout, "an idle Slurm node", cluster)


def _wait_for(check, timeout: float, what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [p for p in cluster.procs if p.poll() is not None]
        if dead:
            raise ClusterUnavailable(f"{dead[0].args[0]} exited: {_log_tail(cluster)}")
        if check():
            return
        time.sleep(0.5)
    raise ClusterUnavailable(f"no {what} after {timeout:.0f} s: {_log_tail(cluster)}")


def _log_tail(cluster: Cluster) -> str:
    lines = []
    for log in sorted(cluster.root.glob("*.out")) + sorted(cluster.root.glob("*.log")):
        lines += [f"{log.name}: {x}" for x in log.read_text(errors="replace").splitlines()[-5:]]
    return "\n".join(lines[-20:])


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        install()
    elif sys.argv[1:] == ["start"]:
        c = start()
        print(f"export SLURM_CONF={c.conf}  # daemons: {[p.pid for p in c.procs]}")
    else:
        sys.exit("usage: python tests/slurm_cluster.py install|start")
