"""Kubernetes manifests against the published schemas, and the backend's kubectl calls.

The schemas are subsets of the PyTorchJob and JobSet CRDs and of the core API, kept
as test data in tests/data (see their headers for provenance). A cluster is not
needed: ``kubectl apply --dry-run=client`` runs only where kubectl has a context, and
submission is tested against a stand-in ``kubectl`` that records its arguments.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from jobctl.backends import BackendError, get_backend
from jobctl.backends.kubernetes import workload_status

from .test_backend_render import CASES, KUBE, _evil_context, context, rendered

jsonschema = pytest.importorskip("jsonschema")
referencing = pytest.importorskip("referencing")

DATA = Path(__file__).parent / "data"
KUBE_CASES = [c for c in sorted(CASES) if c.startswith("kubernetes")]


def _validator(kind: str):
    schemas = [yaml.safe_load(p.read_text()) for p in sorted(DATA.glob("*.subset.yaml"))]
    registry = referencing.Registry().with_resources(
        (s["$id"], referencing.Resource.from_contents(s)) for s in schemas
    )
    by_kind = {"PyTorchJob": "pytorchjob-v1", "JobSet": "jobset-v1alpha2"}
    ref = (
        f"https://jobctl.test/{by_kind[kind]}.subset.yaml"
        if kind in by_kind
        else f"https://jobctl.test/k8s-core-v1.subset.yaml#/$defs/{kind}"
    )
    return jsonschema.Draft202012Validator({"$ref": ref}, registry=registry)


def _errors(doc: dict) -> list[str]:
    return [
        f"{list(e.absolute_path)}: {e.message}" for e in _validator(doc["kind"]).iter_errors(doc)
    ]


def _docs(files: dict[str, str]) -> list[dict]:
    return list(yaml.safe_load_all(files["manifests.yaml"]))


@pytest.mark.parametrize("case", KUBE_CASES)
def test_manifests_match_the_published_schemas(case):
    docs = _docs(rendered(case).files)
    kinds = [d["kind"] for d in docs]
    assert kinds[0] == "ConfigMap" and kinds[-1] in ("PyTorchJob", "JobSet")
    for doc in docs:
        assert _errors(doc) == [], doc["kind"]


def test_schemas_catch_a_misspelt_field():
    job = _docs(rendered("kubernetes-pytorchjob").files)[-1]
    job["spec"]["elasticPolicy"]["rdzvbackend"] = "c10d"
    assert any("'rdzvbackend' was unexpected" in e for e in _errors(job))


def test_metacharacter_names_still_make_valid_objects(tmp_path):
    ctx, _, _ = _evil_context("kubernetes", tmp_path, {"kubernetes": KUBE})
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
    assert "env" not in container  # no secret value is ever written out
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert pod["nodeSelector"] == {"cloud.google.com/gke-spot": "true", "gpu": "a100"}
    slice_ = next(d for d in docs if d["kind"] == "EndpointSlice")
    assert slice_["endpoints"] == [{"addresses": ["10.0.0.5"]}]  # the supervisor's store
    assert "--nnodes=1:4" in docs[0]["data"]["pod.sh"]


@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl not installed")
@pytest.mark.parametrize("case", KUBE_CASES)
def test_kubectl_client_dry_run(case, tmp_path):
    if subprocess.run(["kubectl", "config", "current-context"], capture_output=True).returncode:
        pytest.skip("kubectl has no current context: client dry runs need API discovery")
    path = tmp_path / "manifests.yaml"
    path.write_text(rendered(case).files["manifests.yaml"])
    out = subprocess.run(
        ["kubectl", "apply", "--dry-run=client", "-f", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr


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
        "delete pytorchjobs.kubeflow.org,configmaps,services,endpointslices.discovery.k8s.io "
        "-n ml -l jobctl.dev/run=quick-1 --wait=false"
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
    ],
)
def test_workload_conditions_map_to_phases(conditions, phase):
    assert workload_status(json.loads(_conditions(*conditions))).phase == phase
