"""Backends at the command line: the spec's hardware.backend picks the default, and
backend errors exit 2 with one clear paragraph, no traceback."""

from __future__ import annotations

import socket

import pytest
import yaml
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.state.db import StateDB
from jobctl.spec import dump_yaml
from jobctl.spec.sections import is_loopback

from ..jobrun import QUICKSTART, tiny_spec
from ..render_contexts import KUBE

runner = CliRunner()


def _assert_clear(r, *phrases: str) -> None:
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    for phrase in phrases:
        assert phrase in r.output, r.output
    assert "Fix:" in r.output and "valid: local, slurm, kubernetes, ssh" in r.output


def test_render_refused_by_the_backend_exits_2(tmp_path):
    args = ["render", str(QUICKSTART), "--out", str(tmp_path / "out"), "--backend", "kubernetes"]
    r = runner.invoke(app, args)
    _assert_clear(r, "the kubernetes backend cannot render", "hardware.kubernetes", "image")
    assert not (tmp_path / "out").exists()


def test_dry_run_refused_by_the_backend_exits_2(tmp_path):
    args = ["apply", str(QUICKSTART), "--dry-run", "--backend", "ssh", "--home", str(tmp_path)]
    r = runner.invoke(app, args)
    _assert_clear(r, "the ssh backend cannot render", "hardware.hosts", "0 host(s) for 2 node(s)")
    assert not (tmp_path / "runs").exists()


def test_unknown_backend_exits_2(tmp_path):
    args = ["render", str(QUICKSTART), "--out", str(tmp_path), "--backend", "nomad"]
    r = runner.invoke(app, args)
    _assert_clear(r, "unknown backend 'nomad'")


def _spec_file(tmp_path, **overrides):
    path = tmp_path / "job.yaml"
    path.write_text(dump_yaml(tiny_spec(**overrides)))
    return path


def test_submission_refused_exits_2_and_marks_the_run_failed(tmp_path, monkeypatch):
    spec_file = _spec_file(tmp_path, **{"hardware.backend": "slurm"})
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no sbatch on this PATH
    r = runner.invoke(app, ["apply", str(spec_file), "--home", str(tmp_path)])
    _assert_clear(r, "the slurm backend cannot start", "sbatch: command not found")
    (row,) = StateDB(tmp_path).list_runs()
    assert (row["phase"], row["exit_code"]) == ("failed", 2)


def test_a_local_spec_rendered_for_slurm_names_the_rendezvous_fix(tmp_path):
    args = ["render", str(QUICKSTART), "--out", str(tmp_path / "out"), "--backend", "slurm"]
    r = runner.invoke(app, args)
    _assert_clear(
        r,
        "the slurm backend cannot render",
        "Slurm's nodes cannot reach the rendezvous at 127.0.0.1",
        "hardware.rendezvous_host defaults to it for hardware.backend 'local'",
        "set hardware.backend: slurm",
    )


HOST = socket.gethostname()
needs_a_host_name = pytest.mark.skipif(
    is_loopback(HOST), reason=f"this machine's host name {HOST!r} is a loopback name"
)


@needs_a_host_name
@pytest.mark.parametrize(
    ("backend", "artifacts"),
    [
        ("slurm", ["job.sbatch", "node-0.sh", "node-1.sh"]),
        ("kubernetes", ["manifests.yaml"]),
        ("ssh", ["node-0.sh", "node-1.sh"]),
    ],
)
def test_render_without_backend_uses_the_specs_backend(backend, artifacts, tmp_path):
    overrides = {
        "hardware.backend": backend,
        "hardware.kubernetes": KUBE,
        "hardware.hosts": ["gpu-a", "gpu-b"],
    }
    out = tmp_path / "out"
    r = runner.invoke(app, ["render", str(_spec_file(tmp_path, **overrides)), "--out", str(out)])
    assert r.exit_code == 0, r.output
    out = out / "run" / "scripts"  # the layout of a run's folder
    assert sorted(p.name for p in out.iterdir()) == sorted(artifacts)
    # The nodes are other machines: the rendezvous is this machine's host name.
    if backend == "kubernetes":
        docs = list(yaml.safe_load_all((out / "manifests.yaml").read_text()))
        service = next(d for d in docs if d["kind"] == "Service")
        assert service["spec"]["externalName"] == HOST
    else:
        assert f"  --rdzv-endpoint={HOST}:" in (out / "node-1.sh").read_text()
