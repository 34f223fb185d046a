"""The planner's tensor parallelism (Merak 4.1): one rank's costs of a T group
(``tp_costs``, by hand), the facts found on a traced GPT-2, and the search over
T x P x D (``tp_search``): memory per device, slow links, node boundaries, auto's
refusals with why, and the plan table at 80 columns."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from jobctl.engine.calibration.cache import calibration_for
from jobctl.engine.calibration.record import AllreduceCalibration, LinkCalibration, Stat
from jobctl.engine.cli.app import app
from jobctl.engine.planner import tp_costs, tp_overlap, tp_search
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.views.tables import print_plan
from jobctl.spec import load_spec

from ..jobrun import quickstart_with

runner = CliRunner()
GPT2 = (
    "  huggingface:\n    class: GPT2LMHeadModel\n    config: {n_layer: 2, n_embd: 32, "
    "n_head: 4, vocab_size: 256, n_positions: 16}"
)


def _spec(tmp_path, T="auto", P="auto", D="auto", extra=(), per_node=2, nodes=2, model=GPT2):
    edits = [
        (
            "  pipeline_stages: 2\n  data_parallel: 2",
            f"  pipeline_stages: {P}\n  data_parallel: {D}\n  tensor_parallel: {T}",
        ),
        ("  family: gpt", model),
        (
            "  nodes: 2\n  processes_per_node: 2",
            f"  nodes: {nodes}\n  processes_per_node: {per_node}",
        ),
        ("  seq_len: 32", "  seq_len: 16"),
        *extra,
    ]
    return quickstart_with(tmp_path / "job.yaml", *edits)


def _cal(spec, ring: AllreduceCalibration | None = None, p2p_Bps: float | None = None):
    """The analytic calibration with the intra-node all-reduce (and link) replaced;
    with a slow link, compute of 1 ms (3 ms with backward) per sample and block."""
    cal = calibration_for(spec)
    update: dict = {}
    if ring is not None:
        update["allreduce_intra"] = ring
    if p2p_Bps is not None:
        update["p2p_intra"] = LinkCalibration(
            source="analytic", latency_s=0.0, bandwidth_Bps=p2p_Bps
        )
        times = {
            k: {m: Stat(median=x * m * 1e-3) for m in cal.micro_batch_sizes}
            for k, x in (("forward", 1), ("forward_nograd", 1), ("backward", 2))
        }
        update["blocks"] = [b.model_copy(update=times) for b in cal.blocks]
    return cal.model_copy(update=update)


def test_one_rank_costs_by_hand(tmp_path):
    spec = load_spec(_spec(tmp_path))
    ring = AllreduceCalibration(source="analytic", latency_s=1e-5, bandwidth_Bps=1e9)
    cal = _cal(spec, ring)
    b = cal.blocks[1].model_copy(
        update={
            "forward": {1: Stat(median=1.0e-3), 2: Stat(median=1.5e-3)},
            "state_bytes": 1000.0,
            "act_bytes": 100.0,
            "param_bytes": 400.0,
            "peak_bytes": {1: 1300.0},
            "optimizer": Stat(median=1e-4),
        }
    )
    fact = tp_costs.TPBlock(phi=0.8, psi=0.5, reduce_bytes=(1000.0, 1000.0))
    got = tp_costs.rank_block(cal, b, fact, tp_costs.TPCosts(2, (fact,)))
    # overhead o = 1.0 - 1 x (1.5 - 1.0) = 0.5 ms stays whole; the rest x (0.2 + 0.8 / 2)
    # ring of 2: 2 (2 - 1) x 10 us + (2 - 1) x bytes / 1 GB/s, twice (two row linears)
    assert got.forward[1].median == pytest.approx(0.5e-3 + 0.5e-3 * 0.6 + 2 * (2e-5 + 1e-6))
    assert got.forward[2].median == pytest.approx(0.5e-3 + 1.0e-3 * 0.6 + 2 * (2e-5 + 2e-6))
    assert got.state_bytes == pytest.approx(600.0)  # 1000 x (0.2 + 0.4)
    assert got.param_bytes == pytest.approx(240.0)
    assert got.act_bytes == pytest.approx(75.0)  # 100 x (0.5 + 0.25)
    assert got.peak_bytes[1] == pytest.approx(600.0 + 300.0 * 0.75)
    assert got.optimizer.median == pytest.approx(0.6e-4)
    assert got.boundary_bytes == b.boundary_bytes  # stage sends stay whole
    assert tp_costs.split_time(2.0, 0.0, 1.0, 4) == pytest.approx(0.5)


def test_facts_on_gpt2_are_megatrons_two_reduces_per_layer(tmp_path):
    spec = load_spec(_spec(tmp_path))
    cal = calibration_for(spec)
    from jobctl.engine.model.blocks import model_def
    from jobctl.engine.model.graph.tp_plan import discover

    graph = model_def(spec.model, 0).graph
    facts = tp_costs.facts(graph, discover(graph, 2))
    rows = [b for f in facts for b in f.reduce_bytes]
    assert len(rows) == 2 * 2  # 2 layers x (attention's c_proj, the MLP's c_proj)
    assert rows == [16 * 32 * 4.0] * 4  # b s h per sample: seq 16 x width 32 fp32
    assert len(facts) == cal.num_blocks
    assert all(0.0 <= f.phi < 1.0 and 0.0 <= f.psi <= 1.0 for f in facts)
    assert max(f.phi for f in facts) > 0.95  # a layer's linears hold nearly all of it


def test_only_T2_fits_memory_so_auto_picks_T2(tmp_path):
    path = _spec(tmp_path, P=1, D=1)
    base = load_spec(path)
    mem = {
        T: max(make_plan(tp_search.with_T(base, T)).prediction.memory_per_stage_gb) for T in (1, 2)
    }
    assert mem[2] < 0.8 * mem[1]
    cap = (mem[1] + mem[2]) / 2 * 2**30 / 1e9  # GiB per stage -> the spec's GB
    spec = base.model_copy(update={"hardware": base.hardware.model_copy(update={"memory_gb": cap})})
    plan = make_plan(spec)
    assert plan.T == 2 and (plan.P, plan.D) == (1, 1)
    assert any("T = 1: no layout fits" in x for x in plan.t_search), plan.t_search
    with pytest.raises(ValueError, match="does not fit memory"):
        make_plan(tp_search.with_T(spec, 1))


def test_fast_links_pick_T2_and_slow_ones_T1(tmp_path):
    # 2 devices, a batch of 2 at m = 1, stage sends slow: T = 1 pays sends and a bubble
    # (P = 2) or a gradient all-reduce of every weight (D = 2); T = 2 only Megatron's
    # activation all-reduces, 16 of 2 KiB a step: cheap at 0.1 us latency, not at 10 ms
    path = _spec(
        tmp_path,
        per_node=2,
        nodes=1,
        extra=[
            ("  global_batch_size: 16", "  global_batch_size: 2"),
            ("  micro_batch_size: 2 ", "  micro_batch_size: 1 "),
        ],
    )
    spec = load_spec(path)
    picked = {}
    for latency in (1e-7, 1e-2):
        ring = AllreduceCalibration(source="analytic", latency_s=latency, bandwidth_Bps=1e7)
        plan = make_plan(spec, calibration=_cal(spec, ring, p2p_Bps=1e5))
        picked[latency] = plan.T
    assert picked == {1e-7: 2, 1e-2: 1}, picked


def test_T_groups_stay_inside_a_node_and_are_contiguous(tmp_path):
    spec = load_spec(_spec(tmp_path, per_node=2, nodes=2))
    Ts, why = tp_search.options(spec, 4)
    assert Ts == [1, 2] and why == ""  # 4 does not divide processes_per_node 2
    plan = make_plan(tp_search.with_T(spec, 2), devices=4)
    for rank in range(plan.world_size):
        group = plan.tp_ranks(rank)
        assert group == list(range(group[0], group[0] + 2))
        assert {plan.ranks[r].node for r in group} == {plan.ranks[rank].node}


@pytest.mark.parametrize(
    ("PD", "edits", "model", "words"),
    [
        (
            2,
            [("hardware:", "rebalancing:\n  enabled: true\n  pack: true\nhardware:")],
            GPT2,
            "rebalancing.pack does not run with tensor_parallel > 1",
        ),
    ],
)
def test_auto_resolves_to_T1_and_plan_says_why(tmp_path, PD, edits, model, words):
    path = _spec(tmp_path, P=PD, D=PD, extra=edits, model=model)
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0
    r = runner.invoke(app, ["plan", str(path)])
    assert r.exit_code == 0, r.output
    assert "T = 1 only:" in r.output and words in r.output, r.output


def test_auto_searches_the_builtin_gpts_heads(tmp_path):
    # the builtin GPT splits by its blocks' own Megatron plan (model.gpt_tp): T over
    # the divisors of its 4 heads that fit a 2-process node (was: "T = 1 only:
    # model.family builds hand-cut blocks")
    path = _spec(tmp_path, model="  family: gpt")
    r = runner.invoke(app, ["plan", str(path)])
    assert r.exit_code == 0, r.output
    assert "T search over 1, 2:" in r.output and "T = 1 only" not in r.output, r.output


def test_plan_table_shows_T_in_80_columns(tmp_path):
    spec = load_spec(_spec(tmp_path, T=2))
    plan = make_plan(spec)
    out = io.StringIO()
    print_plan(Console(file=out, width=80), plan)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("plan T=2 x P=")
    assert any("all-reduces priced by" in x for x in lines)
    table = [x for x in lines if x.startswith(("┃", "│", "┏", "└"))]
    assert table and max(len(x) for x in table) <= 80
    assert any("┃ t ┃" in x for x in table)


def test_a_bad_T_is_refused_at_validate_with_a_fix(tmp_path):
    path = _spec(tmp_path, T=3)
    r = runner.invoke(app, ["validate", str(path)])
    assert r.exit_code == 2 and "fix:" in r.output and "Traceback" not in r.output
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "tensor_parallel" in t)
    assert f"{path}:{line}:" in r.output, r.output


def test_subpipelined_saving_by_hand(tmp_path):
    spec = load_spec(_spec(tmp_path))
    ring = AllreduceCalibration(source="analytic", latency_s=0.0, bandwidth_Bps=1e7)
    cal = _cal(spec, ring)
    b = cal.blocks[1].model_copy(update={"forward": {1: Stat(median=1e-3), 2: Stat(median=2e-3)}})
    cal = cal.model_copy(update={"blocks": [cal.blocks[0], b, *cal.blocks[2:]]})
    fact = tp_costs.TPBlock(phi=1.0, psi=1.0, reduce_bytes=(1000.0, 1000.0))
    # m = 2, T = 2: T_m = 2 ms / 2 = 1 ms (no overhead: 1 ms at m = 1), T_a = 2 x 0.2 ms,
    # K = 1. Forward 1.4 ms plain, T_m/4 + 3/4 max(T_m, T_a) + T_a/4 = 1.1 ms split;
    # backward 2.4 ms plain, T_m/2 + 3/4 max(2 T_m, T_a) + T_a/4 = 2.1 ms split
    fwd, bwd = tp_search._saving(cal, 1, fact, 2, 2, hidden=1.0)
    assert (fwd, bwd) == (pytest.approx(0.3e-3), pytest.approx(0.3e-3))
    fwd0, bwd0 = tp_search._saving(cal, 1, fact, 2, 2, hidden=0.0)  # nothing hides
    assert fwd0 + bwd0 == pytest.approx(0.0)
    tp = tp_costs.TPCosts(2, tuple([fact] * cal.num_blocks))
    on = tp_search.with_T(spec, 2)
    on = on.model_copy(
        update={"parallelism": on.parallelism.model_copy(update={"tp_subpipeline": True})}
    )
    cal = cal.model_copy(update={"host": cal.host.model_copy(update={"cores": 8})})
    plain = tp_costs.calibration(cal, tp)  # 8 cores, 2 processes a node: T_a can hide
    split = tp_search.overlapped(on, cal, tp, plain)
    saved = plain.blocks[1].forward[2].median - split.blocks[1].forward[2].median
    assert saved == pytest.approx(0.3e-3)
    assert split.blocks[-1] == plain.blocks[-1]  # the last block: plain TMP
    assert split.blocks[1].forward[1] == plain.blocks[1].forward[1]  # odd m: whole
    # a no-grad forward (eval, a recomputed micro-batch's first) runs plain TMP
    assert split.blocks[1].forward_nograd == plain.blocks[1].forward_nograd
    assert plain.blocks[1].backward[2].median - split.blocks[1].backward[2].median == (
        pytest.approx(0.3e-3)
    )
    # the resolver's per-stage figure: the same T_m and T_a, none past keep_blocks
    # (stage-aware recomputation reruns those in backward: plain TMP)
    facts = [fact] * cal.num_blocks
    got = tp_overlap.stage_layers(cal, facts, [1], 2, 2, last=cal.num_blocks - 1)
    assert got == tp_overlap.LayerTimes(pytest.approx(1e-3), pytest.approx(0.4e-3), 1.0, 0.0)
    assert tp_overlap.stage_layers(cal, facts, [1], 2, 2, cal.num_blocks - 1, keep=0) is None


def test_what_runs_plain_tmp_is_priced_plain(tmp_path):
    """Under schedule: auto the sub-pipelined saving is priced per candidate: ZB-H1's
    (its split backward runs plain TMP) from the plain costs, the others with it; and
    blocks that stage-aware recomputation reruns in backward are priced plain."""
    from jobctl.engine.planner.search import candidates_for
    from jobctl.engine.planner.stage_costs import Tables

    spec = load_spec(_spec(tmp_path))
    ring = AllreduceCalibration(source="analytic", latency_s=0.0, bandwidth_Bps=1e7)
    cal = _cal(spec, ring)
    cal = cal.model_copy(update={"host": cal.host.model_copy(update={"cores": 8})})
    fact = tp_costs.TPBlock(phi=1.0, psi=1.0, reduce_bytes=(1000.0, 1000.0))
    tp = tp_costs.TPCosts(2, tuple([fact] * cal.num_blocks))
    on = tp_search.with_T(spec, 2)
    on = on.model_copy(
        update={
            "parallelism": on.parallelism.model_copy(
                update={"tp_subpipeline": True, "schedule": "auto"}
            )
        }
    )
    plain = tp_costs.calibration(cal, tp)
    split = tp_search.overlapped(on, cal, tp, plain)
    assert isinstance(split, tp_overlap.SubPipelined) and split.plain is plain

    def costs(c):
        return {x.layout.schedule: x.costs for x in candidates_for(on, Tables(c), 2, 4, 2)}

    got, want = costs(split), costs(plain)
    assert "zb_h1" in got and "1f1b" in got
    assert got["zb_h1"].graph == want["zb_h1"].graph and got["zb_h1"].b == want["zb_h1"].b
    assert sum(got["1f1b"].graph) < sum(want["1f1b"].graph)  # the others keep the saving
    assert sum(got["1f1b"].b) < sum(want["1f1b"].b)
    assert got["1f1b"].nograd == want["1f1b"].nograd  # a no-grad forward runs plain

    # stage-aware recomputation: a recomputed block runs plain TMP, so with every
    # block recomputed the stages cost what the plain costs give; kept, the saving
    from dataclasses import replace

    from jobctl.engine.planner import stage_aware

    win = next(c for c in candidates_for(on, Tables(split), 2, 4, 2) if c.layout.schedule == "1f1b")
    bare = replace(win.layout, recompute=False)

    def aware(c, keep):
        return stage_aware._priced(on, c, replace(win), bare, keep).costs

    none, every = [0] * len(win.stages), [len(s) for s in win.stages]
    for k in ("graph", "b"):
        assert getattr(aware(split, none), k) == pytest.approx(getattr(aware(plain, none), k))
        assert sum(getattr(aware(split, every), k)) < sum(getattr(aware(plain, every), k))


def test_T_ranks_share_the_nic_not_the_node(tmp_path):
    cal = _cal(load_spec(_spec(tmp_path)))
    fact = tp_costs.TPBlock(phi=0.5, psi=0.5)
    got = tp_costs.calibration(cal, tp_costs.TPCosts(2, tuple([fact] * cal.num_blocks)))
    assert got.p2p_inter.bandwidth_Bps == cal.p2p_inter.bandwidth_Bps / 2
    assert got.allreduce_inter.bandwidth_Bps == cal.allreduce_inter.bandwidth_Bps / 2
    assert got.p2p_intra == cal.p2p_intra and got.allreduce_intra == cal.allreduce_intra
