"""Kubernetes manifests against the published schemas, and the backend's kubectl calls.

The schemas are test data in tests/data (see their headers for provenance): the core
API and the PyTorchJob as published (``published-openapi.json``, generated from the
``kubernetes`` and ``kubeflow-training`` packages by ``published_schemas.py``), the
training operator's extra rules, a hand transcription of JobSet, and the Kubeflow Trainer
v2 TrainJob and ClusterTrainingRuntime as published (``trainer-v1alpha1.openapi.json``,
generated from ``kubeflow-trainer-api`` by ``trainer_schemas.py``) with the Trainer's
conventions (``trainjob-v1alpha1.rules.yaml``). No cluster is needed:
the real ``kubectl`` applies the manifests (``--dry-run=client``) and runs
``channel-secret.sh`` against a stand-in API server on 127.0.0.1 that answers discovery
and stores what it is sent; status, cancel and logs go through a stand-in ``kubectl``
that records its arguments.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import referencing
import yaml

from jobctl.backends import BackendError, get_backend
from jobctl.backends.kubernetes import workload_status
from jobctl.engine.channel.server import JsonHandler
from jobctl.engine.worker.process import plan_rank

from ..render_contexts import CASES, CHANNEL_SECRET, KUBE, context, evil_context, rendered

DATA = Path(__file__).parents[1] / "data"
KUBE_CASES = [c for c in sorted(CASES) if c.startswith("kubernetes")]
# Each kind's schema: the workloads' own files (published schema plus the operator's
# rules, or JobSet's hand transcription); core objects straight from the published one.
SCHEMAS = {
    "PyTorchJob": "pytorchjob-v1.rules.yaml",
    "JobSet": "jobset-v1alpha2.subset.yaml",
    "TrainJob": "trainjob-v1alpha1.rules.yaml#/$defs/TrainJob",
    "ClusterTrainingRuntime": "trainjob-v1alpha1.rules.yaml#/$defs/ClusterTrainingRuntime",
}
FILES = [
    "pytorchjob-v1.rules.yaml",
    "jobset-v1alpha2.subset.yaml",
    "trainjob-v1alpha1.rules.yaml",
    "published-openapi.json",
    "trainer-v1alpha1.openapi.json",
]
CORE = {"ConfigMap": "v1", "Service": "v1", "EndpointSlice": "discovery.k8s.io/v1"}


def _validator(kind: str):
    schemas = [yaml.safe_load((DATA / name).read_text()) for name in FILES]  # JSON is YAML too
    registry = referencing.Registry().with_resources(
        (s["$id"], referencing.Resource.from_contents(s)) for s in schemas
    )
    if kind in SCHEMAS:
        schema = {"$ref": f"https://jobctl.test/{SCHEMAS[kind]}"}
    else:
        published = {"$ref": f"https://jobctl.test/published-openapi.json#/$defs/V1{kind}"}
        version = {
            "properties": {"apiVersion": {"const": CORE[kind]}, "kind": {"const": kind}},
            "required": ["apiVersion", "kind", "metadata"],
        }
        schema = {"allOf": [published, version]}
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _errors(doc: dict) -> list[str]:
    """Every violation, with the ones inside ``anyOf`` branches (the published schema
    allows null for each optional field, so most checks sit in such a branch)."""
    todo, out = list(_validator(doc["kind"]).iter_errors(doc)), []
    while todo:
        e = todo.pop(0)
        out.append(f"{list(e.absolute_path)}: {e.message}")
        todo += e.context or []
    return out


def _docs(files: dict[str, str]) -> list[dict]:
    return list(yaml.safe_load_all(files["manifests.yaml"]))


@pytest.mark.parametrize("case", KUBE_CASES)
def test_manifests_match_the_published_schemas(case):
    docs = _docs(rendered(case).files)
    kinds = [d["kind"] for d in docs]
    assert kinds[0] == "ConfigMap" and kinds[-1] in ("PyTorchJob", "JobSet", "TrainJob")
    for doc in docs:
        assert _errors(doc) == [], doc["kind"]


def test_schemas_catch_a_misspelt_field():
    docs = _docs(rendered("kubernetes-pytorchjob").files)
    job = docs[-1]
    job["spec"]["elasticPolicy"]["rdzvbackend"] = "c10d"
    assert any("'rdzvbackend' was unexpected" in e for e in _errors(job))
    del job["spec"]["runPolicy"]  # required by the published PyTorchJobSpec
    assert any("'runPolicy' is a required property" in e for e in _errors(job))
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    container["name"] = "trainer"  # the operator's webhook wants a container "pytorch"
    assert any("does not contain items matching" in e for e in _errors(job))
    service = next(d for d in docs if d["kind"] == "Service")
    service["spec"]["ports"][0]["targetport"] = 1  # the published core/v1 ServicePort
    assert any("'targetport' was unexpected" in e for e in _errors(service))


def test_trainjob_runs_the_pod_script_as_the_trainers_node_step():
    docs = _docs(rendered("kubernetes-trainjob").files)
    assert [d["kind"] for d in docs] == [
        "ConfigMap",
        "Service",
        "EndpointSlice",
        "ClusterTrainingRuntime",
        "TrainJob",
    ]
    runtime, job = docs[-2], docs[-1]
    assert "namespace" not in runtime["metadata"]  # cluster-scoped, named by namespace too
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    assert runtime["metadata"]["name"] == "jobctl-training-quick-1"
    assert runtime["metadata"]["labels"]["jobctl.dev/run"] == "quick-1"  # cancel deletes it
    assert job["spec"]["trainer"] == {"numNodes": 2} == runtime["spec"]["mlPolicy"]
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"] == ["bash", "/etc/jobctl/pod.sh"]
    assert node["template"]["spec"]["completionMode"] == "Indexed"  # pod i = plan node i
    assert runtime["spec"]["template"]["spec"]["failurePolicy"] == {"maxRestarts": 2}
    assert "--max-restarts=2 " in docs[0]["data"]["pod.sh"]
    assert "--nnodes=2 " in docs[0]["data"]["pod.sh"]  # no elastic range: fixed nodes


def test_trainjob_schemas_catch_what_the_trainer_would_refuse():
    docs = _docs(rendered("kubernetes-trainjob").files)
    runtime, job = docs[-2], docs[-1]
    job["spec"]["runtimeRef"]["kind"] = "ClusterTrainingRuntimes"
    job["spec"]["trainer"]["numnodes"] = 2  # the published TrainerV1alpha1Trainer
    errors = _errors(job)
    assert any("'numnodes' was unexpected" in e for e in errors), errors
    assert any("'ClusterTrainingRuntimes' is not one of" in e for e in errors), errors
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    node["template"]["spec"]["template"]["spec"]["containers"][0]["name"] = "pytorch"
    assert any("does not contain items matching" in e for e in _errors(runtime))
    node["template"]["spec"]["template"]["spec"]["containers"][0]["name"] = "node"
    assert _errors(runtime) == []
    del node["template"]["metadata"]["labels"]  # not the trainer step any more
    assert any("does not contain items matching" in e for e in _errors(runtime))
    runtime["metadata"]["namespace"] = "training"
    assert any("should not be valid" in e for e in _errors(runtime))


def test_metacharacter_names_still_make_valid_objects(tmp_path):
    ctx, _, _ = evil_context("kubernetes", tmp_path, {"kubernetes": KUBE})
    for doc in _docs(get_backend("kubernetes").render(ctx).files):
        assert _errors(doc) == [], doc["kind"]


def test_pytorchjob_elastic_policy_and_secrets_by_reference():
    docs = _docs(rendered("kubernetes-pytorchjob").files)
    job = docs[-1]["spec"]
    assert job["elasticPolicy"] == {
        "rdzvBackend": "c10d",
        "rdzvHost": "quick-1-rdzv",
        "rdzvPort": 29400,
        "rdzvId": "quick-1",
        "rdzvConf": [{"key": "is_host", "value": "false"}],
        "minReplicas": 1,  # elasticity.min_devices 2 / 2 per node
        "maxReplicas": 4,  # elasticity.max_devices 8 / 2 per node
        "maxRestarts": 0,
    }
    pod = job["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["envFrom"] == [
        {"secretRef": {"name": "s3-credentials"}},
        {"secretRef": {"name": "wandb"}},
    ]
    # The channel secret by reference: a key of the Secret channel-secret.sh creates.
    assert container["env"] == [
        {
            "name": "JOBCTL_CHANNEL_SECRET",
            "valueFrom": {"secretKeyRef": {"name": "quick-1-channel", "key": "secret"}},
        }
    ]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert pod["nodeSelector"] == {"cloud.google.com/gke-spot": "true", "gpu": "a100"}
    slice_ = next(d for d in docs if d["kind"] == "EndpointSlice")
    assert slice_["endpoints"] == [{"addresses": ["10.0.0.5"]}]  # the supervisor's store
    assert "--nnodes=1:4" in docs[0]["data"]["pod.sh"]


def test_the_channel_secret_is_referenced_never_written():
    files = rendered("kubernetes-pytorchjob").files
    assert sorted(files) == ["channel-secret.sh", "manifests.yaml"]
    for name, text in files.items():
        assert CHANNEL_SECRET not in text, name
        assert base64.b64encode(CHANNEL_SECRET.encode()).decode() not in text, name
    assert "Secret" not in [d["kind"] for d in _docs(files)]  # created only by the script
    script = files["channel-secret.sh"]
    assert "printf '%s' \"$JOBCTL_CHANNEL_SECRET\" |" in script  # a builtin: on no argv
    assert "--from-file=secret=/dev/stdin" in script
    # No channel (JOBCTL_CHANNEL=off, or `jobctl render`): no secret and no reference.
    assert sorted(rendered("kubernetes-jobset").files) == ["manifests.yaml"]
    assert "secretKeyRef" not in rendered("kubernetes-jobset").files["manifests.yaml"]


def test_max_restarts_is_a_spec_field_of_its_own():
    from jobctl.spec import SpecError, load_spec_text

    base = "name: t\nmodel: {}\ntraining: {global_batch_size: 8, steps: 2}\n"
    assert load_spec_text(base, "job.yaml").hardware.max_restarts == 0  # jobctl resumes
    assert (
        load_spec_text(base + "hardware: {max_restarts: 4}", "job.yaml").hardware.max_restarts == 4
    )
    with pytest.raises(SpecError) as info:
        load_spec_text(base + "hardware: {max_restarts: -1}", "job.yaml")
    assert [i.path for i in info.value.errors] == ["hardware.max_restarts"]


def test_max_restarts_reach_torchrun_and_the_workloads():
    hardware = {"kubernetes": KUBE, "max_restarts": 5}
    job = _docs(get_backend("kubernetes").render(context("kubernetes", hardware)).files)
    assert job[-1]["spec"]["elasticPolicy"]["maxRestarts"] == 5
    assert "--max-restarts=5 " in job[0]["data"]["pod.sh"]
    hardware["kubernetes"] = {**KUBE, "kind": "jobset"}
    jobset = _docs(get_backend("kubernetes").render(context("kubernetes", hardware)).files)
    assert jobset[-1]["spec"]["failurePolicy"] == {"maxRestarts": 5}
    assert "--max-restarts=5 " in jobset[0]["data"]["pod.sh"]
    for backend in ("local", "slurm", "ssh"):
        ctx = context(backend, {"hosts": ["a", "b"], "max_restarts": 5})
        for name, text in get_backend(backend).render(ctx).files.items():
            if name.startswith("node-"):
                assert "  --max-restarts=5 \\\n" in text, (backend, name)


def _pod_node(script: str, tmp_path: Path, env: dict[str, str]) -> str:
    """Run a pod script with ``mkdir``, ``cp`` and ``python`` (torchrun) stubbed out;
    returns the JOBCTL_NODE torchrun, and so its workers, would see."""
    head, _, body = script.partition("set -euo pipefail\n")
    stubs = 'mkdir() { :; }\ncp() { :; }\npython() { echo "node=${JOBCTL_NODE:-unset}"; }\n'
    path = tmp_path / "pod.sh"
    path.write_text(head + "set -euo pipefail\n" + stubs + body.replace("exec python", "python"))
    base = {k: v for k, v in os.environ.items() if k != "JOB_COMPLETION_INDEX"}
    out = subprocess.run(
        ["bash", str(path)], capture_output=True, text=True, check=True, env={**base, **env}
    )
    return out.stdout.strip().splitlines()[-1]


def test_jobset_pods_take_the_plan_node_of_their_index(tmp_path):
    """A JobSet pod's completion index names its node in the plan, so each worker takes
    the plan's rank (plan_rank); PyTorchJob pods have none and keep torchrun's RANK."""
    hardware = {"kubernetes": {**KUBE, "kind": "jobset"}}
    pod = _docs(get_backend("kubernetes").render(context("kubernetes", hardware)).files)
    script = pod[0]["data"]["pod.sh"]
    assert _pod_node(script, tmp_path, {"JOB_COMPLETION_INDEX": "1"}) == "node=1"
    assert _pod_node(script, tmp_path, {}) == "node=unset"
    plan = SimpleNamespace(
        world_size=4,
        ranks=[SimpleNamespace(rank=r, node=r // 2, local_rank=r % 2) for r in range(4)],
    )
    # torchrun's rendezvous put this pod's agent first (RANK 0-1); the plan says node 1
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    assert plan_rank(plan, {**env, "JOBCTL_NODE": "1"}) == 2
    assert plan_rank(plan, env) == 0


# Discovery documents of the API groups jobctl writes to: (group, version) -> resources.
API_GROUPS = {
    ("", "v1"): [("configmaps", "ConfigMap"), ("services", "Service"), ("secrets", "Secret")],
    ("discovery.k8s.io", "v1"): [("endpointslices", "EndpointSlice")],
    ("kubeflow.org", "v1"): [("pytorchjobs", "PyTorchJob")],
    ("jobset.x-k8s.io", "v1alpha2"): [("jobsets", "JobSet")],
    ("trainer.kubeflow.org", "v1alpha1"): [
        ("trainjobs", "TrainJob"),
        ("clustertrainingruntimes", "ClusterTrainingRuntime"),
    ],
}
CLUSTER_SCOPED = {"ClusterTrainingRuntime"}


def _discovery(path: str) -> dict | None:
    """The discovery document at ``path`` (legacy, unaggregated), or None."""
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"]}
    if path == "/apis":
        groups = [
            {
                "name": g,
                "versions": [gv := {"groupVersion": f"{g}/{v}", "version": v}],
                "preferredVersion": gv,
            }
            for g, v in API_GROUPS
            if g
        ]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    for (group, version), resources in API_GROUPS.items():
        if path == (f"/apis/{group}/{version}" if group else "/api/v1"):
            verbs = ["create", "get", "list", "delete"]
            listed = [
                {
                    "name": n,
                    "singularName": n[:-1],
                    "namespaced": k not in CLUSTER_SCOPED,
                    "kind": k,
                    "verbs": verbs,
                }
                for n, k in resources
            ]
            gv = f"{group}/{version}" if group else version
            return {"kind": "APIResourceList", "groupVersion": gv, "resources": listed}
    return None


class _ApiServer(JsonHandler):
    """A stand-in Kubernetes API server: discovery, and objects stored as created."""

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?")[0]
        found = _discovery(path) or self.server.objects.get(path)
        missing = {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
        self.reply(200, found) if found else self.reply(404, {"apiVersion": "v1", **missing})

    def do_POST(self) -> None:  # noqa: N802
        obj = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.objects[f"{self.path.split('?')[0]}/{obj['metadata']['name']}"] = obj
        self.reply(201, obj)


KUBECTL_NO_VALIDATION = """#!/usr/bin/env bash
if [ "$1" = apply ]; then set -- "$@" --validate=false; fi
exec {kubectl} "$@"
"""


@pytest.fixture
def kube_api(tmp_path):
    """The environment in which the real kubectl talks to a stand-in API server."""
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed (it is the client under test)")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ApiServer)
    server.objects = {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = tmp_path / "kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "stand-in",
                "clusters": [
                    {
                        "name": "stand-in",
                        "cluster": {"server": f"http://127.0.0.1:{server.server_port}"},
                    }
                ],
                "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "u"}}],
                "users": [{"name": "u", "user": {}}],
            }
        )
    )
    # The stand-in serves no OpenAPI document to validate against (the schemas are
    # checked against tests/data instead): `kubectl apply` runs with --validate=false.
    shim = tmp_path / "bin" / "kubectl"
    shim.parent.mkdir()
    shim.write_text(KUBECTL_NO_VALIDATION.format(kubectl=shutil.which("kubectl")))
    shim.chmod(0o755)
    # HOME: kubectl's discovery cache goes to the test's folder, not ~/.kube.
    path = f"{shim.parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "KUBECONFIG": str(config), "HOME": str(tmp_path), "PATH": path}
    yield env, server.objects
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("case", KUBE_CASES)
def test_kubectl_client_dry_run(case, tmp_path, kube_api):
    env, objects = kube_api
    path = tmp_path / "manifests.yaml"
    path.write_text(rendered(case).files["manifests.yaml"])
    out = subprocess.run(
        ["kubectl", "apply", "--dry-run=client", "-o", "json", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    read_back = json.loads(out.stdout)
    applied = read_back["items"] if read_back["kind"] == "List" else [read_back]
    for mine, theirs in zip(_docs({"manifests.yaml": path.read_text()}), applied, strict=True):
        theirs["metadata"].pop("annotations")  # kubectl's last-applied-configuration
        assert theirs == mine  # Go's YAML reader saw exactly the objects jobctl meant
    assert objects == {}  # a dry run creates nothing


def test_submit_creates_the_secret_and_applies_for_real(tmp_path, kube_api, monkeypatch):
    env, objects = kube_api
    for name in ("KUBECONFIG", "HOME", "PATH"):
        monkeypatch.setenv(name, env[name])
    backend = get_backend("kubernetes")
    backend_case, hardware, extra = CASES["kubernetes-pytorchjob"]
    ctx = context(backend_case, hardware, run_dir=tmp_path / "run", **extra)
    assert backend.submit(backend.render(ctx), ctx) == ["training/pytorchjob/quick-1"]
    secret = objects["/api/v1/namespaces/training/secrets/quick-1-channel"]
    assert base64.b64decode(secret["data"]["secret"]).decode() == CHANNEL_SECRET
    assert secret["metadata"]["labels"]["jobctl.dev/run"] == "quick-1"  # cancel deletes it
    kinds = sorted(o["kind"] for o in objects.values())
    assert kinds == ["ConfigMap", "EndpointSlice", "PyTorchJob", "Secret", "Service"]
    for path in (tmp_path / "run" / "scripts").iterdir():
        assert CHANNEL_SECRET not in path.read_text(), path.name
    no_secret = context(backend_case, hardware, run_dir=tmp_path / "other", env=extra["env"])
    with pytest.raises(BackendError, match="need the run's channel secret"):
        backend.submit(backend.render(no_secret), no_secret)


FAKE_KUBECTL = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/calls"
case "$1 $2" in
  "config current-context") [ -e "$(dirname "$0")/no-context" ] && exit 1; echo fake ;;
  "get "*) cat "$(dirname "$0")/object.json" ;;
  "logs "*) echo "[pod/quick-1-worker-0/pytorch] hello" ;;
  *) echo ok ;;
esac
"""


@pytest.fixture
def fake_kubectl(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(FAKE_KUBECTL)
    (bin_dir / "kubectl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    return bin_dir


def _conditions(*types: str) -> str:
    return json.dumps({"status": {"conditions": [{"type": t, "status": "True"} for t in types]}})


def test_submit_status_cancel_logs_through_kubectl(fake_kubectl, tmp_path):
    backend = get_backend("kubernetes")
    backend._cache.ttl = 0  # every status call asks kubectl
    ctx = context("kubernetes", {"kubernetes": {**KUBE, "namespace": "ml"}}, run_dir=tmp_path)
    handles = backend.submit(backend.render(ctx), ctx)
    assert handles == ["ml/pytorchjob/quick-1"]
    (fake_kubectl / "object.json").write_text(_conditions("Created", "Running"))
    assert backend.status(handles)[0].phase == "running"
    (fake_kubectl / "object.json").write_text(_conditions("Created", "Succeeded"))
    assert backend.poll(handles) == [0]
    assert backend.logs(handles, tmp_path)[0].read_text().endswith("hello\n")
    backend.cancel(handles)
    (fake_kubectl / "object.json").write_text("")
    assert backend.status(handles)[0].phase == "stopped"  # deleted on purpose
    calls = (fake_kubectl / "calls").read_text().splitlines()
    assert calls[1] == f"apply -f {tmp_path}/scripts/manifests.yaml"
    assert calls[2] == "get pytorchjobs.kubeflow.org quick-1 -n ml -o json --ignore-not-found"
    assert (
        "delete pytorchjobs.kubeflow.org,configmaps,services,endpointslices.discovery.k8s.io,"
        "secrets -n ml -l jobctl.dev/run=quick-1 --wait=false"
    ) in calls


def test_a_trainjob_is_watched_and_cancelled_with_its_runtime(fake_kubectl, tmp_path):
    backend = get_backend("kubernetes")
    backend._cache.ttl = 0
    ctx = context("kubernetes", {"kubernetes": {**KUBE, "kind": "trainjob"}}, run_dir=tmp_path)
    handles = backend.submit(backend.render(ctx), ctx)
    assert handles == ["default/trainjob/quick-1"]
    (fake_kubectl / "object.json").write_text(_conditions("Created", "Complete"))
    assert backend.poll(handles) == [0]
    backend.cancel(handles)
    calls = (fake_kubectl / "calls").read_text().splitlines()
    get = "get trainjobs.trainer.kubeflow.org quick-1 -n default -o json --ignore-not-found"
    assert get in calls
    assert (
        "delete trainjobs.trainer.kubeflow.org,configmaps,services,"
        "endpointslices.discovery.k8s.io,secrets,clustertrainingruntimes.trainer.kubeflow.org "
        "-n default -l jobctl.dev/run=quick-1 --wait=false"
    ) in calls


def test_submit_without_a_cluster_is_a_clear_error(fake_kubectl, tmp_path):
    (fake_kubectl / "no-context").touch()
    ctx = context("kubernetes", {"kubernetes": KUBE}, run_dir=tmp_path)
    backend = get_backend("kubernetes")
    with pytest.raises(BackendError, match="no Kubernetes cluster configured for kubectl"):
        backend.submit(backend.render(ctx), ctx)
    with pytest.raises(BackendError, match="only stop pods"):
        backend.cancel(["ml/pytorchjob/x"], signal.SIGUSR1)


@pytest.mark.parametrize(
    ("conditions", "phase"),
    [
        ((), "pending"),
        (("Created",), "pending"),
        (("Created", "Running"), "running"),
        (("Created", "Succeeded"), "succeeded"),
        (("Created", "Failed"), "failed"),
        (("Completed",), "succeeded"),  # JobSet
        (("Suspended",), "stopped"),
        (("Created", "Complete"), "succeeded"),  # TrainJob
    ],
)
def test_workload_conditions_map_to_phases(conditions, phase):
    assert workload_status(json.loads(_conditions(*conditions))).phase == phase


def test_a_trainjob_runs_while_one_of_its_jobs_is_active():
    """A TrainJob has no Running condition; its jobsStatus counts active Jobs."""
    job = json.loads(_conditions("Created"))
    job["status"]["jobsStatus"] = [
        {"name": "node", "active": 0, "ready": 0, "failed": 0, "succeeded": 0, "suspended": 0}
    ]
    assert workload_status(job).phase == "pending"
    job["status"]["jobsStatus"][0]["active"] = 1
    assert workload_status(job).phase == "running"
