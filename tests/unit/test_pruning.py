"""Pruning: the cubic schedule, global selection, masks, checkpoints, profiling, events."""

from __future__ import annotations

import threading

import pytest
import torch

from jobctl.engine.checkpoint.blocks import load_masks, snapshot_blocks, write_snapshot
from jobctl.engine.model.blocks import Stage, gpt_def
from jobctl.engine.pruning.events import PruningWatch
from jobctl.engine.pruning.pruner import Pruner, prunable_names
from jobctl.engine.pruning.schedule import (
    cubic_sparsity,
    pruning_steps,
    schedule,
    sparsity_in_effect,
    target_at,
)
from jobctl.engine.pruning.selection import count_to_prune, select_masks, select_single
from jobctl.engine.runtime.optim import build_optimizer
from jobctl.engine.runtime.topology import Topology
from jobctl.engine.state.db import StateDB
from jobctl.engine.worker.reference import reference_train
from jobctl.spec import load_spec
from jobctl.spec.phases import DEFAULT_PRUNABLE

from ..jobrun import ROOT

PRUNING_YAML = ROOT / "jobs" / "pruning.yaml"


# -- schedule (eq. 3.1) -------------------------------------------------------------
def test_cubic_schedule_exact_values_dynpipe_example():
    # DynPipe sec. 4.0.1: prune from iteration 3000 to 7000 every 1000 to 90 %.
    got = [cubic_sparsity(t, 0.0, 0.9, 3000, 7000) for t in pruning_steps(3000, 7000, 1000)]
    assert got == pytest.approx([0.0, 0.5203125, 0.7875, 0.8859375, 0.9], abs=1e-12)
    assert [round(100 * s) for s in got[1:3]] == [52, 79]  # the paper's 52 % and 79 %


def test_cubic_schedule_endpoints_monotonic_and_clamped():
    s = [cubic_sparsity(t, 0.2, 0.8, 10, 50) for t in range(0, 61)]
    assert s[10] == pytest.approx(0.2) and s[50] == pytest.approx(0.8)
    assert s[0] == pytest.approx(0.2) and s[60] == pytest.approx(0.8)  # clamped outside
    assert all(b >= a for a, b in zip(s, s[1:], strict=False))
    # Fast at first, slow later: each interval prunes less than the one before.
    deltas = [s[t + 10] - s[t] for t in range(10, 50, 10)]
    assert all(b < a for a, b in zip(deltas, deltas[1:], strict=False))
    # The midpoint of eq. 3.1: s_f + (s_i - s_f) / 8.
    assert s[30] == pytest.approx(0.8 + (0.2 - 0.8) / 8)


def test_spec_schedule_targets():
    spec = load_spec(PRUNING_YAML)
    assert [t for t, _ in schedule(spec.pruning)] == [10, 20, 30, 40, 50]
    assert target_at(spec.pruning, 10) is None  # 0 % at start_step: nothing to prune
    assert target_at(spec.pruning, 20) == pytest.approx(0.5203125)
    assert target_at(spec.pruning, 21) is None
    assert sparsity_in_effect(spec.pruning, 35) == pytest.approx(0.7875)
    assert sparsity_in_effect(spec.pruning, 5) == 0.0


def test_count_to_prune_rounds_half_up():
    assert count_to_prune(0.5, 7) == 4
    assert count_to_prune(0.0, 100) == 0
    assert count_to_prune(0.9, 10) == 9


# -- selection (Alg. 2) -------------------------------------------------------------
def _model_params(seed: int = 0) -> dict[str, torch.Tensor]:
    stage = Stage(gpt_def(4, 32, 4, 16, 64, seed=seed), range(6))
    names = prunable_names([n for n, _ in stage.named_parameters()], DEFAULT_PRUNABLE, [])
    params = dict(stage.named_parameters())
    return {n: params[n].detach().clone() for n in names}


def _split(params, cut_block: int):
    """The params of blocks < cut_block and >= cut_block: two pipeline stages."""
    first = {n: p for n, p in params.items() if int(n.split(".")[1]) < cut_block}
    return first, {n: p for n, p in params.items() if n not in first}


def _run_stages(stages: list[dict], sparsity: float):
    """Run select_masks on each stage in its own thread; gather meets at a barrier."""
    n = len(stages)
    barrier = threading.Barrier(n)
    slots: list = [None] * n
    out: list = [None] * n

    def worker(i: int) -> None:
        def gather(t):
            slots[i] = t
            barrier.wait()
            got = list(slots)
            barrier.wait()
            return got

        out[i] = select_masks(stages[i], sparsity, gather)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return out


@pytest.mark.parametrize("sparsity", [0.3, 0.52, 0.9])
def test_threshold_across_two_stages_equals_assembled_model(sparsity):
    params = _model_params()
    ref_masks, ref_k, ref_total, ref_tau = select_single(params, sparsity)
    results = _run_stages(list(_split(params, 3)), sparsity)
    masks = {**results[0][0], **results[1][0]}
    for _, k, total, tau in results:
        assert (k, total, tau) == (ref_k, ref_total, ref_tau)
    assert set(masks) == set(ref_masks)
    assert all(torch.equal(masks[n], ref_masks[n]) for n in masks)
    pruned = sum(int((~m).sum()) for m in masks.values())
    assert pruned == count_to_prune(sparsity, ref_total)  # exactly k, globally
    # Independent of the candidate lists: the k-th smallest |w| of the sorted model.
    flat = torch.cat([p.abs().reshape(-1) for p in params.values()])
    assert ref_tau == float(flat.sort().values[ref_k - 1])
    kept = torch.cat([p.abs()[masks[n]] for n, p in params.items()])
    assert float(kept.min()) >= ref_tau


@pytest.mark.parametrize(("sparsity", "per_tensor"), [(0.5, [12, 6, 0]), (0.9, [12, 12, 8])])
def test_ties_at_threshold_are_broken_in_model_order_across_stages(sparsity, per_tensor):
    # Every magnitude equal: the first k elements in model order are pruned, wherever
    # the stage boundary falls (0.9 takes the offer-the-largest path).
    params = {f"layers.{b}.w": torch.full((3, 4), -0.5) for b in (1, 2, 3)}
    ref = select_single(params, sparsity)[0]
    for cut in (2, 3):
        results = _run_stages(list(_split(params, cut)), sparsity)
        masks = {**results[0][0], **results[1][0]}
        assert all(torch.equal(masks[n], ref[n]) for n in ref)
    assert [int((~ref[f"layers.{b}.w"]).sum()) for b in (1, 2, 3)] == per_tensor
    assert not bool(ref["layers.1.w"].reshape(-1)[0])  # model order: first elements go first


@pytest.mark.parametrize("sparsity", [0.4, 0.9])
def test_ties_follow_model_order_where_ranks_hold_blocks_out_of_order(sparsity):
    # A V rank (zb_v) holds stages d and 2P-1-d: here blocks {1, 4} and {2, 3}, each
    # offered by its rank in its own order; the gather returns them in any order.
    params = {f"layers.{b}.w": torch.full((3, 4), 0.25) for b in (1, 2, 3, 4)}
    ref = select_single(params, sparsity)[0]
    ranks = [{n: params[n] for n in ("layers.4.w", "layers.1.w")}]
    ranks.append({n: params[n] for n in ("layers.3.w", "layers.2.w")})
    for order in (ranks, ranks[::-1]):
        results = _run_stages(order, sparsity)
        masks = {**results[0][0], **results[1][0]}
        assert all(torch.equal(masks[n], ref[n]) for n in ref)
    assert int((~ref["layers.4.w"]).sum()) == (0 if sparsity < 0.75 else 7)


def test_global_pruning_is_uneven_across_layers():
    params = {"layers.1.w": torch.randn(100) * 0.01, "layers.2.w": torch.randn(100)}
    masks = select_single(params, 0.5)[0]
    assert int((~masks["layers.1.w"]).sum()) > 90  # small weights go first, globally


def test_default_globs_select_block_linears_only():
    stage = Stage(gpt_def(2, 16, 2, 8, 32), range(4))
    names = prunable_names(
        [n for n, _ in stage.named_parameters(remove_duplicate=False)],
        DEFAULT_PRUNABLE,
        gpt_def(2, 16, 2, 8, 32).ties,
    )
    assert names == [
        f"layers.{b}.{m}.weight"
        for b in (1, 2)
        for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
    ]


def test_tied_pair_counts_once_under_its_canonical_name():
    mdef = gpt_def(2, 16, 2, 8, 32)
    names = ["layers.0.wte.weight", "layers.0.wpe.weight", "layers.3.weight"]
    assert prunable_names(names, ["layers.3.weight"], mdef.ties) == ["layers.0.wte.weight"]
    assert prunable_names(names, ["layers.0.wte.*"], mdef.ties) == ["layers.0.wte.weight"]
    assert prunable_names(names, DEFAULT_PRUNABLE, mdef.ties) == []


# -- masks on a stage: zeroing, optimizer state, checkpoints ------------------------
def _single_pruner(spec, tmp_events=None):
    mdef = gpt_def(2, 16, 2, 8, 32)
    stage = Stage(mdef, range(mdef.num_blocks))
    named = dict(stage.named_parameters())
    opt = build_optimizer(list(named.values()), spec.training)
    topo = Topology(0, 0, 0, 1, 1, None, None, [0], None, [], None)
    return Pruner(spec, stage, named, opt, topo, mdef.ties, tmp_events), mdef


def test_adopt_zeroes_weights_and_optimizer_state_and_release_returns_masks():
    spec = load_spec(PRUNING_YAML)
    pruner, _ = _single_pruner(spec)
    name = "layers.1.mlp.fc.weight"
    p = pruner.named[name]
    p.sum().backward()
    pruner.opt.step()  # AdamW state exists now
    mask = torch.rand(p.shape) > 0.5
    pruner.adopt(name, mask)
    assert bool((p[~mask] == 0).all()) and bool((p[mask] != 0).all())
    for v in pruner.opt.state[p].values():
        if torch.is_tensor(v) and v.shape == p.shape:
            assert bool((v[~mask] == 0).all())
    assert pruner.block_sparsity()[1] == pytest.approx(float((~mask).float().mean()))
    gone = pruner.release([1])
    assert set(gone) == {name} and pruner.masks == {}


def test_masks_round_trip_through_block_files(tmp_path):
    spec = load_spec(PRUNING_YAML)
    pruner, mdef = _single_pruner(spec)
    masks = {"layers.0.wte.weight": torch.rand(32, 16) > 0.3}
    masks["layers.2.attn.qkv.weight"] = torch.rand(48, 16) > 0.3
    snap = snapshot_blocks(pruner.stage, pruner.opt, [0, 1, 2, 3], mdef.ties, masks)
    write_snapshot(snap, tmp_path)
    names = [
        "layers.0.wte.weight",
        "layers.2.attn.qkv.weight",
        "layers.3.weight",
        "layers.1.ln1.weight",
    ]
    got = load_masks(tmp_path, names, mdef.ties)
    assert set(got) == {"layers.0.wte.weight", "layers.2.attn.qkv.weight", "layers.3.weight"}
    assert torch.equal(got["layers.3.weight"], masks["layers.0.wte.weight"])  # alias
    assert torch.equal(got["layers.2.attn.qkv.weight"], masks["layers.2.attn.qkv.weight"])


# -- the reference trainer prunes and keeps pruned weights at zero ------------------
def test_reference_pruned_weights_stay_zero_and_sparsity_follows_schedule():
    overrides = {
        "training.steps": 6,
        "training.micro_batch_size": 8,
        "training.weight_decay": 0.1,
        "pruning.start_step": 1,
        "pruning.end_step": 3,
        "pruning.frequency": 1,
        "pruning.initial_sparsity": 0.1,
    }
    spec = load_spec(PRUNING_YAML, overrides=overrides)
    masks: dict = {}
    losses, weights = reference_train(spec, masks=masks)
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
    total = sum(m.numel() for m in masks.values())
    pruned = sum(int((~m).sum()) for m in masks.values())
    assert pruned == count_to_prune(0.9, total)
    for n, m in masks.items():  # three more optimizer steps (AdamW, decay) after step 3
        assert bool((weights[n][~m] == 0).all()), n
        assert int((weights[n][m] == 0).sum()) == 0, n
    # Fewer steps: the masks of the last pruning step that happened (step 2, 60 %).
    early: dict = {}
    reference_train(spec, steps=2, masks=early)
    s2 = sum(int((~m).sum()) for m in early.values()) / total
    assert s2 == pytest.approx(target_at(spec.pruning, 2), abs=1 / total)


# -- profiling -----------------------------------------------------------------------
def test_profile_step_times_every_block_and_reports_memory():
    spec = load_spec(PRUNING_YAML)
    events = []

    class Sink:
        def write(self, kind, **rec):
            events.append({"kind": kind, **rec})

    pruner, mdef = _single_pruner(spec, Sink())
    pruner.profile_at = 7
    x = torch.randint(0, 32, (2, 8))
    with pruner.profile_step(6):  # not the profiling step: no hooks, no event
        pruner.stage(x).sum().backward()
    assert events == []
    with pruner.profile_step(7):
        for _ in range(2):  # two micro-batches, two backward calls
            pruner.stage(x).sum().backward()
    (rec,) = events
    assert rec["kind"] == "profile" and rec["step"] == 8
    assert set(rec["blocks"]) == {str(b) for b in range(mdef.num_blocks)}
    assert all(b["fwd_s"] > 0 and b["bwd_s"] > 0 for b in rec["blocks"].values())
    assert rec["memory"]["param_bytes"] == 4 * sum(p.numel() for p in pruner.named.values())
    assert pruner.profile_at is None
    assert all(not m._forward_hooks for m in pruner.stage.layers.values())  # hooks removed


# -- supervisor side ----------------------------------------------------------------
def test_pruning_records_drive_the_phase_machine(tmp_path):
    db = StateDB(tmp_path)
    db.create_run("r1", "pruning", tmp_path / "r1")
    db.set_phase("r1", "launching")
    db.set_phase("r1", "training")
    watch = PruningWatch(db, "r1")
    watch.record(
        {
            "kind": "pruning",
            "step": 20,
            "target_sparsity": 0.52,
            "achieved_sparsity": 0.52,
            "stage_sparsity": [0.5, 0.54],
        }
    )
    assert db.get_run("r1")["phase"] == "pruning"
    watch.step(20)
    assert db.get_run("r1")["phase"] == "pruning"
    watch.step(21)
    assert db.get_run("r1")["phase"] == "training"
    kinds = [e["kind"] for e in db.events("r1")]
    assert "pruning" in kinds


# -- sparse compute ------------------------------------------------------------------
def _train_single(spec, steps: int):
    """A few steps of one process through a Pruner (pruning at step 0); losses, weights."""
    pruner, _ = _single_pruner(spec)
    pruner.maybe_prune(0)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 32, (4, 8), generator=g)
        pruner.opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(pruner.stage(x).reshape(-1, 32), x.reshape(-1))
        loss.backward()
        pruner.mask_grads()
        pruner.opt.step()
        pruner.after_step()
        losses.append(float(loss.detach()))
    return pruner, losses, {n: p.detach().clone() for n, p in pruner.named.items()}


# Pruned to 80 % from the first step, SGD: the CSR-vs-dense comparisons.
CSR_BASE = {
    "pruning.start_step": 0,
    "pruning.initial_sparsity": 0.8,
    "pruning.end_step": 10,
    "training.optimizer": "sgd",
    "training.lr": 0.3,
    "training.momentum": 0.9,
}


def test_csr_blocks_train_like_dense_ones():
    # SGD: Adam would turn the attention key bias' zero-in-exact-arithmetic gradient into
    # +-lr steps whose sign is rounding noise (see test_parity).
    base = dict(CSR_BASE)
    dense_spec = load_spec(PRUNING_YAML, overrides={**base, "pruning.sparse_threshold": None})
    csr_spec = load_spec(PRUNING_YAML, overrides={**base, "pruning.sparse_threshold": 0.5})
    _, dense_losses, dense_w = _train_single(dense_spec, 3)
    pruner, csr_losses, csr_w = _train_single(csr_spec, 3)
    assert sorted(pruner.sparse) == [1, 2]  # both transformer blocks switched
    assert all(len(layers) == 4 for layers in pruner.sparse.values())
    assert csr_losses == pytest.approx(dense_losses, abs=1e-5)
    for n, w in dense_w.items():
        torch.testing.assert_close(csr_w[n], w, atol=1e-5, rtol=0, msg=n)
    for n, m in pruner.masks.items():
        assert bool((csr_w[n][~m] == 0).all())
    pruner.release([1, 2])
    assert pruner.sparse == {} and not hasattr(pruner.stage.layers["1"].mlp.fc, "_csr")


def test_plan_shows_the_sparsity_at_each_pruning_step(tmp_path):
    from typer.testing import CliRunner

    from jobctl.engine.cli.app import app

    r = CliRunner().invoke(
        app, ["plan", str(PRUNING_YAML), "--explain", "--home", str(tmp_path)], terminal_width=120
    )
    assert r.exit_code == 0, r.output
    rows = [line for line in r.output.splitlines() if line.startswith("│")]
    got = [(cells[0], cells[1]) for cells in (row.strip("│").split("│") for row in rows)]
    pruning = [(a.strip(), b.strip()) for a, b in got if b.strip().endswith("%")]
    assert pruning[-5:] == [
        ("10", "0.0 %"),
        ("20", "52.0 %"),
        ("30", "78.8 %"),
        ("40", "88.6 %"),
        ("50", "90.0 %"),
    ]
    assert "n=4 (DynPipe eq. 3.1)" in r.output
    quick = CliRunner().invoke(
        app, ["plan", str(ROOT / "jobs" / "quickstart.yaml"), "--home", str(tmp_path)]
    )
    assert "pruning schedule" not in quick.output


# -- realised sparsity per layer (Alg. 2) --------------------------------------------
def test_every_layer_follows_the_global_threshold_at_each_pruning_step():
    # Depth-scaled magnitudes, so global pruning leaves layers unevenly sparse; three
    # pruning steps as in the benchmark (52 %, 85.25 %, 90 %), pruned weights zeroed in
    # between as the trainer does.
    params = _model_params(seed=3)
    for n, p in params.items():
        p.mul_(0.25 * int(n.split(".")[1]))
    prev = None
    for s in (0.52, 0.8525, 0.9):
        before = {n: p.clone() for n, p in params.items()}
        results = _run_stages(list(_split(params, 3)), s)
        masks = {**results[0][0], **results[1][0]}
        _, k, total, tau = results[0]
        pruned = {n: int((~m).sum()) for n, m in masks.items()}
        # Globally exact: k = round(s N) elements, within half an element of s N.
        assert sum(pruned.values()) == k == count_to_prune(s, total)
        assert abs(k - s * total) <= 0.5
        for n, w in before.items():
            a = w.abs()
            # Per layer: everything below the global threshold goes, nothing above it,
            # ties at the threshold in model order (the only freedom Alg. 2 leaves).
            assert int((a < tau).sum()) <= pruned[n] <= int((a <= tau).sum()), n
            assert bool((a[~masks[n]] <= tau).all()) and bool((a[masks[n]] >= tau).all()), n
            if prev is not None:  # a pruned weight is zero, so it stays pruned
                assert not bool((masks[n] & ~prev[n]).any()), n
        for n, p in params.items():
            p.mul_(masks[n])
        prev = masks
    layer = [int((~m).sum()) / m.numel() for m in prev.values()]
    assert max(layer) - min(layer) > 0.3  # uneven per layer, exact globally


# -- sparse_threshold: auto (measured crossover per shape class) ----------------------
def _crossover_record(home, spec, crossovers: dict[tuple[int, int], float | None]):
    from jobctl.engine.pruning.crossover import record_path, save, shape_key

    tokens = spec.model.seq_len * spec.training.micro_batch_size
    shapes = {
        shape_key((o, i, tokens)): {"crossover": x, "ratios": {"0.5": 0.8, "0.9": 0.5}}
        for (o, i), x in crossovers.items()
    }
    save(record_path(home, torch.device("cpu")), shapes, torch.device("cpu"))


def test_auto_computes_in_csr_only_above_the_measured_crossover(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBCTL_HOME", str(tmp_path))  # where the Pruner looks
    base = dict(CSR_BASE)
    spec = load_spec(PRUNING_YAML, overrides=base)
    assert spec.pruning.sparse_threshold == "auto"  # the default
    # hidden 16: qkv 48x16, proj 16x16, fc 64x16, mlp proj 16x64
    crossovers = {(48, 16): 0.5, (16, 16): None, (64, 16): 0.99, (16, 64): None}
    _crossover_record(tmp_path, spec, crossovers)
    dense_spec = load_spec(PRUNING_YAML, overrides={**base, "pruning.sparse_threshold": None})
    _, dense_losses, dense_w = _train_single(dense_spec, 3)
    pruner, losses, weights = _train_single(spec, 3)
    csr = {m for layers in pruner.sparse.values() for m in layers}
    for b in (1, 2):
        block = pruner.stage.layers[str(b)]
        sp = pruner.layer_sparsity()
        assert sp[f"layers.{b}.attn.qkv.weight"] >= 0.5 and block.attn.qkv in csr  # above
        assert sp[f"layers.{b}.mlp.fc.weight"] < 0.99 and block.mlp.fc not in csr  # below
        assert block.attn.proj not in csr and block.mlp.proj not in csr  # CSR never wins
    assert pruner.crossovers is not None
    assert losses == pytest.approx(dense_losses, abs=1e-5)
    for n, w in dense_w.items():
        torch.testing.assert_close(weights[n], w, atol=1e-5, rtol=0, msg=n)


def test_crossover_is_measured_once_then_cached(tmp_path, monkeypatch):
    from jobctl.engine.pruning import crossover as pc

    shape = (48, 16, 32)
    got = pc.resolve([shape], 4, home=tmp_path)
    assert pc.shape_key(shape) in got
    record = pc.load(pc.record_path(tmp_path, torch.device("cpu")))[pc.shape_key(shape)]
    assert record["ratios"] and record["crossover"] == pc.crossover(
        {float(s): r for s, r in record["ratios"].items()}
    )
    monkeypatch.setattr(pc, "measure", lambda *a, **k: pytest.fail("measured again"))
    assert pc.resolve([shape], 4, home=tmp_path) == got
    assert pc.resolve([(8, 8, 8)], 4, home=tmp_path, measure_missing=False) == got


def test_crossover_is_the_lowest_sparsity_from_which_csr_always_wins():
    from jobctl.engine.pruning.crossover import crossover, ratio_at

    assert crossover({0.5: 2.0, 0.9: 0.8, 0.95: 0.6, 0.99: 0.5}) == 0.9
    assert crossover({0.5: 0.5, 0.9: 1.2, 0.99: 0.5}) == 0.99  # must win at every higher
    assert crossover({0.9: 0.95, 0.99: 0.92}) is None  # within noise of dense: stay dense
    rec = {"ratios": {"0.9": 0.8, "0.99": 0.5}}
    assert ratio_at(rec, 0.95) == 0.8 and ratio_at(rec, 0.995) == 0.5
    assert ratio_at(rec, 0.5) is None
