"""`hardware.device: cuda` on the local backend is refused where the spec is loaded for a
run here (validate, plan, apply, render) when this machine cannot run CUDA: a CPU build
of torch, or no device visible. It used to pass, then `apply` started 4 workers that
failed after 48 s with "Distributed package doesn't have NCCL built in", and the failed
run became the job's latest. Remote backends keep it: their devices are on their nodes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from jobctl.engine.cli.app import app

from ..jobrun import quickstart_with

runner = CliRunner()
CUDA = ("  device: cpu", "  device: cuda")
FIX = "set hardware.device: cpu, or run on a machine with a CUDA device, or use a remote backend"


def _cuda_spec(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    """jobs/quickstart.yaml with ``hardware.device: cuda`` (and ``edits``) as job.yaml."""
    return quickstart_with(tmp_path / "job.yaml", CUDA, *edits)


def _device_at(path: Path) -> str:
    """``file:line:column`` of the value of ``hardware.device`` in ``path``."""
    lines = path.read_text().splitlines()
    line = next(i for i, t in enumerate(lines, 1) if t.startswith("  device:"))
    return f"{path}:{line}:{lines[line - 1].index('cuda') + 1}"


def _no_device(monkeypatch) -> None:
    """This torch built with CUDA, but no device visible (a GPU build on a CPU host)."""
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def _one_device(monkeypatch) -> None:
    """This torch built with CUDA and one device visible."""
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def _assert_refused(r, spec_file: Path, why: str) -> None:
    """Exit 2 with the project's spec error: file:line:col, field, what, fix."""
    assert r.exit_code == 2, r.output
    assert f"{spec_file}: invalid job spec" in r.output
    assert f"{_device_at(spec_file)}: hardware.device: cuda on the local backend" in r.output
    assert why in r.output
    assert f"fix: {FIX}" in r.output


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="this machine runs CUDA: the local backend may use it"
)
@pytest.mark.parametrize("command", ["validate", "plan"])
def test_cuda_on_this_machine_is_refused(tmp_path, command):
    """The real torch here: a CPU build names itself, a CUDA build says no device."""
    spec_file = _cuda_spec(tmp_path)
    r = runner.invoke(app, [command, str(spec_file)])
    why = (
        f"torch {torch.__version__} has no CUDA"
        if torch.version.cuda is None
        else "no CUDA device visible"
    )
    _assert_refused(r, spec_file, why)
    assert "device: cpu" in r.output


def test_a_cuda_build_without_a_device_is_refused(tmp_path, monkeypatch):
    """torch has CUDA, the machine shows no device: refused, the build named."""
    _no_device(monkeypatch)
    spec_file = _cuda_spec(tmp_path)
    r = runner.invoke(app, ["validate", str(spec_file)])
    _assert_refused(r, spec_file, f"no CUDA device visible to torch {torch.__version__}")


def test_a_visible_device_is_not_refused(tmp_path, monkeypatch):
    """Where torch sees a CUDA device, the local backend may use it."""
    _one_device(monkeypatch)
    r = runner.invoke(app, ["validate", str(_cuda_spec(tmp_path))])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("backend", ["slurm", "ssh", "kubernetes"])
def test_remote_backends_keep_cuda(tmp_path, monkeypatch, backend):
    """A remote backend's devices are on its nodes: this machine's torch says nothing."""
    _no_device(monkeypatch)
    spec_file = _cuda_spec(tmp_path, ("  backend: local", f"  backend: {backend}"))
    r = runner.invoke(app, ["validate", str(spec_file)])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    "command", [["render", "--out", "OUT"], ["apply", "--dry-run", "--home", "OUT"]]
)
def test_backend_override_keeps_cuda(tmp_path, monkeypatch, command):
    """`--backend slurm` on a local spec: the run starts on Slurm's nodes, not here."""
    _no_device(monkeypatch)
    # Slurm's nodes reach the rendezvous at an address of this machine, not 127.0.0.1.
    rendezvous = ("  backend: local", "  backend: local\n  rendezvous_host: 10.1.2.3")
    spec_file = _cuda_spec(tmp_path, rendezvous)
    args = [a.replace("OUT", str(tmp_path / "out")) for a in command]
    r = runner.invoke(app, [args[0], str(spec_file), *args[1:], "--backend", "slurm"])
    assert r.exit_code == 0, r.output
    assert "hardware.device" not in r.output
    # without the override the same spec is refused
    r = runner.invoke(app, [args[0], str(spec_file), *args[1:]])
    _assert_refused(r, spec_file, "no CUDA device visible")


def test_cpu_passes(tmp_path, monkeypatch):
    """``device: cpu`` needs no CUDA, whatever this machine's torch."""
    _no_device(monkeypatch)
    spec_file = quickstart_with(tmp_path / "job.yaml")
    r = runner.invoke(app, ["validate", str(spec_file)])
    assert r.exit_code == 0, r.output


def test_apply_records_no_run(tmp_path, monkeypatch):
    """`apply` refuses before any run is recorded: the job's latest run stays as it was."""
    from jobctl.engine.state.db import StateDB

    _no_device(monkeypatch)
    home = tmp_path / "home"
    spec_file = _cuda_spec(tmp_path)
    r = runner.invoke(app, ["apply", str(spec_file), "--home", str(home)])
    _assert_refused(r, spec_file, "no CUDA device visible")
    assert not (home / "runs").exists()
    assert StateDB(home).list_runs() == []
