"""The backends' render inputs shared by the render, backend and cluster tests: the
``RunContext`` of a two-node run, the rendered cases pinned by ``tests/golden``, and a
context full of shell metacharacters."""

from __future__ import annotations

from pathlib import Path

from jobctl.backends import RunContext, get_backend
from jobctl.spec import ElasticitySpec
from jobctl.spec.sections import HardwareSpec

INPUTS = {"spec.yaml": "name: quick\n", "plan.json": '{"P": 2, "D": 2}\n'}
KUBE = {"image": "ghcr.io/acme/jobctl:0.1"}
CHANNEL_SECRET = "s3cr3t-Value_of-the-channel"  # must appear in no rendered artifact

CASES: dict[str, tuple[str, dict, dict]] = {
    # case: (backend, hardware fields, other RunContext fields)
    "local": ("local", {}, {}),
    "slurm": (
        "slurm",
        {
            "device": "cuda",
            "spot": True,
            "memory_gb": 24,
            "slurm": {
                "partition": "gpu,gpu-spot",
                "account": "ml-team",
                "qos": "low",
                "time_limit_minutes": 720,
                "signal_before_s": 300,
                "sbatch_args": ["--exclusive", "--constraint=a100&ib"],
            },
            "max_restarts": 2,
        },
        {"threads": 4},
    ),
    "slurm-defaults": ("slurm", {"slurm": {"signal_before_s": 0}}, {}),
    "ssh": ("ssh", {"hosts": ["gpu-a", "gpu-b"], "ssh": {"python": "/opt/venv/bin/python"}}, {}),
    "kubernetes-pytorchjob": (
        "kubernetes",
        {
            "device": "cuda",
            "spot": True,
            "nodes": 4,
            "kubernetes": {
                **KUBE,
                "namespace": "training",
                "secrets": ["s3-credentials", "wandb"],
                "node_selector": {"cloud.google.com/gke-spot": "true", "gpu": "a100"},
                "service_account": "trainer",
                "volume_claim": "runs",
            },
        },
        {
            "elasticity": ElasticitySpec(enabled=True, min_devices=2, max_devices=8),
            "env": {"JOBCTL_CHANNEL_URL": "http://10.0.0.5:29500"},  # pods post events
            "secret_env": {"JOBCTL_CHANNEL_SECRET": CHANNEL_SECRET},
        },
    ),
    "kubernetes-jobset": (
        "kubernetes",
        {"kubernetes": {**KUBE, "kind": "jobset"}, "max_restarts": 3},
        {"rdzv_endpoint": "supervisor.example.com:29400"},
    ),
    "kubernetes-trainjob": (
        "kubernetes",
        {
            "device": "cuda",
            "max_restarts": 2,
            "kubernetes": {
                **KUBE,
                "kind": "trainjob",
                "namespace": "training",
                "secrets": ["s3-credentials"],
            },
        },
        {
            "env": {"JOBCTL_CHANNEL_URL": "http://10.0.0.5:29500"},  # pods post events
            "secret_env": {"JOBCTL_CHANNEL_SECRET": CHANNEL_SECRET},
        },
    ),
}


def context(backend: str, hardware: dict, run_dir: Path = Path("/runs/quick-1"), **kw):
    """A two-node, two-processes-per-node run of ``backend``; ``kw`` overrides fields."""
    fields = {
        "run_id": "quick-1",
        "run_dir": run_dir,
        "nnodes": 2,
        "nproc_per_node": [2, 2],
        "rdzv_endpoint": "10.0.0.5:29400",
        "python": "/usr/bin/python3",
        "inputs": INPUTS,
        "hardware": HardwareSpec(
            **{"backend": backend, "nodes": 2, "processes_per_node": 2, **hardware}
        ),
        **kw,
    }
    return RunContext(**fields)


def rendered(case: str):
    backend, hardware, extra = CASES[case]
    return get_backend(backend).render(context(backend, hardware, **extra))


EVIL = "x'; touch {m}; echo '$(touch {m})`touch {m}`\ntouch {m}\n#SBATCH --wrap=touch {m}"


def evil_context(backend: str, tmp_path: Path, hardware: dict | None = None):
    """A ``context`` whose run directory, run id, environment and inputs carry ``EVIL``;
    returns it, the marker file that ``EVIL`` would create, and the evil string."""
    marker = tmp_path / "pwned"
    evil = EVIL.format(m=marker)
    ctx = context(
        backend,
        hardware or {},
        run_dir=tmp_path / evil.replace("/", "_"),
        run_id=f"quick-{evil}",
        env={"USER_NOTE": evil},
        inputs={"spec.yaml": evil, "plan.json": "{}"},
    )
    return ctx, marker, evil
