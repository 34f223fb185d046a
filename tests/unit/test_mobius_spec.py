"""``parallelism.schedule: mobius`` at validate time (spec/mobius.py): S may exceed the
pool, must exceed it, and what Mobius does not compose with is refused naming the
field, the file and line, and a fix."""

import pytest

from jobctl.spec import SpecError, load_spec_text

SPEC = """\
name: mob
model:
  layers: 4
training:
  global_batch_size: 8
  steps: 5
hardware:
  processes_per_node: 2
parallelism:
  pipeline_stages: {S}
  schedule: mobius
{extra}"""


def _issue(S, extra=""):
    with pytest.raises(SpecError) as info:
        load_spec_text(SPEC.format(S=S, extra=extra), "jobs/mob.yaml")
    (issue,) = info.value.errors
    return issue


def test_stages_may_exceed_the_pool():
    spec = load_spec_text(SPEC.format(S=4, extra=""), "jobs/mob.yaml")
    assert spec.parallelism.pipeline_stages == 4 and spec.hardware.devices == 2


def test_stages_must_exceed_the_pool():
    issue = _issue(2)
    assert (issue.path, issue.file, issue.line) == (
        "parallelism.pipeline_stages",
        "jobs/mob.yaml",
        10,
    )
    assert "more stages than devices: S = 2, N = 2" in issue.message
    assert "above 2" in issue.fix


def test_stages_may_not_be_auto():
    issue = _issue("auto")
    assert issue.path == "parallelism.pipeline_stages" and "not 'auto'" in issue.message
    assert "e.g. 4" in issue.fix


@pytest.mark.parametrize(
    ("extra", "path", "line", "message"),
    [
        ("  data_parallel: 2\n", "parallelism.data_parallel", 12, "data parallelism"),
        ("  tensor_parallel: 2\n", "parallelism.tensor_parallel", 12, "tensor parallelism"),
        ("  tensor_parallel: auto\n", "parallelism.tensor_parallel", 12, "tensor parallel"),
        ("  averaging: elastic\n", "parallelism.averaging", 12, "elastic averaging"),
        ("  recompute: stage_aware\n", "parallelism.recompute", 12, "stage-aware"),
    ],
)
def test_refusals_name_the_field_line_and_fix(extra, path, line, message):
    with pytest.raises(SpecError) as info:
        load_spec_text(SPEC.format(S=4, extra=extra), "jobs/mob.yaml")
    mine = [i for i in info.value.errors if i.path == path and "schedule mobius" in i.message]
    assert len(mine) == 1, [(i.path, i.message) for i in info.value.errors]
    issue = mine[0]
    assert (issue.file, issue.line) == ("jobs/mob.yaml", line)
    assert message in issue.message
    assert "set parallelism.schedule to 1f1b" in issue.fix and path in issue.fix


def test_pruning_and_rebalancing_run_under_mobius():
    # masks on the swapped records, the S stages re-cut on their ranks
    # (tests/integration/test_pruning_multiproc.py)
    prune = "pruning:\n  enabled: true\n  start_step: 1\n  end_step: 4\n  frequency: 1\n"
    rebalance = "rebalancing:\n  enabled: true\n"
    spec = load_spec_text(SPEC.format(S=4, extra=prune + rebalance), "jobs/mob.yaml")
    assert spec.pruning.enabled and spec.rebalancing.enabled
    assert spec.parallelism.schedule == "mobius"


def test_packing_is_refused_with_its_reason():
    extra = "rebalancing:\n  enabled: true\n  pack: true\n"
    with pytest.raises(SpecError) as info:
        load_spec_text(SPEC.format(S=4, extra=extra), "jobs/mob.yaml")
    (issue,) = [i for i in info.value.errors if i.path == "rebalancing.pack"]
    assert "cross mapping" in issue.message and "frees none" in issue.message
    assert "remove rebalancing.pack" in issue.fix


def test_an_all_auto_spec_plans_with_tensor_parallel_auto():
    """auto considers Mobius on every all-auto spec: T = auto must not break that check."""
    from jobctl.engine.planner.resolver import make_plan

    from ..jobrun import tiny_spec

    spec = tiny_spec(
        **{
            "parallelism.pipeline_stages": "auto",
            "parallelism.data_parallel": "auto",
            "parallelism.schedule": "auto",
            "parallelism.tensor_parallel": "auto",
        }
    )
    assert make_plan(spec, spec.hardware.devices).T == 1  # the builtin model is hand-cut


def test_tensor_parallel_under_mobius_is_one_error_with_its_reason():
    # The pool check counts Mobius's S stages as no devices; it said "T x P x D = 8
    # processes but the pool has 2" beside the real refusal.
    with pytest.raises(SpecError) as info:
        load_spec_text(SPEC.format(S=4, extra="  tensor_parallel: 2\n"), "jobs/mob.yaml")
    (issue,) = [i for i in info.value.errors if i.path == "parallelism.tensor_parallel"]
    assert "a T group would swap each record's T shards" in issue.message
