"""The hostile-input probe of #46 as a suite of its own: zero tracebacks, hangs or
executed payloads, on today's code, every time the suite runs.

The probe had four shapes; three are here, the fourth is ``tests/unit/test_fuzz_inputs.py``
(a bounded hypothesis run over every shipped spec, hostile values in place of each value):

* **Injection.** Every string field of the spec that accepts a shell payload (found by
  trying each field, not from a list) carries it; the job is rendered for every backend
  (`jobctl render --out`) and ``start.sh`` runs, with the node scripts, the Slurm batch
  script and the Kubernetes pod script, against stand-ins for python, sbatch, srun, ssh
  and kubectl that record what they are asked. No payload may run.
* **Tampered checkpoints through a real resume.** A real run's checkpoints are
  tampered three ways and re-signed in their manifests (a wrong-shape shard, a foreign
  pickle, a nonsense ``meta.json``); the next run of the job skips each with a warning
  and trains on from the newest loadable step, equal to an untampered run.
* **Damaged state DBs through every command.** Each damage (not a database, a
  truncated one, a foreign ``runs`` table, a renamed table) is one line naming the DB
  and the fix, exit 2, from every command that opens it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.spec import SpecError, load_spec_text
from jobctl.spec.reference import entries

from ..jobrun import JOBCTL, QUICKSTART, ROOT, run_job, step_losses, tiny_spec
from ..unit.test_checkpoint_contents import _foreign_pickle, _nonsense_meta, _wrong_shape

pytestmark = pytest.mark.slow

PAYLOADS = [
    "x$(touch {m})",
    "x`touch {m}`",
    "x'; touch {m}; echo '",
    'x"; touch {m}; echo "',
    "x;touch {m}",
    "-x",
]
BACKENDS = {
    "local": {},
    "slurm": {"rendezvous_host": "10.0.0.5", "slurm": {}},
    "ssh": {"rendezvous_host": "10.0.0.5", "hosts": ["gpu-a", "gpu-b"], "ssh": {}},
    "kubernetes": {
        "rendezvous_host": "10.0.0.5",
        "rendezvous_port": 29400,
        "kubernetes": {"image": "ghcr.io/acme/jobctl:0.1"},
    },
}

# Stand-ins, on PATH before the real ones. python: the run host writes host.json (what
# start.sh waits for), anything else is recorded. sbatch runs its batch script; srun runs
# its command once per node; ssh runs the remote command here, in a folder of its own
# per host (its tar on stdin lands in that host's copy of the run folder); kubectl
# applies nothing and says the pods succeeded.
PYTHON = """#!{python}
import json, os, sys
with open(os.path.join(os.environ["REC"], "python.calls"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if "jobctl.engine.channel.host" in sys.argv:
    conf = json.loads(os.environ["JOBCTL_HOST_CONF"])
    open(os.path.join(conf["run_dir"], "host.json"), "w").write("{{}}")
"""
STANDINS = {
    "sbatch": '#!/usr/bin/env bash\nexec bash "${@: -1}"\n',
    "srun": (
        "#!/usr/bin/env bash\n"
        'while [ "${1:0:2}" = -- ]; do shift; done\n'
        'for k in 0 1; do SLURM_NODEID=$k "$@"; done\n'
    ),
    # Each host has its own root, as real hosts do: were the remote command to unpack
    # into the very run folder the next host's tar is reading, tar -x's unlinking of
    # plan.json races that read (CI read "tar: plan.json: Cannot stat").
    "ssh": (
        "#!/usr/bin/env bash\n"
        'cmd="${@: -1}"; root="$REC/hosts/${@: -2:1}"\n'
        'exec bash -c "${cmd//"$RUN"/"$root$RUN"}"\n'
    ),
    "kubectl": (
        "#!/usr/bin/env bash\n"
        'printf "%s\\n" "$*" >> "$REC/kubectl.calls"\n'
        'if [ "$1" = get ]; then echo "Succeeded Succeeded"; fi\n'
    ),
}


def _base(backend: str) -> dict:
    spec = yaml.safe_load(QUICKSTART.read_text())
    spec["training"]["steps"] = 2
    spec["hardware"].update({"backend": backend, **copy.deepcopy(BACKENDS[backend])})
    return spec


def _string_fields() -> dict[str, str]:
    """Each leaf of the spec that holds text (a string, a list of strings, a mapping to
    strings), by dotted path, with that shape: 'str', 'list' or 'map'."""
    found = {}
    for entry in entries():
        branches = [entry.schema, *entry.schema.get("anyOf", [])]
        for b in branches:
            extra = b.get("additionalProperties")
            if b.get("type") == "string" and not {"enum", "const"} & set(b):
                found[entry.path] = "str"
            elif b.get("type") == "array" and b.get("items", {}).get("type") == "string":
                found[entry.path] = "list"
            elif isinstance(extra, dict) and extra.get("type") == "string":
                found[entry.path] = "map"
    return found


def _with(spec: dict, path: str, shape: str, payload: str) -> dict:
    out = copy.deepcopy(spec)
    *sections, key = path.split(".")
    here = out
    for name in sections:
        here = here.setdefault(name, {})
    here[key] = {"str": payload, "list": [payload], "map": {"NOTE": payload}}[shape]
    return out


def _accepted(spec: dict, payload: str) -> tuple[dict, list[str]]:
    """``spec`` with ``payload`` in every text field that validates with it (each tried
    alone first, then all at once), and those fields."""
    taken = []
    for path, shape in _string_fields().items():
        try:
            load_spec_text(yaml.safe_dump(_with(spec, path, shape, payload)), "job.yaml")
        except SpecError:
            continue
        spec = _with(spec, path, shape, payload)
        taken.append(path)
    load_spec_text(yaml.safe_dump(spec), "job.yaml")  # together too
    return spec, taken


def _standins(tmp_path: Path) -> tuple[Path, Path]:
    bin_dir, rec = tmp_path / "bin", tmp_path / "rec"
    bin_dir.mkdir()
    rec.mkdir()
    (bin_dir / "python").write_text(PYTHON.format(python=sys.executable))
    for name, text in STANDINS.items():
        (bin_dir / name).write_text(text)
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    return bin_dir, rec


def _point_at_standin(out: Path, python: Path) -> None:
    """Every rendered file that runs this machine's python runs the stand-in instead."""
    for path in out.rglob("*"):
        if path.is_file() and path.suffix in (".sh", ".sbatch", ""):
            text = path.read_text()
            path.write_text(text.replace(sys.executable, str(python)))


def _run_pod_scripts(out: Path, env: dict, tmp_path: Path) -> None:
    """A Kubernetes render's pod script, as each pod runs it (mkdir/cp of its /jobctl
    paths stubbed: they are the pod's, not this machine's)."""
    for doc in yaml.safe_load_all((out / "run" / "scripts" / "manifests.yaml").read_text()):
        if doc["kind"] == "ConfigMap":
            pod = tmp_path / "pod.sh"
            stubs = "mkdir() { :; }\ncp() { :; }\n"
            pod.write_text(doc["data"]["pod.sh"].replace("pipefail\n", "pipefail\n" + stubs, 1))
            for index in (0, 1):  # each pod of the job runs it
                pod_env = {**env, "JOB_COMPLETION_INDEX": str(index)}
                done = subprocess.run(["bash", str(pod)], env=pod_env, capture_output=True)
                assert done.returncode == 0, done.stderr


def _pwned(tmp_path: Path) -> list[Path]:
    """Every file a payload would have made: ``PWNED`` in whatever folder it ran in."""
    return [*tmp_path.rglob("PWNED"), *ROOT.glob("PWNED")]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("template", PAYLOADS)
def test_no_payload_in_any_spec_field_runs_on_any_backend(tmp_path, monkeypatch, backend, template):
    payload = template.format(m="PWNED")  # made in the folder it runs in, if it runs
    monkeypatch.chdir(tmp_path)
    (tmp_path / payload).write_text("")  # for the fields naming a file that must exist
    spec, taken = _accepted(_base(backend), payload)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["render", str(job), "--out", str(out)])
    assert r.exit_code == 0, r.output
    bin_dir, rec = _standins(tmp_path)
    _point_at_standin(out, bin_dir / "python")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REC": str(rec)}
    env["RUN"] = str(out / "run")
    env.pop("JOBCTL_HOME", None)
    done = subprocess.run(
        ["bash", str(out / "start.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    if backend == "kubernetes":
        _run_pod_scripts(out, env, tmp_path)
    calls = [json.loads(line) for line in (rec / "python.calls").read_text().splitlines()]
    agents = [c for c in calls if "jobctl.engine.worker.agent" in c or "torch" in " ".join(c)]
    assert len(agents) == 2, calls  # both nodes' launch lines ran, with the payload in reach
    assert not _pwned(tmp_path), f"{payload!r} in {taken} ran on {backend}"
    assert taken or template == "-x", "no field took the payload: nothing was probed"


# ---- tampered checkpoints through a real resume ---------------------------------------


def _resign(folder: Path) -> None:
    """Rewrite ``folder``'s manifest for its files as they are now (what anyone with write
    access to the store can do): sizes and sha256 vouch for the tampered bytes."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        data = (folder / name).read_bytes()
        entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.multiproc
def test_tampered_resigned_checkpoints_are_skipped_by_a_real_resume(tmp_path, caplog):
    shared = tmp_path / "ckpt"
    over = {
        "checkpoint.interval": 2,
        "checkpoint.local_dir": str(shared),
        "checkpoint.keep_last": 9,
    }
    over |= {"training.optimizer": "sgd", "training.lr": 0.3}
    over |= {"parallelism.pipeline_stages": 1, "parallelism.data_parallel": 1}
    first, outcome = run_job(tiny_spec(**over, **{"training.steps": 8}), tmp_path / "a", 1)
    assert outcome.ok, outcome.message
    for step, tamper in ((8, _wrong_shape), (6, _foreign_pickle), (4, _nonsense_meta)):
        folder = shared / f"step-{step:08d}"
        tamper(folder)
        _resign(folder)
    clean, outcome = run_job(tiny_spec(**over, **{"training.steps": 10}), tmp_path / "c", 1)
    assert outcome.ok, outcome.message  # it resumed past the three, from step 2
    resumed = step_losses(clean.dir)
    assert len(resumed) == 8  # steps 3..10
    untampered = shutil.copytree(shared, tmp_path / "reference-ckpt")
    for step in (4, 6, 8, 10):
        shutil.rmtree(untampered / f"step-{step:08d}")
    ref_over = {**over, "checkpoint.local_dir": str(untampered), "training.steps": 10}
    ref, outcome = run_job(tiny_spec(**ref_over), tmp_path / "r", 1)
    assert outcome.ok, outcome.message
    assert resumed == pytest.approx(step_losses(ref.dir), abs=1e-6)


# ---- damaged state DBs through every command ------------------------------------------


def _not_a_db(home: Path) -> None:
    (home / "state.db").write_bytes(b"not a database at all " * 100)


def _truncated(home: Path) -> None:
    con = sqlite3.connect(home / "state.db")
    con.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT, phase TEXT)")
    con.executemany("INSERT INTO runs VALUES (?, 'r', 'training')", [(str(i),) for i in range(500)])
    con.commit()
    con.close()
    data = (home / "state.db").read_bytes()
    (home / "state.db").write_bytes(data[: len(data) // 3])


def _foreign(home: Path) -> None:
    con = sqlite3.connect(home / "state.db")
    con.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, invoice TEXT)")
    con.commit()
    con.close()


def _renamed(home: Path) -> None:
    con = sqlite3.connect(home / "state.db")
    con.execute("CREATE TABLE runs_old (id TEXT)")
    con.execute(
        "CREATE TABLE events (id INTEGER PRIMARY KEY, run_id TEXT, ts FLOAT, kind TEXT, "
        "message TEXT, data TEXT)"
    )
    con.commit()
    con.close()


DAMAGES = {"not_a_db": _not_a_db, "truncated": _truncated, "foreign": _foreign, "renamed": _renamed}
COMMANDS = [
    ["status"],
    ["status", "quickstart"],
    ["events", "quickstart"],
    ["logs", "quickstart"],
    ["report", "quickstart"],
    ["resume", "quickstart"],
    ["schedule", "list"],
    ["apply", str(QUICKSTART)],
]


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_state_db_is_one_line_from_every_command(tmp_path, damage):
    home = tmp_path / "home"
    home.mkdir()
    DAMAGES[damage](home)
    before = (home / "state.db").read_bytes()
    env = {k: v for k, v in os.environ.items() if k != "JOBCTL_DB_URL"}
    env |= {"JOBCTL_HOME": str(home), "COLUMNS": "80"}

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        cmd = [*JOBCTL, *argv]
        return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, COMMANDS))
    for argv, done in zip(COMMANDS, results, strict=True):
        said = f"jobctl {' '.join(argv)}: {done.stdout}{done.stderr}"
        assert done.returncode == 2 and "Traceback" not in done.stderr, said
        assert done.stdout == "" and done.stderr.count("\n") == 1, said
        assert f"state DB sqlite:///{home / 'state.db'}" in done.stderr, said
        assert "move it aside" in done.stderr, said
    assert (home / "state.db").read_bytes() == before  # nothing written into it
