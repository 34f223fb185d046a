"""AvgPipe's (M, N) tuning (sec. 5.2) for a spec: profile one setting, predict every
setting, and resolve ``parallel_pipelines: auto`` and ``micro_batches`` into a spec
the planner and the workers run as written.

``resolve(spec)``: a spec without ``auto`` N or M comes back with its micro-batch
size B / (D N M) written out (``micro_batches`` removed: the two say the same).
Otherwise the profiled setting is the candidates' smallest N with its largest M
(the smallest micro-batches: a rank far from its peak rate, as sec. 5.2.1 asks);
its P ranks (one replica) run ``profile_rank`` for twenty batches as processes of
this machine; ``planning.tuning`` predicts each candidate and picks the
fastest that fits ``hardware.memory_gb``. A profile is kept under the state home
(``cache/avgpipe/``) by the spec's model, batch, layout and optimizer, so ``plan``
then ``apply`` profile once.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

from jobctl.engine.averaging.planning.tuning import Profile, StageProfile, Tuning, tune
from jobctl.engine.core.home import default_home
from jobctl.engine.core.process import free_port
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.planner.sizing import GB
from jobctl.engine.schedule.checks import peak_activations
from jobctl.engine.schedule.generators import generate
from jobctl.spec import JobSpec
from jobctl.spec.averaging import TUNED_N_MAX, elastic_settings
from jobctl.spec.loader import load_spec_text
from jobctl.spec.serialization import dump_yaml

TIMEOUT_S = 600.0
PROFILE_VERSION = 3  # in the cache key: what a profile holds (3: the sizes timed)


def replica_batch(spec: JobSpec) -> int:
    """B: the samples one replica's N pipelines share per step (global / D)."""
    return spec.training.global_batch_size // spec.parallelism.data_parallel


def settings(spec: JobSpec) -> list[tuple[int, int]]:
    """The (M, N) the spec allows (``spec.averaging.elastic_settings``)."""
    par, t = spec.parallelism, spec.training
    fixed = [v if isinstance(v, int) else None for v in (par.micro_batches, par.parallel_pipelines)]
    size = t.micro_batch_size if isinstance(t.micro_batch_size, int) else None
    return elastic_settings(replica_batch(spec), TUNED_N_MAX, *fixed, size)


def concrete(spec: JobSpec, M: int, N: int) -> JobSpec:
    """``spec`` at (M, N): N and the micro-batch size B / (N M) written out."""
    size = replica_batch(spec) // (N * M)
    overrides = {
        "parallelism.parallel_pipelines": N,
        "parallelism.micro_batches": None,
        "training.micro_batch_size": size,
    }
    return load_spec_text(dump_yaml(spec), "<tuned spec>", overrides=overrides)


def resolve(spec: JobSpec, home: Path | None = None) -> tuple[JobSpec, Tuning | None]:
    """``spec`` with N and M resolved, and the tuning when they were ``auto``."""
    par = spec.parallelism
    untouched = par.micro_batches is None and par.parallel_pipelines != "auto"
    if par.averaging != "elastic" or untouched:
        return spec, None
    options = settings(spec)
    if "auto" not in (par.micro_batches, par.parallel_pipelines):
        return concrete(spec, *options[0]), None
    n = min(N for _, N in options)
    m = max(M for M, N in options if n == N)
    sizes = sorted({replica_batch(spec) // (M * N) for M, N in options})
    profile = cached_profile(spec, m, n, home, sizes)
    plan = make_plan(concrete(spec, m, n))
    tuning = tune(profile, options, spec.hardware.memory_gb * GB, peaks_for(plan))
    return concrete(spec, tuning.pick.M, tuning.pick.N), tuning


def peaks_for(plan):
    """K -> each stage's peak of micro-batches held, for ``plan``'s schedule at K."""
    recompute = any(s.recompute for s in plan.stages)

    def peaks(K: int) -> list[int]:
        opts = {"recompute": True} if recompute else {}
        try:
            lists = generate(plan.schedule, plan.P, K, **opts)
        except (ValueError, TypeError):  # a list this schedule cannot make: all held
            return [K] * plan.P
        return [peak_activations(actions).full for actions in lists]

    return peaks


def cached_profile(spec: JobSpec, m: int, n: int, home: Path | None, sizes: list[int]) -> Profile:
    """The profile of (m, n), with the stage alone timed at ``sizes`` (the
    candidates' micro-batch sizes), from the state home's cache or measured now."""
    text = f"v{PROFILE_VERSION}\n{sizes}\n{dump_yaml(concrete(spec, m, n))}"
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = Path(home or default_home()) / "cache" / "avgpipe" / f"{key}.json"
    if path.exists():
        return profile_from(json.loads(path.read_text()))
    raw = measure_profile(concrete(spec, m, n), m, n, sizes)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw))
    return profile_from(raw)


def measure_profile(spec: JobSpec, m: int, n: int, sizes: list[int]) -> dict:
    """Run the P ranks of ``spec``'s plan (replica 0) for the profile, each stage
    also timed alone at ``sizes``; the raw per-rank results with the setting."""
    plan = make_plan(spec)
    B = replica_batch(spec)
    job = {
        "spec": spec,
        "P": plan.P,
        "N": n,
        "size": plan.micro_batch_size,
        "B": B,
        "sizes": sizes,
        "blocks": [s.blocks for s in plan.stages],
        "keep": [s.keep_blocks for s in plan.stages],
        "actions": [s.action_list() for s in plan.stages],
    }
    with tempfile.TemporaryDirectory(prefix="jobctl-avgpipe-") as tmp:
        ranks = _run_ranks(job, Path(tmp))
    return {"m": m, "n": n, "B": B, "ranks": ranks, "per_message": spec.hardware.one_machine}


def _run_ranks(job: dict, tmp: Path) -> list[dict]:
    """``job["P"]`` processes of ``profile_rank`` (gloo on 127.0.0.1); their results."""
    (tmp / "job.pkl").write_bytes(pickle.dumps(job))
    port = free_port()
    procs = []
    for rank in range(job["P"]):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(job["P"]),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        cmd = [sys.executable, "-m", "jobctl.engine.averaging.profile_rank", str(tmp)]
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
    errors = []
    for rank, p in enumerate(procs):
        try:
            _, stderr = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            _, stderr = p.communicate()
        if p.returncode:
            errors.append(f"rank {rank}: {stderr.strip().splitlines()[-1:]}")
    if errors:
        raise RuntimeError(f"the (M, N) profile failed: {'; '.join(errors)}")
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(job["P"])]


def profile_from(raw: dict) -> Profile:
    """The raw per-rank measurements as eq. 1-8's per-stage quantities (means over
    the profiled batches; each message counted once, at its sender: T^k is this
    stage's sends plus its neighbours' sends to it)."""
    ranks, P = raw["ranks"], len(raw["ranks"])
    stages = []
    for k, r in enumerate(ranks):
        batches = len(r["actions"])
        sent = _mean([f + b for f, b in r["sent"]])
        if k > 0:
            sent += _mean([f for f, _ in ranks[k - 1]["sent"]])
        if k < P - 1:
            sent += _mean([b for _, b in ranks[k + 1]["sent"]])
        v = {"F": r["v_F"], "B": r["v_B"]}
        phi = tuple(
            (s / batches, min(1.0, r["size"] * v[kind] / s))
            for acts in r["actions"]
            for kind, s in acts
            if s > 0
        )
        stages.append(
            StageProfile(
                T_gpu=sum(dt for dt, _ in phi),
                T=sent,
                phi=phi,
                T_upd=_mean(r["update"]),
                F_mod=r["F_mod"],
                F_ref=r["F_ref"],
                F_dat=r["dat_per_sample"] * r["size"] * r["peak"],
                peak=r["peak"],
                timed=tuple((int(z), t) for z, t in r.get("timed", ())),
            )
        )
    return Profile(raw["m"], raw["n"], raw["B"], tuple(stages), raw["per_message"])


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0
