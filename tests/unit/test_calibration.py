"""Calibration records: round trip, fingerprints, the cache, analytic values, lookups."""

from __future__ import annotations

import json

import pytest
import torch

from jobctl.engine.calibration import cache
from jobctl.engine.calibration.analytic import (
    BLOCK_OVERHEAD_S,
    analytic_calibration,
    analytic_fingerprint,
)
from jobctl.engine.calibration.measure.fit import (
    at_machine_speed,
    calibrate_runtime,
    fit_message,
    fit_runtime,
    machine_drift,
    probe_load,
    probe_time,
    simulated_run,
    solo_costs,
    step_spread,
)
from jobctl.engine.calibration.measure.runner import (
    MAX_SIZES,
    allreduce_sizes,
    least_disturbed,
    micro_batch_sizes,
)
from jobctl.engine.calibration.record import (
    CALIBRATION_VERSION,
    AllreduceCalibration,
    AllreducePoint,
    Calibration,
    HostCalibration,
    LinkCalibration,
    RuntimeCalibration,
    Stat,
)
from jobctl.engine.model.costs import model_costs
from jobctl.engine.planner.contention import contend, demand
from jobctl.engine.planner.layout import Hosting, Layout
from jobctl.engine.planner.resolver import make_plan
from jobctl.engine.planner.simulator.simulation import simulate
from jobctl.engine.planner.stage_costs import BlockTimes, stage_costs
from jobctl.engine.schedule.generators import generate

from ..jobrun import tiny_spec


def measured_like(spec) -> Calibration:
    """The analytic record of ``spec`` dressed as a measured one of this machine."""
    cal = analytic_calibration(spec, cache.fingerprint(spec))
    link = LinkCalibration(
        source="measured",
        latency_s=50e-6,
        bandwidth_Bps=1e9,
        points={1024: Stat.of([50e-6, 52e-6, 49e-6]), 65536: Stat.of([110e-6, 120e-6])},
    )
    return cal.model_copy(update={"source": "measured", "p2p_intra": link})


def test_stat_of_samples():
    s = Stat.of([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s.median, s.n) == (3.0, 5)
    assert s.iqr == pytest.approx(2.0)
    assert s.rel_std == pytest.approx(2.0 / 1.349 / 3.0)
    assert Stat.of([7.0]) == Stat(median=7.0, iqr=0.0, n=1)


def test_record_round_trips_through_the_cache(tmp_path):
    spec = tiny_spec()
    cal = measured_like(spec)
    path = cache.save(cal, tmp_path)
    assert path == tmp_path / "calibration" / f"{cal.fingerprint.key}.json"
    raw = json.loads(path.read_text())
    assert raw["version"] == CALIBRATION_VERSION == 10 and raw["units"]["time"] == "s"
    assert raw["blocks"][1]["forward"]["2"]["n"] == 1  # m keys stored as JSON strings
    back = cache.load(path)
    assert back == cal
    assert back.forward(1, 2) == cal.forward(1, 2)


def test_a_data_change_keeps_the_measured_record_and_says_so(tmp_path):
    from jobctl.engine.planner.resolver import make_plan

    spec = tiny_spec()
    cache.save(measured_like(spec).model_copy(update={"data_source": "synthetic"}), tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(bytes(range(256)) * 64)
    text = tiny_spec(**{"data.source": "text", "data.path": str(corpus)})
    assert cache.find_cached(text, tmp_path) is not None
    plan = make_plan(text, home=tmp_path)
    assert plan.prediction.source == "calibration"
    why = "its data fetch times are for data.source 'synthetic', this job reads 'text'"
    assert why in plan.explanation[0]
    same = make_plan(spec, home=tmp_path)
    assert "data fetch" not in same.explanation[0]


def test_cache_finds_only_a_matching_fingerprint(tmp_path):
    spec = tiny_spec()
    cache.save(measured_like(spec), tmp_path)
    found = cache.find_cached(spec, tmp_path)
    assert found is not None and found[0].source == "measured"
    assert cache.find_cached(tiny_spec(**{"model.layers": 5}), tmp_path) is None
    assert cache.find_cached(tiny_spec(**{"training.precision": "bf16"}), tmp_path) is None
    assert cache.find_cached(spec, tmp_path, threads=2) is None
    # Scale is not part of the fingerprint: other pools and batch sizes reuse it.
    assert cache.find_cached(tiny_spec(**{"hardware.nodes": 8}), tmp_path) is not None
    assert cache.find_cached(tiny_spec(**{"training.global_batch_size": 64}), tmp_path)


def test_fingerprint_changes_with_torch_version(tmp_path, monkeypatch):
    spec = tiny_spec()
    cache.save(measured_like(spec), tmp_path)
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert cache.find_cached(spec, tmp_path) is None
    assert cache.calibration_for(spec, tmp_path).source == "analytic"


def test_other_format_versions_are_refused(tmp_path):
    spec = tiny_spec()
    path = cache.save(measured_like(spec), tmp_path)
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "version": 99}))
    with pytest.raises(cache.CalibrationError, match="version 99"):
        cache.load(path)
    assert cache.find_cached(spec, tmp_path) is None


def test_cached_record_takes_inter_node_values_from_the_current_spec(tmp_path):
    spec = tiny_spec()
    cache.save(measured_like(spec), tmp_path)
    faster = tiny_spec(**{"hardware.interconnect.inter_node_gbps": 80.0})
    cal, _ = cache.find_cached(faster, tmp_path)
    assert cal.p2p_inter.source == "analytic"
    assert cal.p2p_inter.bandwidth_Bps == pytest.approx(80e9 / 8)
    assert cal.p2p_intra.source == "measured"  # measured values are kept


def test_analytic_values_follow_the_spec():
    spec = tiny_spec(**{"hardware.flops_tflops": 2.0})
    cal = analytic_calibration(spec, analytic_fingerprint(spec.hardware, "x"))
    costs = model_costs(spec)
    assert cal.source == "analytic" and cal.num_blocks == costs.num_blocks == 6
    for m in (1, 3, 8):
        want = BLOCK_OVERHEAD_S["cpu"] + m * costs.flops[1] / 2e12
        assert cal.forward(1, m) == pytest.approx(want)
    assert cal.backward(1, 4) > cal.forward(1, 4)
    ic = spec.hardware.interconnect
    assert cal.p2p_inter.time(1e6) == pytest.approx(ic.latency_us * 1e-6 + 1e6 * 8 / 10e9)
    assert cal.allreduce_inter.time(4, 1e6) > cal.allreduce_inter.time(2, 1e6)
    assert cal.blocks[0].tied_bytes == cal.blocks[-1].tied_bytes == 4.0 * 256 * 64


def test_interpolation_and_extrapolation_in_m():
    spec = tiny_spec()
    cal = measured_like(spec)
    f2, f4 = cal.forward(1, 2), cal.forward(1, 4)
    assert cal.forward(1, 3) == pytest.approx((f2 + f4) / 2)
    top = max(cal.micro_batch_sizes)
    assert cal.forward(1, 2 * top) == pytest.approx(2 * cal.forward(1, top))


def test_link_interpolates_between_measured_sizes():
    link = LinkCalibration(
        source="measured",
        latency_s=1e-5,
        bandwidth_Bps=1e8,
        points={1000: Stat(median=2e-5), 3000: Stat(median=4e-5)},
    )
    assert link.time(2000) == pytest.approx(3e-5)
    assert link.time(1e6) == pytest.approx(1e-5 + 1e-2)  # beyond: the fit


def test_allreduce_uses_measured_points_then_the_ring_model():
    ar = AllreduceCalibration(
        source="measured",
        latency_s=1e-5,
        bandwidth_Bps=1e9,
        points=[
            AllreducePoint(ring=2, inflight=1, bytes=1000, time=Stat(median=1e-4)),
            AllreducePoint(ring=2, inflight=1, bytes=3000, time=Stat(median=3e-4)),
            AllreducePoint(ring=2, inflight=2, bytes=1000, time=Stat(median=1.5e-4)),
            AllreducePoint(ring=2, inflight=2, bytes=3000, time=Stat(median=4e-4)),
        ],
    )
    assert ar.time(1, 1e9) == 0.0
    assert ar.time(2, 2000) == pytest.approx(2e-4)
    assert ar.time(2, 2000, inflight=2) == pytest.approx(2.75e-4)
    assert ar.time(2, 2000, inflight=4) == pytest.approx(2 * 2.75e-4)
    ring8 = 2 * 7 * 1e-5 + 2 * 7 / 8 * 2000 / 1e9  # not measured: the ring model
    assert ar.time(8, 2000) == pytest.approx(ring8)


def test_host_factor_interpolates_and_shares_cores_beyond():
    host = HostCalibration(source="measured", cores=2, slowdown={2: 1.1, 4: 2.2})
    assert host.factor(1) == 1.0
    assert host.factor(3) == pytest.approx(1.65)
    assert host.factor(8) == pytest.approx(4.4)


def test_micro_batch_sizes_cover_powers_of_two_and_the_explicit_size():
    assert micro_batch_sizes(tiny_spec()) == [1, 2, 4, 8, 16]
    odd = tiny_spec(**{"training.global_batch_size": 24, "training.micro_batch_size": 3})
    assert micro_batch_sizes(odd) == [1, 2, 3, 4, 8, 16]


def test_same_record_plans_small_and_huge_pools(tmp_path):
    """Scale invariance: nothing in the record depends on G."""
    spec = tiny_spec(
        **{
            "model.hidden": 1024,
            "model.layers": 8,
            "model.seq_len": 512,
            "hardware.memory_gb": 80,
            "training.global_batch_size": 4096,
            "parallelism.pipeline_stages": "auto",
            "parallelism.data_parallel": "auto",
            "training.micro_batch_size": "auto",
            "hardware.device": "cuda",
        }
    )
    cal = measured_like(spec)
    small, large = make_plan(spec, 4, calibration=cal), make_plan(spec, 1024, calibration=cal)
    # Every D is searched: beyond 256 replicas the ring's latency outweighs the compute.
    assert small.world_size <= 4 and 256 <= large.world_size <= 1024
    assert small.prediction.calibration == large.prediction.calibration == cal.fingerprint.key
    assert large.prediction.samples_per_s > 10 * small.prediction.samples_per_s


def test_plan_uses_the_cached_record_when_it_matches(tmp_path):
    spec = tiny_spec()
    assert make_plan(spec, home=tmp_path).prediction.source == "analytic"
    cache.save(measured_like(spec), tmp_path)
    plan = make_plan(spec, home=tmp_path)
    assert plan.prediction.source == "calibration"
    assert plan.explanation[0].startswith("costs: measured calibration")


def test_runtime_costs_reach_every_message_and_step():
    """The probe-fitted runtime costs: each forward and backward carries the executor's
    per-action time, each send the idle extra per-message time, each stage the fixed
    per-step work."""
    spec = tiny_spec()
    cal = measured_like(spec)
    rt = RuntimeCalibration(
        source="measured", message_s=1e-3, message_busy_s=3e-3, step_s=2e-3, action_s=1e-4
    )
    with_rt = cal.model_copy(update={"runtime": rt})
    layout = Layout(3, 1, 2, 4, "1f1b")
    stages = [[0, 1], [2, 3], [4, 5]]
    times = BlockTimes.at(cal, 2)
    for busy in (False, True):
        host = Hosting(3, 1, 3, "stage_major", True, True, busy)
        base = stage_costs(cal, layout, stages, host, times)
        more = stage_costs(with_rt, layout, stages, host, times)
        assert more.sends == pytest.approx([x + 1e-3 for x in base.sends])
        assert more.opt == pytest.approx([x + 2e-3 for x in base.opt])
        assert more.b == pytest.approx([x + 1e-4 for x in base.b])
        assert more.graph == pytest.approx([x + 1e-4 for x in base.graph])
        assert more.nograd == pytest.approx([x + 1e-4 for x in base.nograd])
        assert more.fetch == base.fetch


def test_message_cost_follows_the_plan_load():
    """Between the two probes' loads the per-message time is interpolated, outside it is
    held; ``contend`` gives a plan the time its own simulated load says."""
    rt = RuntimeCalibration(
        source="measured", message_s=1e-3, message_busy_s=3e-3, load_idle=1.0, load_busy=2.0
    )
    assert rt.message_at(0.5) == rt.message_at(1.0) == pytest.approx(1e-3)
    assert rt.message_at(1.5) == pytest.approx(2e-3)
    assert rt.message_at(2.0) == rt.message_at(9.0) == pytest.approx(3e-3)
    assert RuntimeCalibration(source="measured", message_s=1e-3).message_at(5.0) == 1e-3
    spec = tiny_spec()
    cal = measured_like(spec).model_copy(update={"runtime": rt})
    stages = [[0, 1], [2, 3], [4, 5]]
    actions = generate("1f1b", 3, 6)
    for D, want in ((4, 2e-3), (1, None)):  # 12 processes: busy; 3 in a pipeline: less
        layout = Layout(3, D, 2, 6, "1f1b")
        host = Hosting(3, D, 3 * D, "stage_major", True, True, True)
        model = stage_costs(cal, layout, stages, host, BlockTimes.at(cal, 2)).model(layout, [0] * 3)
        costs, _ = contend(cal, actions, model, D)
        load = demand(simulate(actions, model), D)  # the plan's own, not the message's
        extra = costs.act[0] - model.act[0]
        assert extra == pytest.approx(rt.message_at(load) - rt.message_s)
        if want is not None:
            assert load > rt.load_busy and extra == pytest.approx(want)
        plain, _ = contend(cal, actions, model, D, messages=False)
        assert plain.act == model.act


def test_fit_message_recovers_a_known_per_message_cost():
    """Simulate a probe with a known extra time per message as if measured: the fit
    finds that time back (1F1B puts messages on the critical path)."""
    spec = tiny_spec()
    cal = measured_like(spec)
    two, four = [[0, 1, 2], [3, 4, 5]], [[0, 1], [2], [3], [4, 5]]
    for true in (0.0, 2e-4, 1.5e-3):
        measured = probe_time(cal, two, 2, 4, true)
        assert fit_message(cal, two, 2, 4, measured) == pytest.approx(true, abs=2e-6)
        # Four stages sharing the cores: the simulated time need not be monotone in
        # the message time; the fit is the least time that reproduces the measurement.
        measured = probe_time(cal, four, 2, 4, true)
        fit = fit_message(cal, four, 2, 4, measured)
        assert fit <= true + 2e-6
        assert probe_time(cal, four, 2, 4, fit) == pytest.approx(measured, rel=1e-3)
    # Faster than the link says (shared memory beats the gloo ping-pong): a negative
    # extra, never below free sends.
    link = probe_time(cal, two, 2, 4, 0.0) - probe_time(cal, two, 2, 4, -1.0)
    assert link > 0
    send = simulated_run(cal, two, 2, 4, 0.0)[0].act[0]
    cheaper = probe_time(cal, two, 2, 4, -send / 2)
    assert fit_message(cal, two, 2, 4, cheaper) == pytest.approx(-send / 2, abs=2e-6)
    assert fit_message(cal, two, 2, 4, cheaper - 1.0) == pytest.approx(-send)
    slower = probe_time(cal, two, 2, 4, 1e-3)
    assert slower > probe_time(cal, two, 2, 4, 0.0) + 2e-3  # >= 2 messages in the way
    blocks = [0, 1, 2, 3, 4, 5]
    opt = [[sum(cal.blocks[i].optimizer.median for i in blocks)] * 3]
    solo = {"stages": [blocks], "run": [probe_time(cal, [blocks], 2, 4, 0.0)] * 3, "opt": opt}
    samples = {
        "solo": {**solo, "rest": [4e-4, 5e-4, 6e-4]},  # no cost per action, 0.5 ms per step
        "idle": {"stages": two, "run": [slower] * 5, "rest": [9.0]},
        "busy": {"stages": four, "run": [probe_time(cal, four, 2, 4, 3e-3)] * 3, "rest": [1e-3]},
    }
    rt = fit_runtime(cal, samples, 2, 4)
    assert rt.message_s == pytest.approx(1e-3, abs=2e-6)
    assert rt.message_busy_s == pytest.approx(3e-3, abs=2e-6)
    assert rt.step_s == pytest.approx(5e-4)  # the solo probe's rest, not the idle one's
    assert rt.probe["idle"]["measured_s"] == pytest.approx(slower)
    assert rt.action_s == pytest.approx(0.0, abs=1e-12)
    # Loads are compute demand at the idle message time (the plan's is taken the same way).
    assert rt.load_idle == pytest.approx(probe_load(cal, two, 2, 4, rt.message_s))
    assert rt.load_busy == pytest.approx(probe_load(cal, four, 2, 4, rt.message_s))
    assert fit_runtime(cal, {}, 2, 4) is None
    assert fit_runtime(cal, {"idle": samples["idle"]}, 2, 4) is None  # no solo probe


def test_the_solo_probe_gives_the_per_action_and_per_step_costs():
    """One stage, no messages: its run beyond the calibrated compute is the executor's
    cost per action (2M actions), its rest plus the optimizer beyond the calibrated
    one the cost per step; the message fit then explains only what those do not."""
    spec = tiny_spec()
    cal = measured_like(spec)
    blocks = [0, 1, 2, 3, 4, 5]
    opt = sum(cal.blocks[i].optimizer.median for i in blocks)
    run = probe_time(cal, [blocks], 2, 4, 0.0) + 8 * 2e-4
    solo = {"stages": [blocks], "run": [run] * 5, "rest": [3e-4] * 5, "opt": [[opt + 1e-4] * 5]}
    assert solo_costs(cal, solo, 2, 4) == pytest.approx((2e-4, 4e-4))
    # The runtime already faster than calibrated: never a negative cost.
    fast = {"stages": [blocks], "run": [run / 2] * 5, "rest": [1e-4] * 5, "opt": [[opt / 2] * 5]}
    assert solo_costs(cal, fast, 2, 4) == (0.0, 0.0)
    two = [[0, 1, 2], [3, 4, 5]]
    slow = cal.model_copy(update={"runtime": RuntimeCalibration(source="measured", action_s=2e-4)})
    measured = probe_time(slow, two, 2, 4, 1e-3)
    samples = {"solo": solo, "idle": {"stages": two, "run": [measured] * 5, "rest": [9.0]}}
    rt = fit_runtime(cal, samples, 2, 4)
    assert rt.action_s == pytest.approx(2e-4) and rt.step_s == pytest.approx(4e-4)
    assert rt.message_s == pytest.approx(1e-3, abs=2e-6)
    assert rt.message_busy_s == rt.message_s and rt.load_busy == rt.load_idle  # no busy probe


def test_allreduce_sizes_reach_the_whole_models_gradients():
    """The largest bucket a plan syncs (P=1: the whole model) is measured, not
    extrapolated; nothing larger is, and no more than MAX_SIZES sizes."""
    cal = measured_like(tiny_spec())
    total = int(sum(b.param_bytes for b in cal.blocks))
    sizes = allreduce_sizes(cal.blocks)
    assert max(sizes) == total and min(sizes) == 4096 and len(sizes) <= MAX_SIZES
    big = [b.model_copy(update={"param_bytes": 3e8}) for b in cal.blocks]  # 1.8 GB model
    sizes = allreduce_sizes(big)
    assert max(sizes) == int(sum(b.param_bytes for b in big)) and len(sizes) == MAX_SIZES
    assert sizes == sorted(sizes) and min(sizes) == 4096


def _scaled(block, factor: float, m: int):
    """``block`` with its times at micro-batch size ``m`` multiplied by ``factor``."""
    kinds = ("forward", "forward_nograd", "backward")
    return block.model_copy(
        update={
            k: {
                **getattr(block, k),
                m: Stat(median=getattr(block, k)[m].median * factor, iqr=0.0, n=15),
            }
            for k in kinds
        }
    )


def test_block_timings_keep_theleast_disturbed_pass():
    """Two passes over the blocks: per micro-batch size, the pass whose whole model took
    least counts, all its blocks together (a disturbed pass is slower, never faster)."""
    blocks = measured_like(tiny_spec()).blocks
    ms = sorted(blocks[0].forward)
    lo, hi = ms[0], ms[-1]
    slow_lo = [_scaled(b, 2.0, lo) for b in blocks]  # disturbed at the smallest m
    slow_hi = [_scaled(b, 1.0 + 0.1 * i, hi) for i, b in enumerate(blocks)]  # at the largest
    kept = least_disturbed([slow_lo, slow_hi], ms)
    for k, b in enumerate(kept):
        assert b.forward[lo] == blocks[k].forward[lo] and b.backward[lo] == blocks[k].backward[lo]
        assert b.forward[hi] == blocks[k].forward[hi] and b.backward[hi] == blocks[k].backward[hi]
        assert b.forward_nograd[lo] == blocks[k].forward_nograd[lo]
        assert b.param_bytes == blocks[k].param_bytes and b.optimizer == blocks[k].optimizer
    assert least_disturbed([blocks], ms) == blocks


def test_oversubscribed_sends_take_the_busy_ping_pong_only_without_probe_costs():
    """Cores oversubscribed: without the runtime probes a send costs the ping-pong
    measured while other processes computed; with them, the idle link plus the probes'
    fitted message time (which ``contend`` moves with the plan's load)."""
    spec = tiny_spec()
    cal = measured_like(spec)
    link = cal.p2p_intra.model_copy(
        update={"busy_points": {k: Stat(median=2e-3) for k in cal.p2p_intra.points}}
    )
    cal = cal.model_copy(update={"p2p_intra": link})
    layout = Layout(3, 1, 2, 4, "1f1b")
    stages = [[0, 1], [2, 3], [4, 5]]
    times = BlockTimes.at(cal, 2)
    busy = Hosting(3, 1, 3, "stage_major", True, True, True)
    idle = Hosting(3, 1, 3, "stage_major", True, True, False)
    plain = stage_costs(cal, layout, stages, idle, times).sends
    assert stage_costs(cal, layout, stages, busy, times).sends == pytest.approx([2e-3, 2e-3])
    rt = RuntimeCalibration(source="measured", message_s=1e-4, message_busy_s=5e-4)
    probed = cal.model_copy(update={"runtime": rt})
    sends = stage_costs(probed, layout, stages, busy, times).sends
    assert sends == pytest.approx([x + 1e-4 for x in plain])


def test_compute_times_are_brought_to_the_machine_speed_of_the_probes():
    """The machine ran 10 % slower during the probes than while the blocks were timed
    (the solo probe's model time over the reference): every compute time of the
    calibration is multiplied by that, and the runtime's costs are fitted against the
    probes as measured, so they come out as they were, not as the slowness."""
    spec = tiny_spec()
    fetch = {2: Stat(median=1e-4, iqr=1e-5, n=5)}
    cal = measured_like(spec).model_copy(update={"data": fetch})
    slow = at_machine_speed(cal, 1.1)
    b0, s0 = cal.blocks[2], slow.blocks[2]
    assert s0.forward[2].median == pytest.approx(1.1 * b0.forward[2].median)
    assert s0.forward_nograd[4].median == pytest.approx(1.1 * b0.forward_nograd[4].median)
    assert s0.backward[2].iqr == pytest.approx(1.1 * b0.backward[2].iqr)
    assert s0.optimizer.median == pytest.approx(1.1 * b0.optimizer.median)
    assert slow.data[2].median == pytest.approx(1.1 * cal.data[2].median)
    assert s0.param_bytes == b0.param_bytes and s0.peak_bytes == b0.peak_bytes
    blocks, two = [0, 1, 2, 3, 4, 5], [[0, 1, 2], [3, 4, 5]]
    opt = sum(slow.blocks[i].optimizer.median for i in blocks)
    with_action = RuntimeCalibration(source="measured", action_s=2e-4)
    solo = {
        "stages": [blocks],
        "run": [probe_time(slow, [blocks], 2, 4, 0.0) + 8 * 2e-4],
        "rest": [3e-4],
        "opt": [[opt + 1e-4]],
        "bare": [0.022],
    }
    run = probe_time(slow.model_copy(update={"runtime": with_action}), two, 2, 4, 1e-3)
    samples = {"solo": solo, "idle": {"stages": two, "run": [run], "rest": [0.0]}}
    assert machine_drift(samples, 0.022) == 1.0 and machine_drift(samples, None) == 1.0
    assert machine_drift(samples, 0.02) == pytest.approx(1.1)
    out = calibrate_runtime(cal, samples, 2, 4, reference=0.02)
    rt = out.runtime
    assert rt.drift == pytest.approx(1.1)
    assert out.blocks[2].forward[2].median == pytest.approx(s0.forward[2].median)
    assert rt.action_s == pytest.approx(2e-4) and rt.step_s == pytest.approx(4e-4)
    assert rt.message_s == pytest.approx(1e-3, abs=2e-6)
    # No reference: the blocks stay as timed and the slowness is taken as the runtime's.
    unaware = calibrate_runtime(cal, samples, 2, 4)
    assert unaware.runtime.drift == 1.0 and unaware.blocks == cal.blocks
    assert unaware.runtime.action_s > 1.5 * 2e-4
    # No pipeline probe: nothing to scale to.
    assert calibrate_runtime(cal, {}, 2, 4, reference=0.02) == cal


def test_each_probe_gives_a_rank_its_step_to_step_spread():
    """The idle and busy probes' runs vary from step to step: their relative spread
    (from the interquartile range) is the runtime's step_cv at each probe's load."""
    spec = tiny_spec()
    cal = measured_like(spec)
    blocks, two = [0, 1, 2, 3, 4, 5], [[0, 1, 2], [3, 4, 5]]
    four = [[0, 1], [2, 3], [4], [5]]
    opt = sum(cal.blocks[i].optimizer.median for i in blocks)
    solo = {"stages": [blocks], "run": [probe_time(cal, [blocks], 2, 4, 0.0)], "rest": [0.0]}
    solo["opt"] = [[opt]]
    idle_runs = [x * probe_time(cal, two, 2, 4, 1e-3) for x in (0.9, 0.95, 1.0, 1.05, 1.1)]
    busy_runs = [x * probe_time(cal, four, 2, 4, 2e-3) for x in (0.8, 0.9, 1.0, 1.1, 1.2)]
    samples = {
        "solo": solo,
        "idle": {"stages": two, "run": idle_runs, "rest": [0.0]},
        "busy": {"stages": four, "run": busy_runs, "rest": [0.0]},
    }
    rt = fit_runtime(cal, samples, 2, 4)
    assert rt.step_cv == pytest.approx(Stat.of(idle_runs).rel_std) and rt.step_cv > 0.05
    assert rt.step_cv_busy == pytest.approx(Stat.of(busy_runs).rel_std)
    assert rt.step_cv_busy == pytest.approx(2 * rt.step_cv)
    # Rounds the VM ran at different speeds: the spread is taken within each round.
    rounds = {**samples["idle"], "run": idle_runs + [1.3 * x for x in idle_runs], "round": 5}
    apart = fit_runtime(cal, {**samples, "idle": rounds}, 2, 4)
    assert apart.step_cv == pytest.approx(rt.step_cv)
    assert step_spread(rounds["run"]) > 2 * rt.step_cv  # pooled, the rounds set it apart
    assert rt.probe["busy"]["cv"] == rt.step_cv_busy
    # A plan's spread is read at its own load, between the probes' as message times are.
    rt = rt.model_copy(update={"load_idle": 1.2, "load_busy": 1.8})
    assert rt.cv_at(1.5) == pytest.approx(1.5 * rt.step_cv)
    assert rt.cv_at(0.0) == rt.step_cv and rt.cv_at(99.0) == rt.step_cv_busy
    flat = rt.model_copy(update={"load_busy": 1.2})  # no load between them: the idle one
    assert flat.cv_at(1.5) == rt.step_cv


def test_a_calibration_whose_machine_changed_speed_says_so(tmp_path):
    """The machine 36 % slower during the probes than the block timing: printing the
    record warns that plans follow the probes' speed and says how to take it again;
    a steady one does not."""
    from rich.console import Console

    from jobctl.engine.views.tables import print_calibration

    cal = measured_like(tiny_spec())
    for drift, warned in ((1.36, True), (0.85, True), (1.04, False)):
        rt = RuntimeCalibration(source="measured", drift=drift)
        console = Console(record=True, width=200)
        print_calibration(console, cal.model_copy(update={"runtime": rt}), tmp_path / "c.json")
        text = console.export_text()
        assert f"{100 * (drift - 1):+.0f} % slower during the probes" in text
        assert ("speed moved during the calibration" in text) is warned
        assert ("run `jobctl calibrate` again" in text) is warned


def test_steadiness_counts_slower_and_faster_probes_alike():
    def rt(drift):
        return RuntimeCalibration(source="measured", drift=drift)

    assert rt(1.0).speed_moved == 0.0 and rt(1.0).steady
    assert rt(1.2).speed_moved == pytest.approx(rt(1 / 1.2).speed_moved)
    assert rt(1.09).steady and rt(1 / 1.09).steady
    assert not rt(1.11).steady and not rt(1 / 1.11).steady
