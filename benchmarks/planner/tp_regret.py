"""The planner's T choice (Merak 4.1, ``planner.tp_search``) against measured layouts.

A 4-process world on this machine (one node of 4 CPU processes, one thread each)
trains a tiny traced GPT-2 through the real launch path (``jobbench.measure``: the
local backend, the runtime's own step times). The planner plans it with
``tensor_parallel``, ``pipeline_stages`` and ``data_parallel`` all ``auto`` (its
pick); then every layout of T in {1, 2} x (P, D) on the 4 processes, and the pick
if it is none of them, is planned with T, P and D fixed (the same schedule and m)
and run. Rounds alternate: each round runs every layout once, in a rotated order, so
drift in the machine's speed falls on all of them alike; a layout's figure is the
median over rounds of its median step after warm-up. Prints predicted and measured
seconds per step, the regret (the pick's measured throughput over the best
measured one) and the predicted against the measured order (Kendall's tau).

    python -m benchmarks run tp_regret [--rounds 2] [--steps 25] [--width 64]
        [--layers 2] [--seq 32] [--layouts 5] [--patience 10]

``--layouts N`` runs the pick and the first N of the five fixed layouts only (1: the
pick against T = 2 P = 1 D = 2); ``--patience`` is how long each run waits for a quiet
CPU.

A traced model has no measured calibration (``jobctl calibrate`` measures hand-cut
blocks only), so the planner prices it analytically: FLOPs from the subgraphs' real
shapes at the hardware's rate, the T all-reduces by the analytic intra-node link
model; on CPU such predictions are often several times optimistic, and the order is
what matters here. The machine has 2 cores shared with other work: 4 processes are
2 per core, and a T group's all-reduces compete for those cores with compute.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
from pathlib import Path

from benchmarks.lib.decision_quality import kendall_tau, regret
from benchmarks.lib.jobbench import QUICKSTART, WARMUP_STEPS, measure, wait_quiet
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.planner.tp_search import with_T
from jobctl.spec import load_spec

QUESTION = "Does the planner's tensor-parallel choice of (T, P, D) pick the fastest layout?"
BASELINE = (
    "Every T in {1, 2} x (P, D) layout of the 4 processes, run for real in alternating rounds."
)

WORLD = 4
# (T, P, D); T alternating, so the first few (--layouts N) already hold a T = 2 one
LAYOUTS = [(2, 1, 2), (1, 1, 4), (2, 2, 1), (1, 2, 2), (1, 4, 1)]


def job_yaml(args) -> str:
    """jobs/quickstart.yaml as a traced GPT-2 on one node of 4 processes, T/P/D auto."""
    gpt2 = (
        f"  huggingface:\n    class: GPT2LMHeadModel\n    config: {{n_layer: {args.layers}, "
        f"n_embd: {args.width}, n_head: 4, vocab_size: 256, n_positions: {args.seq}, "
        "resid_pdrop: 0.0, embd_pdrop: 0.0, attn_pdrop: 0.0}"
    )
    edits = [
        ("  seq_len: 32", f"  seq_len: {args.seq}"),
        ("  steps: 60", f"  steps: {args.steps}"),
        ("  nodes: 2\n  processes_per_node: 2", f"  nodes: 1\n  processes_per_node: {WORLD}"),
        (
            "  pipeline_stages: 2\n  data_parallel: 2",
            "  pipeline_stages: auto\n  data_parallel: auto\n  tensor_parallel: auto",
        ),
        ("  interval: 30", "  interval: 100000"),
    ]
    # the builtin family's lines, matched by field so a reworded comment does not break it
    builtin = r"  family: gpt\n(?:  (?:layers|hidden|heads):.*\n)+"
    text, n = re.subn(builtin, lambda _: gpt2 + "\n", QUICKSTART.read_text())
    if n != 1:
        raise SystemExit("jobs/quickstart.yaml changed: its builtin gpt model block not found")
    for old, new in edits:
        if old not in text:
            raise SystemExit(f"jobs/quickstart.yaml changed: {old!r} not found")
        text = text.replace(old, new)
    return text


def fixed(spec, T: int, P: int, D: int):
    """``spec`` with T, P and D fixed."""
    par = with_T(spec, T).parallelism.model_copy(update={"pipeline_stages": P, "data_parallel": D})
    return spec.model_copy(update={"parallelism": par})


def plans(spec, home: Path, layouts: list[tuple]) -> tuple[tuple, dict]:
    """The planner's pick (T, P, D) and a plan per layout to run (``layouts`` and it)."""
    auto = make_plan(spec, home=home)
    pick = (auto.T, auto.P, auto.D)
    print(
        f"planner's pick: T={auto.T} P={auto.P} D={auto.D} m={auto.micro_batch_size} "
        f"{auto.schedule} ({auto.prediction.source}: {auto.prediction.step_time_s:.4g} "
        "s/step)"
    )
    for line in auto.t_search:
        print(line)
    out = {}
    for T, P, D in dict.fromkeys([*layouts, pick]):
        s = fixed(spec, T, P, D)
        out[T, P, D] = (s, make_plan(s, home=home))
    return pick, out


def label(k: tuple) -> str:
    return f"T={k[0]} P={k[1]} D={k[2]}"


def run_rounds(planned: dict, home: Path, rounds: int, patience: float) -> dict:
    """Median step seconds per layout over ``rounds`` alternating rounds, each run
    after up to ``patience`` s of waiting for a quiet CPU."""
    keys = list(planned)
    seen: dict = {k: [] for k in keys}
    for r in range(rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        for k in order:
            wait_quiet(patience_s=patience)
            spec, plan = planned[k]
            got = measure(spec, plan, home)
            seen[k].append(got.step_s)
            print(
                f"  round {r + 1} {label(k)}: {1e3 * got.step_s:.1f} ms (others took "
                f"{100 * got.interference:.0f} % of the CPU)",
                flush=True,
            )
    return {k: statistics.median(v) for k, v in seen.items()}


def report(pick: tuple, planned: dict, measured: dict) -> None:
    keys = list(planned)
    pred = [1 / planned[k][1].prediction.step_time_s for k in keys]
    real = [1 / measured[k] for k in keys]
    print(
        f"{'layout':<14}{'devices':>8}{'predicted ms':>14}{'measured ms':>13}"
        f"{'pred rank':>11}{'meas rank':>11}"
    )
    rank_p = {k: i + 1 for i, k in enumerate(sorted(keys, key=lambda k: -pred[keys.index(k)]))}
    rank_m = {k: i + 1 for i, k in enumerate(sorted(keys, key=lambda k: measured[k]))}
    for k in keys:
        plan = planned[k][1]
        mark = " <- pick" if k == pick else ""
        print(
            f"{label(k):<14}{plan.world_size:>8}"
            f"{1e3 * plan.prediction.step_time_s:>14.2f}{1e3 * measured[k]:>13.2f}"
            f"{rank_p[k]:>11}{rank_m[k]:>11}{mark}"
        )
    best = min(keys, key=lambda k: measured[k])
    ratio = measured[best] / measured[pick]
    print(
        f"regret: pick/best measured throughput = {ratio:.3f} (best: {label(best)}); "
        f"1 - that = {regret(pred, real):.3f} by the highest "
        f"predicted; Kendall tau (predicted vs measured order) = {kendall_tau(pred, real):.2f}"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--layouts", type=int, default=len(LAYOUTS), help="the pick and N of 5")
    p.add_argument("--patience", type=float, default=10.0, help="s to wait for a quiet CPU")
    args = p.parse_args(argv)
    if args.steps <= WARMUP_STEPS + 2:
        raise SystemExit(f"--steps must exceed the {WARMUP_STEPS} warm-up steps by 3")
    with tempfile.TemporaryDirectory(prefix="tp-regret-") as tmp:
        home, path = Path(tmp) / "home", Path(tmp) / "job.yaml"
        path.write_text(job_yaml(args))
        spec = load_spec(path)
        pick, planned = plans(spec, home, LAYOUTS[: args.layouts])
        measured = run_rounds(planned, home, args.rounds, args.patience)
        report(pick, planned, measured)


if __name__ == "__main__":
    main()
