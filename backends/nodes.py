"""The per-node launch script every shell backend runs (local, Slurm, ssh).

Node ``k``'s script exports the run's environment and runs one torchrun agent for the
node's processes, joining the c10d rendezvous the supervisor hosts (``is_host=false``).
"""

from __future__ import annotations

import os

from jobctl.engine.core.env import RDZV_ENDPOINT, RUN_DIR, THREADS, WARM_START
from jobctl.engine.core.events import Kind
from jobctl.templates import render

from .base import RunContext


def node_scripts(ctx: RunContext, python: str | None = None) -> dict[str, str]:
    """``node-<k>.sh`` for every node: its torchrun agent joining the run's rendezvous."""
    return {
        f"node-{node}.sh": render(
            "node.sh.j2",
            run_id=ctx.run_id,
            node=node,
            nnodes=ctx.nnodes,
            nproc=ctx.nproc_per_node[node],
            rdzv_endpoint=ctx.rdzv_endpoint,
            python=python or ctx.python,
            max_restarts=ctx.max_restarts,
            env=node_env(ctx),
            sigterm_kind=Kind.NODE_SIGTERM,
        )
        for node in range(ctx.nnodes)
    }


def node_env(ctx: RunContext) -> dict[str, str]:
    """Environment every node script exports."""
    return {
        RUN_DIR: str(ctx.run_dir),
        THREADS: str(ctx.threads),
        "OMP_NUM_THREADS": str(ctx.threads),
        # Restarted workers otherwise time out in gloo init on stale addresses.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        # The workers' process groups meet in the run host's store, which outlives any
        # worker (engine/worker/process.py: a packed-away rank may be the one torchrun made 0).
        RDZV_ENDPOINT: ctx.rdzv_endpoint,
        WARM_START: warm_start(ctx),
        **ctx.env,
    }


def warm_start(ctx: RunContext) -> str:
    """``1``: workers forked from their agent's warm interpreter (engine/worker/agent.py).
    Not on CUDA, where a driver touched before a fork is unusable after it; and not
    where the submitting environment says ``JOBCTL_WARM_START=0`` (fresh interpreters,
    as plain torchrun starts them: ``benchmarks/runtime/launch_time.py`` compares both)."""
    if ctx.hardware.device != "cpu" or os.environ.get(WARM_START) == "0":
        return "0"
    return "1"
