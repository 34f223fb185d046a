"""A run's folder and launch context: register the run, prepare each attempt's plan
and node scripts, and read back what the workers write (metrics, error reports).

Launching the processes and supervising them is the supervisor's (engine/
supervisor.py). The rendezvous store of every attempt lives in the run's detached run
host (engine/channel/host.py), which every torchrun agent joins as a client
(``is_host=false``): losing any worker node, or the supervisor, never takes it along.
"""

from __future__ import annotations

import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from jobctl.backends import Rendered, RunContext, get_backend
from jobctl.engine.core.home import require_run_id
from jobctl.engine.core.plan import Plan
from jobctl.engine.core.process import free_port
from jobctl.engine.state.db import StateDB
from jobctl.spec import JobSpec, dump_yaml, spec_hash


@dataclass
class Run:
    """A prepared run: its id, folder, launch context and rendered scripts."""

    id: str
    dir: Path
    ctx: RunContext
    rendered: Rendered
    plan: Plan
    # Where a Monitor starts reading metrics.jsonl; None: its end (earlier attempts'
    # events are not this attempt's). An adopted run continues where its supervisor died.
    metrics_offset: int | None = None


def new_run_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def run_context(
    spec: JobSpec,
    plan: Plan,
    run_id: str,
    run_dir: Path,
    env: dict[str, str] | None = None,
    port: int | None = None,
    secret_env: dict[str, str] | None = None,
) -> RunContext:
    """Launch context of a plan: nodes, processes per node, rendezvous endpoint."""
    hw = spec.hardware
    port = port or hw.rendezvous_port or free_port(hw.rendezvous_host)
    return RunContext(
        run_id=run_id,
        run_dir=run_dir,
        nnodes=plan.nodes,
        nproc_per_node=plan.node_sizes(),
        rdzv_endpoint=f"{hw.rendezvous_host}:{port}",
        python=sys.executable,
        env=dict(env or {}),
        hardware=hw,
        elasticity=spec.elasticity,
        # Nodes that do not share this disk (Kubernetes, ssh) get these shipped.
        inputs={"spec.yaml": dump_yaml(spec), "plan.json": plan.model_dump_json(indent=2)},
        secret_env=dict(secret_env or {}),
    )


def register_run(spec: JobSpec, db: StateDB, spec_path: str | None, run_id: str, **fields) -> Path:
    """Create a new run's folder (with its spec) and its DB row, in phase ``pending``."""
    run_dir = db.runs_dir / require_run_id(run_id)
    run_dir.mkdir(parents=True, exist_ok=True)  # a remote download may have made it
    (run_dir / "spec.yaml").write_text(dump_yaml(spec))
    db.create_run(
        run_id,
        spec.name,
        run_dir,
        spec_path=spec_path,
        spec_hash=spec_hash(spec),
        total_steps=spec.training.steps,
        **fields,
    )
    return run_dir


def prepare_run(
    spec: JobSpec,
    plan: Plan,
    db: StateDB,
    backend: str,
    run_id: str,
    env: dict[str, str] | None = None,
    secret_env: dict[str, str] | None = None,
) -> Run:
    """Write one attempt of a registered run: its plan, node scripts and DB fields.

    A later attempt (a morph, a resume) keeps the folder, metrics and checkpoints; the
    previous attempt's plan and errors move to ``attempts/<n>/`` so every layout stays
    visible.
    """
    run_dir = db.runs_dir / run_id
    write_plan(run_dir, plan)
    ctx = run_context(spec, plan, run_id, run_dir, env, secret_env=secret_env)
    rendered = get_backend(backend).render(ctx)
    rendered.write(run_dir / "scripts")
    fields = {"devices": plan.world_size, "plan": plan.summary(), "backend": backend}
    db.update_run(run_id, exit_code=None, message=None, **fields)
    return Run(run_id, run_dir, ctx, rendered, plan)


def recorded_run(
    spec: JobSpec, db: StateDB, run_id: str, backend: str, plan: Plan | None, devices
) -> Run:
    """The run as recorded, for an answer when no attempt ran in this process."""
    from jobctl.engine.planner.resolver import make_plan

    run_dir = db.runs_dir / run_id
    path = run_dir / "plan.json"
    if path.exists():
        plan = Plan.model_validate_json(path.read_text())
    elif plan is None:  # stopped before it was ever planned
        plan = make_plan(spec, devices, home=db.home)
    ctx = run_context(spec, plan, run_id, run_dir)
    return Run(run_id, run_dir, ctx, Rendered(backend, {}), plan)


def write_plan(run_dir: Path, plan: Plan) -> None:
    """An attempt's plan as ``plan.json`` (the previous one's archived first)."""
    if (run_dir / "plan.json").exists():
        _archive_plan(run_dir)
    tmp = run_dir / ".plan.json.tmp"  # whole or not at all: survivors read it at once
    tmp.write_text(plan.model_dump_json(indent=2))
    tmp.replace(run_dir / "plan.json")


def _archive_plan(run_dir: Path) -> None:
    """Keep the previous attempt's plan and error reports under ``attempts/<n>/``."""
    attempts = run_dir / "attempts"
    attempts.mkdir(exist_ok=True)
    n = len(list(attempts.iterdir()))
    target = attempts / str(n)
    target.mkdir()
    for name in ("plan.json", "errors"):
        if (run_dir / name).exists():
            (run_dir / name).replace(target / name)


def channel_env(host: str) -> tuple[dict[str, str], dict[str, str], int]:
    """(node env, secret env, port) of a fresh event channel on ``host``.

    The URL goes into the node scripts; the per-run secret only into the environment
    of the submitting command (``RunContext.secret_env``), never into a file.
    ``JOBCTL_CHANNEL=off`` keeps the file sink (nodes append to the shared
    ``metrics.jsonl`` themselves).
    """
    import os

    from jobctl.engine.channel.server import new_secret
    from jobctl.engine.core.env import CHANNEL, CHANNEL_SECRET, CHANNEL_URL

    if os.environ.get(CHANNEL, "on") == "off":
        return {}, {}, 0
    port = free_port(host)
    return {CHANNEL_URL: f"http://{host}:{port}"}, {CHANNEL_SECRET: new_secret()}, port


def last_lines(path: Path, n: int = 20) -> list[str]:
    if not path.exists():
        return []
    return path.read_text(errors="replace").splitlines()[-n:]


def failing_rank(run_dir: Path) -> int | None:
    """The rank whose error was recorded first."""
    errs = sorted((run_dir / "errors").glob("rank-*.txt"), key=lambda p: p.stat().st_mtime)
    return int(errs[0].stem.split("-")[1]) if errs else None
