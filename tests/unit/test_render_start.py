"""`jobctl render --out` writes start.sh for every backend (#24 leftover e): it was
written for local and Slurm only, so an ssh or Kubernetes render could not be started
by hand. Here start.sh runs against stand-in `ssh` and `kubectl` programs on PATH that
record what they were asked (the real ones are exercised by the integration tests)."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.spec import dump_yaml, load_spec

QUICKSTART = Path(__file__).resolve().parents[2] / "jobs" / "quickstart.yaml"

# Stand-ins: ssh saves its arguments and the tar on its stdin, then says the node ran;
# kubectl saves its arguments and reports both pods as succeeded.
FAKE_SSH = """#!/usr/bin/env bash
host="${@: -2:1}"  # the nodes start at once: one file per host
printf '%s\\n' "$@" > "$REC/ssh-$host.args"
cat > "$REC/ssh-$host.tar"
echo "node ran"
"""
FAKE_KUBECTL = """#!/usr/bin/env bash
printf '%s\\n' "$*" >> "$REC/kubectl.calls"
if [ "$1" = get ]; then echo "Succeeded Succeeded"; fi
"""


def _render(tmp_path: Path, backend: str, hardware: dict) -> Path:
    spec = load_spec(
        QUICKSTART,
        {
            "training.steps": 2,
            "hardware.backend": backend,
            **{f"hardware.{k}": v for k, v in hardware.items()},
        },
    )
    (tmp_path / "job.yaml").write_text(dump_yaml(spec))
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["render", str(tmp_path / "job.yaml"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "start.sh" in r.output and os.access(out / "start.sh", os.X_OK)
    subprocess.run(["bash", "-n", str(out / "start.sh")], check=True)
    return out


def _start(tmp_path: Path, out: Path, fakes: dict[str, str]) -> subprocess.CompletedProcess:
    bin_dir, rec = tmp_path / "bin", tmp_path / "rec"
    bin_dir.mkdir()
    rec.mkdir()
    for name, text in fakes.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REC": str(rec)}
    return subprocess.run(
        ["bash", str(out / "start.sh")], env=env, capture_output=True, text=True, timeout=300
    )


def test_an_ssh_render_starts_each_node_on_its_host(tmp_path):
    hosts = ["127.0.0.1", "localhost"]
    out = _render(tmp_path, "ssh", {"hosts": hosts, "ssh": {"port": 2222, "user": "alice"}})
    done = _start(tmp_path, out, {"ssh": FAKE_SSH})
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = (out / "run").resolve()
    for k, host in enumerate(hosts):
        args = (tmp_path / "rec" / f"ssh-{host}.args").read_text().splitlines()
        assert args[:2] == ["-p", "2222"] and args[-5:-3] == ["-l", "alice"]
        assert args[-2:-1] == [host] and f"exec bash scripts/node-{k}.sh" in args[-1]
        assert f"tar -x -f - -C {run_dir}" in args[-1]
        with tarfile.open(tmp_path / "rec" / f"ssh-{host}.tar") as tar:
            assert sorted(tar.getnames()) == ["plan.json", f"scripts/node-{k}.sh", "spec.yaml"]
        assert "node ran" in (run_dir / "logs" / f"node-{k}.log").read_text()
    assert "run ended with status 0" in done.stdout


def test_a_kubernetes_render_applies_and_waits_for_the_pods(tmp_path):
    out = _render(
        tmp_path,
        "kubernetes",
        {"kubernetes": {"image": "ghcr.io/acme/jobctl:0.1", "namespace": "ml"}},
    )
    done = _start(tmp_path, out, {"kubectl": FAKE_KUBECTL})
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (tmp_path / "rec" / "kubectl.calls").read_text().splitlines()
    assert calls[0] == "apply -f scripts/manifests.yaml"
    assert calls[1].startswith("get pods -n ml -l jobctl.dev/run=")
    assert "the pods ended: Succeeded Succeeded" in done.stdout
