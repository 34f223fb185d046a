"""Every backend's rendered artifacts: pinned by golden files, valid shell, inert data.

Regenerate the golden files after an intended change with
``JOBCTL_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_backend_render.py`` and review
the diff.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from jobctl.backends import BackendError, get_backend
from jobctl.spec import dump_yaml
from jobctl.spec.sections import SlurmSpec

from ..render_contexts import CASES, KUBE, context, evil_context, rendered

GOLDEN = Path(__file__).parents[1] / "golden"
UPDATE = os.environ.get("JOBCTL_UPDATE_GOLDEN") == "1"
SHELLCHECK = shutil.which("shellcheck")


def scripts(files: dict[str, str]) -> dict[str, str]:
    """Every shell script among the artifacts, pod scripts inside manifests included."""
    out = {n: t for n, t in files.items() if n.endswith((".sh", ".sbatch"))}
    for name, text in files.items():
        if name.endswith(".yaml"):
            for doc in yaml.safe_load_all(text):
                if doc["kind"] == "ConfigMap":
                    out[f"{name}:pod.sh"] = doc["data"]["pod.sh"]
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case):
    files = rendered(case).files
    folder = GOLDEN / case
    if UPDATE:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name, text in files.items():
            (folder / name).write_text(text)
    assert sorted(p.name for p in folder.iterdir()) == sorted(files), "artifact set changed"
    for name, text in files.items():
        assert text == (folder / name).read_text(), f"{case}/{name} differs from golden"


@pytest.mark.skipif(not SHELLCHECK, reason="shellcheck not installed (apt-get install shellcheck)")
@pytest.mark.parametrize("case", sorted(CASES))
def test_scripts_pass_bash_n_and_shellcheck(case, tmp_path):
    found = scripts(rendered(case).files)
    assert found, "every backend renders at least one script"
    expected = {
        "local": 2,
        "slurm": 3,
        "slurm-defaults": 3,
        "ssh": 2,
        "kubernetes-pytorchjob": 2,
        "kubernetes-jobset": 1,
        "kubernetes-trainjob": 2,
    }
    assert len(found) == expected[case], sorted(found)  # none is missed
    for name, text in found.items():
        path = tmp_path / name.replace(":", "-")
        path.write_text(text)
        subprocess.run(["bash", "-n", str(path)], check=True)
        check = subprocess.run([SHELLCHECK, str(path)], capture_output=True, text=True)
        assert check.returncode == 0, f"{case}/{name}:\n{check.stdout}"


def _run_with_stubs(script: str, tmp_path: Path, stubs: dict[str, str]) -> str:
    """Run ``script`` with ``exec`` turned into ``echo``, the python that runs torchrun
    echoing its arguments, and commands in ``stubs`` replaced by shell functions;
    returns stdout."""
    head, _, body = script.partition("set -euo pipefail\n")
    pythons = ("/usr/bin/python3", "python3")
    stubs = {**{py: f'echo {py} "$@"' for py in pythons}, **stubs}
    functions = "".join(f"{name}() {{ {code}; }}\n" for name, code in stubs.items())
    path = tmp_path / "script.sh"
    path.write_text(head + "set -euo pipefail\n" + functions + body.replace("exec ", "echo ", 1))
    out = subprocess.run(["bash", str(path)], capture_output=True, text=True, check=True)
    return out.stdout


def test_slurm_metacharacters_stay_inert(tmp_path):
    ctx, marker, _ = evil_context("slurm", tmp_path)
    files = get_backend("slurm").render(ctx).files
    batch = files["job.sbatch"]
    # sbatch reads directives up to the first line that is not a comment.
    header = batch.split("\nset -euo pipefail\n")[0].splitlines()
    assert all(line.startswith("#") for line in header)
    directives = [line for line in header if line.startswith("#SBATCH")]
    assert all(" " not in line.removeprefix("#SBATCH ") for line in directives)
    assert not any("--wrap" in line for line in directives)
    out = _run_with_stubs(batch.replace("exec srun", "srun"), tmp_path, {"srun": 'echo srun "$@"'})
    assert out.startswith("srun --ntasks-per-node=1 --kill-on-bad-exit=1")
    for k in (0, 1):
        node = _run_with_stubs(files[f"node-{k}.sh"], tmp_path, {})
        assert "--rdzv-id=quick-x" in node
    assert not marker.exists()


def test_ssh_and_kubernetes_scripts_stay_inert(tmp_path):
    ctx, marker, evil = evil_context("ssh", tmp_path, {"hosts": ["a", "b"]})
    for text in get_backend("ssh").render(ctx).files.values():
        _run_with_stubs(text, tmp_path, {})
    ctx, marker, evil = evil_context("kubernetes", tmp_path, {"kubernetes": KUBE})
    manifest = get_backend("kubernetes").render(ctx).files["manifests.yaml"]
    docs = list(yaml.safe_load_all(manifest))
    assert docs[0]["data"]["spec.yaml"] == evil  # data survives YAML exactly
    pod = docs[0]["data"]["pod.sh"]
    out = _run_with_stubs(pod, tmp_path, {"mkdir": ":", "cp": ":"})
    assert "--rdzv-endpoint=quick-x-touch" in out
    assert all(len(d["metadata"]["name"]) <= 63 for d in docs)
    assert not marker.exists()


def test_directive_values_are_refused_when_not_one_word():
    # The spec refuses such a partition; a RunContext built in Python must be refused too.
    unchecked = SlurmSpec.model_construct(partition="a\n#SBATCH --wrap=x")
    with pytest.raises(ValueError, match="cannot go into a directive line"):
        get_backend("slurm").render(context("slurm", {"slurm": unchecked}))


def test_backends_refuse_what_they_cannot_run():
    with pytest.raises(BackendError, match="one host per node: 1 host"):
        get_backend("ssh").render(context("ssh", {"nodes": 1, "hosts": ["a"]}))
    with pytest.raises(BackendError, match="needs hardware.kubernetes"):
        get_backend("kubernetes").render(context("kubernetes", {}))
    loopback = context("kubernetes", {"kubernetes": KUBE}, rdzv_endpoint="127.0.0.1:29400")
    with pytest.raises(BackendError, match="pods cannot reach the rendezvous at 127.0.0.1"):
        get_backend("kubernetes").render(loopback)
    uneven = context("kubernetes", {"kubernetes": KUBE}, nproc_per_node=[2, 1])
    with pytest.raises(BackendError, match="pods are identical"):
        get_backend("kubernetes").render(uneven)


CLI_SPEC_HARDWARE = {
    "hardware.hosts": ["gpu-a", "gpu-b"],
    "hardware.rendezvous_host": "10.0.0.5",
    "hardware.rendezvous_port": 29400,
    "hardware.kubernetes": KUBE,
}
CLI_FILES = {
    "local": ["node-0.sh", "node-1.sh"],
    "slurm": ["job.sbatch", "node-0.sh", "node-1.sh"],
    "ssh": ["node-0.sh", "node-1.sh"],
    "kubernetes": ["manifests.yaml"],
}


@pytest.mark.parametrize("backend", sorted(CLI_FILES))
def test_cli_renders_every_backend(backend, tmp_path):
    from typer.testing import CliRunner

    from jobctl.engine.cli.app import app

    from ..jobrun import tiny_spec

    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(dump_yaml(tiny_spec(**CLI_SPEC_HARDWARE)))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["render", str(spec_file), "--backend", backend, "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    out = out / "run" / "scripts"  # the layout of a run's folder
    assert sorted(p.name for p in out.iterdir()) == sorted(CLI_FILES[backend])
    for name, text in scripts({p.name: p.read_text() for p in out.iterdir()}).items():
        path = tmp_path / name.replace(":", "-")
        path.write_text(text)
        subprocess.run(["bash", "-n", str(path)], check=True)


def test_the_stop_trap_survives_a_burst_of_sigterms(tmp_path):
    """A stop sends SIGTERM to a node script and to its process group, so the TERM trap
    can be re-entered. A command substitution in it (bash 5.2 parses it each time it
    runs) failed mid-parse with "unexpected EOF while looking for matching `)'" and
    exit 2 in about 4 of 10 bursts, so the node never passed the stop on and wrote no
    checkpoint (seen in CI). The rendered ``on_term``, in a harness that waits as the
    node script does, must take every burst."""
    import signal
    import time

    text = rendered("local").files["node-0.sh"]
    start = text.index("on_term() {")
    body = text[start : text.index("\n}\n", start) + 3]
    harness = tmp_path / "harness.sh"
    harness.write_text(
        "set -euo pipefail\nJOBCTL_RUN_DIR="
        + str(tmp_path)
        + "\nagent=''\n"
        + body
        + "told_to_stop=0\ntrap on_term TERM\n"
        # an agent that outlives the burst, off the stderr pipe the test reads
        + "(trap '' TERM; exec sleep 5 >/dev/null 2>&1) & agent=$!\n"
        + 'while :; do wait "$agent" || true; kill -0 "$agent" 2>/dev/null || break; done\n'
    )
    for _ in range(10):
        proc = subprocess.Popen(["bash", str(harness)], stderr=subprocess.PIPE, text=True)
        time.sleep(0.05)  # the trap is set
        for k in range(40):
            if proc.poll() is not None:
                break
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.0002 * (k % 5))
        if proc.poll() is None:
            proc.kill()
        err = proc.communicate(timeout=10)[1]
        assert "unexpected EOF" not in err and "syntax error" not in err, err
    noted = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert noted and all('"kind": "node_sigterm"' in line for line in noted)
