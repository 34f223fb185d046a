"""Sub-pipelined TMP (Merak 5.3) before anything runs: the paper's T_m / T_a cost
against numbers worked by hand, ``parallelism.tp_subpipeline`` at ``validate`` (exit
2 at its line, with a fix), and the flag the plan carries."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from jobctl.engine.cli.app import app
from jobctl.engine.planner import tp_overlap as ov
from jobctl.engine.planner.tp_overlap import LayerTimes

from ..jobrun import quickstart_with

runner = CliRunner()
GPT2 = (
    "  huggingface:\n    class: GPT2LMHeadModel\n    config: {n_layer: 2, "
    "n_embd: 32, n_head: 4, vocab_size: 256, n_positions: 32}"
)
LAYOUT = "  pipeline_stages: 2\n  data_parallel: 2"


def test_paper_costs_by_hand():
    # T_m = T_a = 1, K = 2: plain (3 + 2) 2 = 10; forward 1/4 + 7/4 + 1/4 = 2.25;
    # backward 1/2 + 7/4 * 2 + 1/4 = 4.25; total 3/4 + 1/2 + 7/4 * 3 = 6.5
    assert ov.plain(1, 1, 2) == 10
    assert ov.forward(1, 1, 2) == pytest.approx(2.25)
    assert ov.backward(1, 1, 2) == pytest.approx(4.25)
    assert ov.subpipelined(1, 1, 2) == pytest.approx(6.5)
    assert ov.gain(LayerTimes(1, 1, 2)) == pytest.approx(3.5)
    # nothing to hide: no all-reduce, or no compute
    assert ov.gain(LayerTimes(1, 0, 3)) == pytest.approx(0.0)
    assert ov.gain(LayerTimes(0, 1, 1)) == pytest.approx(0.0)
    # many equal layers: 5 K / (3 K) -> 5/3
    assert ov.plain(1, 1, 1000) / ov.subpipelined(1, 1, 1000) == pytest.approx(5 / 3, rel=1e-3)


def test_overhead_and_hidden_share_cost_the_split():
    # T_o = 0.2: 3/4 1.2 + 1/2 + 7/4 max(3.6, 3.4, 2) = 7.7, 10 - 7.7
    assert ov.gain(LayerTimes(1, 1, 2, T_o=0.2)) == pytest.approx(2.3)
    # nothing hides: 3/4 1.2 + 7/4 3.6 + 2 K T_a = 11.2, a loss of 1.2
    assert ov.gain(LayerTimes(1, 1, 2, T_o=0.2), hidden=0.0) == pytest.approx(-1.2)
    # half hides: 3/4 + 1/4 + 7/4 max(3, 2.5, 1) + 2 * 2 * 0.5 = 8.25
    assert ov.gain(LayerTimes(1, 1, 2), hidden=0.5) == pytest.approx(1.75)
    assert ov.hidden_share("cuda", 2, 8) == 1.0
    assert ov.hidden_share("cpu", 2, 2) == 0.0
    assert ov.hidden_share("cpu", 6, 4) == 0.5
    assert ov.hidden_share("cpu", 16, 4) == 1.0


def test_machine_ranks_count_every_local_node():
    from jobctl.spec.sections import HardwareSpec

    local = HardwareSpec(backend="local", nodes=2, processes_per_node=2)
    assert ov.machine_ranks(local) == 4 and ov.machine_ranks(local, 3) == 3
    # two local "nodes" of 2 ranks on 6 cores: (6 - 4) / 4 of T_a hides, not (6 - 2) / 2
    assert ov.hidden_share("cpu", 6, ov.machine_ranks(local)) == 0.5
    remote = local.model_copy(update={"backend": "ssh"})
    assert not remote.one_machine and ov.machine_ranks(remote, 4) == 2


def test_layers_from_blocks():
    got = ov.layers([2.0, 2.0], [0.5, 0.5], [2, 2], [0.1, 0.1])
    assert got == LayerTimes(T_m=2.0, T_a=0.5, K=2.0, T_o=0.1)
    assert ov.layers([1.0], [0.0], [0]) is None


def _spec(tmp_path, flag: str, T: int | str = 2, edit: tuple[str, str] | None = None):
    layout = f"  pipeline_stages: 1\n  data_parallel: 2\n  tensor_parallel: {T}"
    path = quickstart_with(
        tmp_path / "job.yaml",
        (LAYOUT, f"{layout}\n  tp_subpipeline: {flag}"),
        ("  family: gpt", GPT2),
    )
    if edit:
        path.write_text(path.read_text().replace(*edit))
    return path


def _fails(path, *words: str) -> None:
    r = runner.invoke(app, ["validate", str(path)])
    assert r.exit_code == 2, r.output
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "tp_subpipeline" in t)
    assert f"{path}:{line}:" in r.output and "fix:" in r.output, r.output
    assert "Traceback" not in r.output
    for word in words:
        assert word in r.output, r.output


def test_bad_values_are_refused_at_validate(tmp_path):
    _fails(_spec(tmp_path, "maybe"), "expected auto, true or false")
    _fails(_spec(tmp_path, "true", T=1), "needs tensor_parallel > 1")
    _fails(
        _spec(tmp_path, "true", edit=("micro_batch_size: 2 ", "micro_batch_size: 3 ")),
        "micro_batch_size is 3",
    )
    _fails(_spec(tmp_path, "true", edit=("schedule: 1f1b", "schedule: zb_h1")), "ZB-H1")


@pytest.mark.parametrize("flag", ["true", "false", "auto"])
def test_plan_carries_the_resolved_flag(tmp_path, flag):
    from jobctl.engine.planner.resolver import make_plan
    from jobctl.spec import load_spec

    path = _spec(tmp_path, flag)
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0
    plan = make_plan(load_spec(path))
    line = next(x for x in plan.explanation if x.startswith("sub-pipelined TMP"))
    assert plan.tp_subpipeline == (flag == "true") or flag == "auto", line
    if flag == "auto":  # on exactly where the predicted gain is positive
        saved = float(line.split("predicted ")[1].split(" ms")[0])
        assert plan.tp_subpipeline == (saved > 0), line


def test_zb_h1_winning_under_auto_schedule_turns_it_off(tmp_path):
    from jobctl.engine.planner.resolver import make_plan
    from jobctl.spec import load_spec

    spec = load_spec(_spec(tmp_path, "true"))
    plan = make_plan(spec)
    assert plan.tp_subpipeline
    zb = plan.model_copy(update={"schedule": "zb_h1", "tp_subpipeline": False})
    out = ov.resolve(spec, None, zb)  # decided before any cost is read
    assert not out.tp_subpipeline
    assert out.explanation[-1] == (
        "sub-pipelined TMP off: ZB-H1 splits the backward, which the halves run by hand"
    )


def test_true_at_an_auto_T_of_1_says_so(tmp_path):
    from jobctl.engine.planner.resolver import make_plan
    from jobctl.spec import load_spec

    path = _spec(
        tmp_path,
        "true",
        T="auto",  # one process a node: no T > 1 fits
        edit=("processes_per_node: 2", "processes_per_node: 1"),
    )
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0
    plan = make_plan(load_spec(path))
    assert plan.T == 1 and not plan.tp_subpipeline
    line = next(x for x in plan.explanation if x.startswith("sub-pipelined TMP"))
    assert "true but the plan's T is 1" in line, line
    assert any(x.startswith("T = 1 only: no T > 1 divides") for x in plan.t_search)
