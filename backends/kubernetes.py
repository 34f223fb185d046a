"""Kubernetes backend: a PyTorchJob, JobSet or Kubeflow Trainer v2 TrainJob applied and
watched through ``kubectl``.

Rendering needs no cluster (``manifests.yaml``, with ``channel-secret.sh`` when the pods
post events, is the whole dry run). Submitting needs ``kubectl`` with a current context;
the handle is ``<namespace>/<kind>/<name>``.
Status reads the workload's conditions; cancel deletes every object of the run (by its
``jobctl.dev/run`` label); logs are the pods' output, fetched with ``kubectl logs``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from jobctl.engine.core.env import CHANNEL_SECRET

from .base import STOPPED_EXIT, BackendError, NodeStatus, Released, Rendered, RunContext
from .k8s_manifests import (
    RUN_LABEL,
    channel_secret_script,
    dump,
    has_channel,
    k8s_name,
    manifests,
    options,
)
from .remote import RemoteBackend, run_command

RESOURCES = {
    "pytorchjob": "pytorchjobs.kubeflow.org",
    "jobset": "jobsets.jobset.x-k8s.io",
    "trainjob": "trainjobs.trainer.kubeflow.org",
}
OWNED = "configmaps,services,endpointslices.discovery.k8s.io,secrets"
# Objects a workload kind brings beside the workload (deleted with it, by label).
EXTRA = {"trainjob": ",clustertrainingruntimes.trainer.kubeflow.org"}
SECRET_SCRIPT = "channel-secret.sh"


class KubernetesBackend(RemoteBackend):
    """Submits a run as one Kubernetes workload."""

    name = "kubernetes"

    def render(self, ctx: RunContext) -> Rendered:
        """``manifests.yaml`` (ConfigMap, rendezvous Service, the workload) and, when the
        pods post to the event channel, ``channel-secret.sh`` creating its Secret."""
        files = {"manifests.yaml": dump(manifests(ctx))}
        if has_channel(ctx):
            files[SECRET_SCRIPT] = channel_secret_script(ctx)
        return Rendered(self.name, files)

    def submit(self, rendered: Rendered, ctx: RunContext) -> list[str]:
        """Create the channel Secret, ``kubectl apply`` the manifests; returns
        ``namespace/kind/name``."""
        if not ctx.inputs:
            raise BackendError("kubernetes pods need the run inputs (spec.yaml, plan.json)")
        require_context()
        folder = ctx.run_dir / "scripts"
        rendered.write(folder)
        if SECRET_SCRIPT in rendered.files:
            secret = ctx.secret_env.get(CHANNEL_SECRET)
            if not secret:
                raise BackendError(
                    f"the pods need the run's channel secret, but {CHANNEL_SECRET} "
                    "was not handed to the backend"
                )
            env = {**os.environ, CHANNEL_SECRET: secret}
            run_command(["bash", str(folder / SECRET_SCRIPT)], env=env)
        run_command(["kubectl", "apply", "-f", str(folder / "manifests.yaml")])
        opts = options(ctx)
        self._cache.clear()
        return [f"{opts.namespace}/{opts.kind}/{k8s_name(ctx.run_id)}"]

    def status(self, handles: list[str]) -> list[NodeStatus]:
        return self._cache.get(handles, lambda: [self._status(h) for h in handles])

    def _status(self, handle: str) -> NodeStatus:
        namespace, kind, name = split_handle(handle)
        argv = [
            "kubectl",
            "get",
            RESOURCES[kind],
            name,
            "-n",
            namespace,
            "-o",
            "json",
            "--ignore-not-found",
        ]
        out = run_command(argv, timeout=30)
        if not out.strip():
            return self._ended(handle, None, f"{kind} {name} no longer exists")
        return workload_status(json.loads(out))

    def cancel(self, handles: list[str], sig: int = signal.SIGTERM) -> None:
        """Delete each run's objects: pods get TERM (KILL: no grace period)."""
        if sig not in (signal.SIGTERM, signal.SIGKILL):
            raise BackendError(f"kubernetes can only stop pods (TERM or KILL), not signal {sig}")
        for handle in handles:
            namespace, kind, name = split_handle(handle)
            owned = f"{RESOURCES[kind]},{OWNED}{EXTRA.get(kind, '')}"
            argv = [
                "kubectl",
                "delete",
                owned,
                "-n",
                namespace,
                "-l",
                f"{RUN_LABEL}={name}",
                "--wait=false",
            ]
            if sig == signal.SIGKILL:
                argv += ["--grace-period=0", "--force"]
            run_command(argv)
            self._cancelled.add(handle)
        self._cache.clear()

    def release(self, handles: list[str], nodes: list[int]) -> Released:
        """Pods stay until the run ends: an elastic PyTorchJob counts a worker that exits
        0 as the whole job's success, and scaling its replicas down removes pods by
        index, not the nodes packing freed."""
        return Released([], f"Kubernetes keeps the pods of node(s) {nodes} until the run ends")

    def logs(self, handles: list[str], run_dir: Path) -> list[Path]:
        """Every pod's output, prefixed with its name, in ``remote-logs/<name>.log``."""
        paths = []
        for handle in handles:
            namespace, _, name = split_handle(handle)
            argv = [
                "kubectl",
                "logs",
                "-n",
                namespace,
                "-l",
                f"{RUN_LABEL}={name}",
                "--all-containers",
                "--prefix",
                "--max-log-requests=64",
            ]
            path = run_dir / "remote-logs" / f"{name}.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(run_command(argv, timeout=120))
            paths.append(path)
        return paths


def require_context() -> None:
    """Fail clearly unless kubectl exists and points at a cluster."""
    try:
        run_command(["kubectl", "config", "current-context"], timeout=15)
    except BackendError as e:
        raise BackendError(
            f"no Kubernetes cluster configured for kubectl ({e}); set one with "
            "`kubectl config use-context <name>` or KUBECONFIG"
        ) from None


def split_handle(handle: str) -> tuple[str, str, str]:
    namespace, kind, name = handle.split("/")
    if kind not in RESOURCES:
        raise BackendError(f"{handle!r} is not a kubernetes handle")
    return namespace, kind, name


def workload_status(obj: dict) -> NodeStatus:
    """A PyTorchJob's, JobSet's or TrainJob's conditions in jobctl's terms. A TrainJob
    has no Running condition: it runs while one of its Jobs is active."""
    status = obj.get("status") or {}
    true = [c["type"] for c in status.get("conditions") or [] if c.get("status") == "True"]
    if {"Succeeded", "Completed", "Complete"} & set(true):  # Complete: TrainJob
        return NodeStatus("succeeded", 0, "Succeeded")
    if "Failed" in true:
        return NodeStatus("failed", 1, "Failed")
    if "Suspended" in true:
        return NodeStatus("stopped", STOPPED_EXIT, "Suspended")
    if "Running" in true or any(j.get("active") for j in status.get("jobsStatus") or []):
        return NodeStatus("running", None, "Running")
    return NodeStatus("pending", None, true[-1] if true else "Created")
