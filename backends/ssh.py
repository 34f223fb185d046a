"""ssh backend: the per-node launch script, copied to each of hardware.hosts and run there.

Node ``k`` runs on ``hardware.hosts[k]``. Submitting copies the run's inputs
(``spec.yaml``, ``plan.json``) and ``scripts/node-<k>.sh`` into the same run-folder
path on the host (a tar stream over ssh), then starts the script detached in its own
session and prints its pid. The node's output goes to ``logs/node-<k>.log`` there and
its exit code to ``logs/node-<k>.exit``. Cancel signals the whole remote process tree
(torchrun's workers start their own sessions, so the session alone is not enough).

Metrics and checkpoints reach the supervisor when the run folder is on a shared file
system; ``logs`` copies each host's ``logs/`` back into ``remote-logs/<k>-<host>/``.
Handles are ``host:pid@run-folder`` (the folder percent-encoded): what any later process
(``jobctl stop``, ``jobctl logs``, a supervisor adopting the run) needs to reach a node,
its ssh settings and its node number, is in ``ssh-nodes.json`` in that folder, written
at submit. Connections are multiplexed (one ssh handshake per host per minute, not per
poll).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import signal
import stat
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote, unquote

from jobctl.engine.core.env import CHANNEL_SECRET
from jobctl.spec.sections import SshSpec, is_loopback

from .base import BackendError, NodeStatus, Released, Rendered, RunContext
from .nodes import node_scripts
from .remote import RemoteBackend, run_bytes, run_command
from .rendezvous import require_reachable

RECORD = "ssh-nodes.json"  # in the run folder: how to reach each node, by handle
SECRET_FILE = "channel.secret"  # exists only between unpacking and starting the node

# Runs detached on the host: the node script's exit code lands in a file nobody has to
# wait for. "$1".. are the script, log and exit-file paths (never spliced into code).
_WRAPPER = 'bash "$1" >> "$2" 2>&1; echo $? > "$3"'

# A pid and all its descendants, parents first (a parent signalled after its child could
# see the child end and exit 0 in between); torchrun's workers are children of the agent
# even though they run in their own sessions.
_TREE = 'tree() { echo "$1"; for c in $(pgrep -P "$1"); do tree "$c"; done; }; '

# A zombie still answers `kill -0`, so ask ps for the state letter instead.
_PROBE = (
    'if [ -e "$2" ]; then echo "exit $(cat "$2")"; '
    'elif ps -o stat= -p "$1" | grep -qv "^Z"; then echo running; '
    'elif [ -e "$2" ]; then echo "exit $(cat "$2")"; else echo gone; fi'
)


@dataclass(frozen=True)
class Node:
    """One started node: where it runs and the files that tell its fate."""

    host: str
    pid: int
    run_dir: str
    node: int
    opts: SshSpec

    @property
    def exit_file(self) -> str:
        return f"{self.run_dir}/logs/node-{self.node}.exit"

    @property
    def handle(self) -> str:
        return f"{self.host}:{self.pid}@{quote(self.run_dir, safe='/')}"

    def record(self) -> dict:
        return {**asdict(self), "opts": self.opts.model_dump(mode="json")}


class SshBackend(RemoteBackend):
    """Runs node ``k``'s launch script on ``hardware.hosts[k]`` over ssh."""

    name = "ssh"

    def __init__(self, status_ttl_s: float = 1.0) -> None:
        super().__init__(status_ttl_s)
        self._control = control_dir()
        self._nodes: dict[str, Node] = {}

    def render(self, ctx: RunContext) -> Rendered:
        """``node-<k>.sh`` per host, as the local backend renders it."""
        remote = [h for h in hosts_of(ctx) if not is_loopback(h)]
        if remote:
            require_reachable(ctx, self.name, f"the remote host(s) {', '.join(remote)}")
        return Rendered(self.name, node_scripts(ctx, python=ctx.hardware.ssh.python))

    def submit(self, rendered: Rendered, ctx: RunContext) -> list[str]:
        """Copy each node's files to its host and start its script; returns the handles.
        A node that does not start takes down the ones started before it."""
        rendered.write(ctx.run_dir / "scripts")
        started: list[Node] = []
        try:
            for k, host in enumerate(hosts_of(ctx)):
                started.append(self._start(rendered, ctx, k, host))
        except BackendError:
            with contextlib.suppress(BackendError):  # the first error is the one to report
                self.cancel([n.handle for n in started], signal.SIGKILL)
            raise
        finally:
            save_records(ctx.run_dir, started)
        self._cache.clear()
        return [n.handle for n in started]

    def _start(self, rendered: Rendered, ctx: RunContext, k: int, host: str) -> Node:
        opts, name = ctx.hardware.ssh, f"node-{k}.sh"
        bundle = _bundle(ctx.inputs, f"scripts/{name}", rendered.files[name], ctx.secret_env)
        out = run_command(self._ssh(opts, host, start_command(str(ctx.run_dir), k)), stdin=bundle)
        pid = out.strip().splitlines()[-1] if out.strip() else ""
        if not pid.isdigit():
            raise BackendError(f"{host}: node {k} did not start (printed {out!r})")
        node = Node(host, int(pid), str(ctx.run_dir), k, opts)
        self._nodes[node.handle] = node
        return node

    def status(self, handles: list[str]) -> list[NodeStatus]:
        """Each node's state, probed over ssh (at most once per ``status_ttl_s``)."""
        return self._cache.get(handles, lambda: [self._probe(h) for h in handles])

    def _probe(self, handle: str) -> NodeStatus:
        node = self._node(handle)
        try:
            out = run_command(self._ssh(node.opts, node.host, probe_command(node)), timeout=30)
        except BackendError as e:  # the host is gone (a preempted machine, say)
            return NodeStatus("stopped", -signal.SIGKILL, f"unreachable: {e}")
        answer = out.strip()
        if answer == "running":
            return NodeStatus("running")
        if answer.startswith("exit ") and answer[5:].strip().lstrip("-").isdigit():
            return self._ended(handle, int(answer[5:]), answer)
        return self._ended(handle, None, f"the node's process is gone, no exit code ({answer})")

    def cancel(self, handles: list[str], sig: int = signal.SIGTERM) -> None:
        """Signal every process of each node's remote tree."""
        for handle in handles:
            node = self._node(handle)
            self._cancelled.add(handle)
            run_command(self._ssh(node.opts, node.host, kill_command(node, sig)), timeout=30)
        self._cache.clear()

    def release(self, handles: list[str], nodes: list[int]) -> Released:
        """Tell each freed node's script (SIGUSR1) to end its agent and exit 0; the host
        is then free for other work."""
        hosts = []
        for k in nodes:
            node = self._node(handles[k])
            run_command(self._ssh(node.opts, node.host, release_command(node)), timeout=30)
            hosts.append(node.host)
        self._cache.clear()
        return Released(list(nodes), f"node(s) {nodes} on {', '.join(hosts)} were told to end")

    def logs(self, handles: list[str], run_dir: Path) -> list[Path]:
        """Copy each host's ``logs/`` into ``remote-logs/<k>-<host>/``; returns the files."""
        paths = []
        for handle in handles:
            node = self._node(handle)
            cmd = f"tar -c -f - -C {shlex.quote(node.run_dir + '/logs')} ."
            data = run_bytes(self._ssh(node.opts, node.host, cmd))
            dest = run_dir / "remote-logs" / f"{node.node}-{_safe(node.host)}"
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(dest, filter="data")
            paths += sorted(p for p in dest.rglob("*") if p.is_file())
        return paths

    def _ssh(self, opts: SshSpec, host: str, command: str) -> list[str]:
        return ssh_argv(opts, host, command, self._control)

    def _node(self, handle: str) -> Node:
        """The node behind ``handle``: remembered, or read from its run folder's record
        (a node started by another process)."""
        if handle not in self._nodes:
            self._nodes[handle] = load_record(handle)
        return self._nodes[handle]


def save_records(run_dir: Path, nodes: list[Node]) -> None:
    """Add ``nodes`` to the run folder's record (atomically: a reader never sees half)."""
    path = run_dir / RECORD
    records = json.loads(path.read_text()) if path.exists() else {}
    records.update({n.handle: n.record() for n in nodes})
    tmp = path.with_name(f".{RECORD}.tmp")
    tmp.write_text(json.dumps(records, indent=2) + "\n")
    tmp.replace(path)


def load_record(handle: str) -> Node:
    """The node of ``handle`` as ``save_records`` wrote it."""
    _, sep, folder = handle.rpartition("@")
    if not sep:
        raise BackendError(f"{handle!r} is not an ssh handle (host:pid@run-folder)")
    path = Path(unquote(folder)) / RECORD
    try:
        fields = json.loads(path.read_text())[handle]
    except (OSError, ValueError, KeyError) as e:
        raise BackendError(
            f"ssh node {handle!r}: how to reach it is not recorded in {path} ({e!r}); "
            "jobctl writes it when it starts the node"
        ) from None
    return Node(**{**fields, "opts": SshSpec.model_validate(fields["opts"])})


def hosts_of(ctx: RunContext) -> list[str]:
    """The host of each node (the first ``nnodes`` of hardware.hosts); refuses names
    ssh would read as options."""
    hosts = ctx.hardware.hosts[: ctx.nnodes]  # a plan may use fewer nodes than the pool
    if len(hosts) < ctx.nnodes:
        raise BackendError(
            f"the ssh backend needs hardware.hosts with one host per node: "
            f"{len(hosts)} host(s) for {ctx.nnodes} node(s)"
        )
    for host in hosts:
        if host.startswith("-") or not host.isprintable() or any(c.isspace() for c in host):
            raise BackendError(f"{host!r} is not a host name")
    return list(hosts)


def control_dir() -> Path | None:
    """This user's private folder for ssh's shared connections; None (no sharing) when
    the folder is not a directory owned by this user and closed to everyone else."""
    path = Path(tempfile.gettempdir()) / f"jobctl-ssh-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    private = stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
    return path if private and info.st_uid == os.getuid() else None


def ssh_argv(opts: SshSpec, host: str, command: str, control: Path | None = None) -> list[str]:
    """ssh reaching ``host`` non-interactively and running ``command`` there, sharing
    one connection per host through sockets in ``control`` when given."""
    argv = [
        "ssh",
        "-p",
        str(opts.port),
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={opts.connect_timeout_s}",
        "-o",
        f"StrictHostKeyChecking={opts.strict_host_key_checking}",
    ]
    if opts.identity_file:
        argv += ["-i", opts.identity_file, "-o", "IdentitiesOnly=yes"]
    if opts.known_hosts_file:
        argv += ["-o", f"UserKnownHostsFile={opts.known_hosts_file}"]
    if opts.user:
        argv += ["-l", opts.user]
    if control is not None:
        argv += [
            "-o",
            "ControlMaster=auto",
            "-o",
            "ControlPersist=60",
            "-o",
            f"ControlPath={control}/%C",
        ]
    return [*argv, "--", host, command]


def start_command(run_dir: str, node: int) -> str:
    """Remote shell command: unpack stdin into the run folder, start node ``node``
    detached in its own session, print its pid."""
    q = shlex.quote
    script, log, exit_file = (
        f"scripts/node-{node}.sh",
        f"logs/node-{node}.log",
        f"logs/node-{node}.exit",
    )
    return (
        f"set -e; mkdir -p {q(run_dir)}/logs {q(run_dir)}/scripts; "
        f"tar -x -f - -C {q(run_dir)}; cd {q(run_dir)}; rm -f {exit_file}; "
        f"if [ -f {SECRET_FILE} ]; then {CHANNEL_SECRET}=$(cat {SECRET_FILE}); "
        f"export {CHANNEL_SECRET}; rm -f {SECRET_FILE}; fi; "
        f"setsid bash -c {q(_WRAPPER)} jobctl-node {script} {log} {exit_file} "
        "</dev/null >/dev/null 2>&1 & echo $!"
    )


def probe_command(node: Node) -> str:
    """Remote shell command printing ``running``, ``exit <code>`` or ``gone``."""
    return f"sh -c {shlex.quote(_PROBE)} jobctl-probe {node.pid} {shlex.quote(node.exit_file)}"


def kill_command(node: Node, sig: int) -> str:
    """Remote shell command sending ``sig`` to the node's process and all its
    descendants, if that pid is still the node's (a pid is reused once it ends)."""
    return _if_still_node(node, f"kill -{int(sig)} $(tree {int(node.pid)})", _TREE)


def release_command(node: Node) -> str:
    """Remote shell command sending SIGUSR1 to the node's script alone (the child of
    the ``jobctl-node`` wrapper whose pid is the handle's), if that pid is still the node's."""
    return _if_still_node(node, f"kill -USR1 $(pgrep -P {int(node.pid)})")


def _if_still_node(node: Node, action: str, prelude: str = "") -> str:
    """``action`` (errors ignored), only while the handle's pid still runs this node's
    wrapper: a pid is reused once it ends."""
    pid, mark = int(node.pid), shlex.quote(f"jobctl-node scripts/node-{node.node}.sh")
    return (
        f"{prelude}if ps -ww -o args= -p {pid} | grep -qF -- {mark}; "
        f"then {action} 2>/dev/null || true; fi"
    )


def _bundle(
    inputs: dict[str, str], script_name: str, script: str, secrets: dict[str, str] | None = None
) -> bytes:
    """A tar of the run inputs and one node script (executable); the channel secret, if
    any, as a 0600 file that ``start_command`` reads into the environment and deletes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in [*sorted(inputs.items()), (script_name, script)]:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
        secret = (secrets or {}).get(CHANNEL_SECRET)
        if secret:
            info = tarfile.TarInfo(SECRET_FILE)
            info.size, info.mode = len(secret.encode()), 0o600
            tar.addfile(info, io.BytesIO(secret.encode()))
    return buf.getvalue()


def _safe(host: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in host)
