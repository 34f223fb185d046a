"""Kubernetes manifests of one run, built as data and dumped as YAML.

Objects: a ConfigMap with the run's inputs and the pod script; a selector-less Service
(plus its EndpointSlice, or an ExternalName Service for a host name) through which the
pods reach the c10d rendezvous the supervisor hosts; and the workload: a Kubeflow
``PyTorchJob`` (training operator v1) with an ``elasticPolicy``, a ``JobSet`` of one
indexed Job, or a Kubeflow Trainer v2 ``TrainJob`` with the ``ClusterTrainingRuntime``
it runs (the same indexed Job, as the Trainer's "node" step).
Manifests are dicts dumped by PyYAML, so no value is ever spliced into YAML text;
secrets appear by name only: the user's through ``envFrom.secretRef``, the run's event
channel secret through a ``secretKeyRef`` to ``<name>-channel``, a Secret that
``channel-secret.sh`` creates from the submitting process's environment.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import re

import yaml

from jobctl.engine.core.env import CHANNEL_SECRET, CHANNEL_URL, RUN_DIR
from jobctl.spec.sections import KubernetesSpec
from jobctl.templates import render

from .base import BackendError, RunContext
from .nodes import node_env
from .rendezvous import require_reachable

INPUTS_DIR = "/etc/jobctl"
RUN_ROOT = "/jobctl"
RUN_LABEL = "jobctl.dev/run"
PORT_NAME = "c10d"
SECRET_KEY = "secret"  # the key of the channel secret in its Secret
TRAINER_GROUP = "trainer.kubeflow.org"
# The Trainer's trainer step: the replicated Job and container named "node", the Job
# template labelled as its ancestor step (kubeflow/trainer pkg/constants).
TRAINER_STEP = {f"{TRAINER_GROUP}/trainjob-ancestor-step": "trainer"}


def k8s_name(run_id: str, limit: int = 40) -> str:
    """The run id as a DNS-1035 label short enough for the operators' suffixes
    (``-worker-0``, ``-node-0-0``); long ids keep a hash of the whole id."""
    name = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"j-{name}".rstrip("-")
    if len(name) > limit:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
        name = f"{name[: limit - 9].rstrip('-')}-{digest}"
    return name


def options(ctx: RunContext) -> KubernetesSpec:
    """The spec's kubernetes section; the backend cannot guess an image."""
    if ctx.hardware.kubernetes is None:
        raise BackendError(
            "the kubernetes backend needs hardware.kubernetes with at least `image` "
            "(a container image with torch and jobctl installed)"
        )
    return ctx.hardware.kubernetes


def manifests(ctx: RunContext) -> list[dict]:
    """Every object of the run, in the order ``kubectl apply`` should create them."""
    opts, name = options(ctx), k8s_name(ctx.run_id)
    nnodes = replica_range(ctx) if opts.kind == "pytorchjob" else (ctx.nnodes, ctx.nnodes)
    script = pod_script(ctx, nnodes, name)
    workload = WORKLOADS[opts.kind](ctx, opts, name)
    return [config_map(ctx, opts, name, script), *rendezvous(ctx, opts, name), *workload]


def dump(docs: list[dict]) -> str:
    """Multi-document YAML that Go's YAML 1.1 reader (kubectl) reads back unchanged."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


class _Dumper(yaml.SafeDumper):
    """Writes files (multi-line strings) as literal blocks, and quotes the YAML 1.1
    booleans PyYAML leaves bare (y, n) but kubectl's reader would take as booleans."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else '"' if value in {"y", "Y", "n", "N"} else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def replica_range(ctx: RunContext) -> tuple[int, int]:
    """(min, max) pods: the plan's nodes, or the elasticity bounds in whole nodes."""
    el, per_node = ctx.elasticity, max(ctx.nproc_per_node)
    if not el.enabled:
        return ctx.nnodes, ctx.nnodes
    most = math.ceil(el.max_devices / per_node) if el.max_devices else ctx.hardware.nodes
    least = min(math.ceil(el.min_devices / per_node), most)
    return least, max(most, least)


def pod_script(ctx: RunContext, nnodes: tuple[int, int], name: str) -> str:
    """The script every pod runs: copy the inputs into the run folder, exec torchrun."""
    if len(set(ctx.nproc_per_node)) != 1:
        raise BackendError(
            f"kubernetes pods are identical, but the plan puts {ctx.nproc_per_node} "
            "processes on its nodes; use a plan with the same count on every node"
        )
    low, high = nnodes
    run_dir = f"{RUN_ROOT}/{ctx.run_id}"
    return render(
        "pod.sh.j2",
        run_id=ctx.run_id,
        nnodes=str(low) if low == high else f"{low}:{high}",
        nproc=ctx.nproc_per_node[0],
        rdzv_endpoint=f"{name}-rdzv:{ctx.rdzv_port}",
        python="python",
        max_restarts=ctx.max_restarts,
        env={**node_env(ctx), RUN_DIR: run_dir},
        inputs=sorted(ctx.inputs),
        inputs_dir=INPUTS_DIR,
    )


def has_channel(ctx: RunContext) -> bool:
    """Whether the pods post their events to the supervisor's channel (with its secret)."""
    return CHANNEL_URL in ctx.env


def channel_secret_ref(name: str) -> dict:
    """Where the pods read the channel secret: a key of the run's own Secret."""
    return {"name": f"{name}-channel", "key": SECRET_KEY}


def channel_secret_script(ctx: RunContext) -> str:
    """``channel-secret.sh``: creates the Secret behind ``channel_secret_ref`` from the
    JOBCTL_CHANNEL_SECRET of the shell that runs it; the value is in no artifact."""
    opts, name = options(ctx), k8s_name(ctx.run_id)
    ref = channel_secret_ref(name)
    return render(
        "k8s-secret.sh.j2",
        run_id=ctx.run_id,
        secret_env=CHANNEL_SECRET,
        secret=ref["name"],
        key=ref["key"],
        namespace=opts.namespace,
        labels=[f"{k}={v}" for k, v in _meta(ref["name"], opts, name)["labels"].items()],
    )


def _meta(name: str, opts: KubernetesSpec, run: str) -> dict:
    labels = {"app.kubernetes.io/managed-by": "jobctl", RUN_LABEL: run}
    return {"name": name, "namespace": opts.namespace, "labels": labels}


def config_map(ctx: RunContext, opts: KubernetesSpec, name: str, script: str) -> dict:
    data = {**dict(sorted(ctx.inputs.items())), "pod.sh": script}
    meta = _meta(f"{name}-inputs", opts, name)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def rendezvous(ctx: RunContext, opts: KubernetesSpec, name: str) -> list[dict]:
    """A Service named ``<name>-rdzv`` in front of the supervisor's c10d store."""
    host, port = ctx.rdzv_host, ctx.rdzv_port
    require_reachable(ctx, "kubernetes", "the pods")
    meta = _meta(f"{name}-rdzv", opts, name)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:  # a DNS name: the Service is an alias for it
        spec = {"type": "ExternalName", "externalName": host, "ports": [_port(port)]}
        return [{"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {"ports": [{**_port(port), "targetPort": port}]},
    }
    slice_meta = _meta(f"{name}-rdzv", opts, name)
    slice_meta["labels"]["kubernetes.io/service-name"] = f"{name}-rdzv"
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": slice_meta,
        "addressType": f"IPv{ip.version}",
        "ports": [_port(port)],
        "endpoints": [{"addresses": [str(ip)]}],
    }
    return [service, endpoints]


def _port(port: int) -> dict:
    return {"name": PORT_NAME, "protocol": "TCP", "port": port}


def _container(ctx: RunContext, opts: KubernetesSpec, name: str, container_name: str) -> dict:
    """The node's container: its script, its resources (the node's processes), mounts."""
    nproc, hw = ctx.nproc_per_node[0], ctx.hardware
    memory = f"{math.ceil(hw.memory_gb * 1024 * nproc)}Mi"
    limits = {"memory": memory}
    if hw.device == "cuda":  # quantities as strings, as the core OpenAPI types them
        limits[opts.gpu_resource] = str(nproc)
    container = {
        "name": container_name,  # each operator finds its container by name
        "image": opts.image,
        "imagePullPolicy": opts.image_pull_policy,
        "command": ["bash", f"{INPUTS_DIR}/pod.sh"],
        "env": [{"name": CHANNEL_SECRET, "valueFrom": {"secretKeyRef": channel_secret_ref(name)}}]
        if has_channel(ctx)
        else [],
        "envFrom": [{"secretRef": {"name": s}} for s in opts.secrets],
        "resources": {
            "requests": {"cpu": str(nproc * ctx.threads), "memory": memory},
            "limits": limits,
        },
        "volumeMounts": [
            {"name": "inputs", "mountPath": INPUTS_DIR, "readOnly": True},
            {"name": "run", "mountPath": RUN_ROOT},
        ],
    }
    for key in ("env", "envFrom"):
        if not container[key]:
            del container[key]
    return container


def pod_template(
    ctx: RunContext, opts: KubernetesSpec, name: str, restart: str, container_name: str
) -> dict:
    """One node's pod: the pod script in a container sized for the node's processes."""
    container = _container(ctx, opts, name, container_name)
    run_volume = (
        {"name": "run", "persistentVolumeClaim": {"claimName": opts.volume_claim}}
        if opts.volume_claim
        else {"name": "run", "emptyDir": {}}
    )
    spec: dict = {
        "restartPolicy": restart,
        "containers": [container],
        "volumes": [{"name": "inputs", "configMap": {"name": f"{name}-inputs"}}, run_volume],
    }
    if opts.node_selector:
        spec["nodeSelector"] = dict(opts.node_selector)
    if opts.service_account:
        spec["serviceAccountName"] = opts.service_account
    return {"metadata": {"labels": {RUN_LABEL: name}}, "spec": spec}


def pytorchjob(ctx: RunContext, opts: KubernetesSpec, name: str) -> dict:
    """A Kubeflow PyTorchJob whose workers rendezvous elastically through the Service."""
    low, high = replica_range(ctx)
    elastic = {
        "rdzvBackend": "c10d",
        "rdzvHost": f"{name}-rdzv",
        "rdzvPort": ctx.rdzv_port,
        "rdzvId": ctx.run_id,
        "rdzvConf": [{"key": "is_host", "value": "false"}],
        "minReplicas": low,
        "maxReplicas": high,
        "maxRestarts": ctx.max_restarts,
    }
    # the training operator requires the container name "pytorch"
    worker = {
        "replicas": ctx.nnodes,
        "restartPolicy": "OnFailure",
        "template": pod_template(ctx, opts, name, "OnFailure", "pytorch"),
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _meta(name, opts, name),
        "spec": {
            "nprocPerNode": str(ctx.nproc_per_node[0]),
            "elasticPolicy": elastic,
            # Keep finished pods so `kubectl logs` still has their output.
            "runPolicy": {"cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": {"Worker": worker},
        },
    }


def indexed_job(ctx: RunContext, opts: KubernetesSpec, name: str, container: str) -> dict:
    """One indexed Job of ``nnodes`` pods: pod i is the plan's node i (pod.sh)."""
    return {
        "parallelism": ctx.nnodes,
        "completions": ctx.nnodes,
        "completionMode": "Indexed",
        "backoffLimit": 0,  # torchrun restarts workers; a lost pod restarts the JobSet
        "template": pod_template(ctx, opts, name, "Never", container),
    }


def jobset(ctx: RunContext, opts: KubernetesSpec, name: str) -> list[dict]:
    """A JobSet with one indexed Job of ``nnodes`` pods (no elastic range)."""
    job = indexed_job(ctx, opts, name, "pytorch")
    return [
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": _meta(name, opts, name),
            "spec": {
                "failurePolicy": {"maxRestarts": ctx.max_restarts},
                "successPolicy": {"operator": "All"},
                "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": job}}],
            },
        }
    ]


def runtime_name(ctx: RunContext, opts: KubernetesSpec) -> str:
    """The run's ClusterTrainingRuntime: cluster-scoped, so named by namespace and run."""
    return k8s_name(f"jobctl-{opts.namespace}-{ctx.run_id}", limit=63)


def trainjob(ctx: RunContext, opts: KubernetesSpec, name: str) -> list[dict]:
    """A Kubeflow Trainer v2 TrainJob and the ClusterTrainingRuntime it runs: the
    JobSet template of ``jobset`` as the Trainer's "node" step. The runtime carries no
    ``torch`` policy: the pod script starts torchrun itself, at jobctl's rendezvous,
    so the plugin's PET_* settings would only be overridden."""
    runtime, labels = runtime_name(ctx, opts), _meta(name, opts, name)["labels"]
    node = {
        "name": "node",
        "replicas": 1,
        "template": {
            "metadata": {"labels": dict(TRAINER_STEP)},
            "spec": indexed_job(ctx, opts, name, "node"),
        },
    }
    template = {
        "failurePolicy": {"maxRestarts": ctx.max_restarts},
        "successPolicy": {"operator": "All"},
        "replicatedJobs": [node],
    }
    cluster_runtime = {
        "apiVersion": f"{TRAINER_GROUP}/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": runtime, "labels": labels},
        "spec": {"mlPolicy": {"numNodes": ctx.nnodes}, "template": {"spec": template}},
    }
    ref = {"name": runtime, "apiGroup": TRAINER_GROUP, "kind": "ClusterTrainingRuntime"}
    job = {
        "apiVersion": f"{TRAINER_GROUP}/v1alpha1",
        "kind": "TrainJob",
        "metadata": _meta(name, opts, name),
        "spec": {"runtimeRef": ref, "trainer": {"numNodes": ctx.nnodes}},
    }
    return [cluster_runtime, job]


WORKLOADS = {"pytorchjob": lambda *a: [pytorchjob(*a)], "jobset": jobset, "trainjob": trainjob}
"""Each ``hardware.kubernetes.kind``'s objects, in the order they are applied."""
