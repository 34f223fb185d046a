"""Tests of the cross-field rules and of schedule (cron, time zone, window) validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from jobctl.spec import JobSpec, SpecError, load_spec_text

from ..spec_texts import MINIMAL, load

BASE_SECTIONS = {
    "name": "name: tiny",
    "model": "model: {}",
    "training": "training: {global_batch_size: 16, steps: 10}",
}


def with_sections(extra: str) -> str:
    """The minimal spec with the top-level sections written in ``extra`` replaced."""
    replaced = {line.split(":")[0] for line in extra.splitlines()}
    kept = [text for key, text in BASE_SECTIONS.items() if key not in replaced]
    return "\n".join([*kept, extra]) + "\n"


def issues_of(text: str) -> list[tuple[int | None, int | None, str, str]]:
    with pytest.raises(SpecError) as info:
        load(text)
    return [(i.line, i.column, i.path, i.message) for i in info.value.errors]


def test_rules_also_guard_direct_construction() -> None:
    with pytest.raises(ValidationError, match="hidden: hidden 10 is not divisible by heads 4"):
        JobSpec(name="x", model={"hidden": 10}, training={"global_batch_size": 4, "steps": 1})


RULE_CASES = [
    pytest.param(
        "model: {hidden: 65, heads: 4}",
        "model.hidden",
        "hidden 65 is not divisible by heads 4",
        "make model.hidden a multiple of 4 or change model.heads",
        id="hidden-heads",
    ),
    pytest.param(
        "hardware: {nodes: 2, processes_per_node: 2}\n"
        "parallelism: {pipeline_stages: 4, data_parallel: 2}",
        "parallelism.pipeline_stages",
        "P x D = 8 devices but the pool has 4 (2 nodes x 2 processes)",
        "lower parallelism.pipeline_stages/data_parallel or raise hardware.nodes",
        id="pool-size",
    ),
    pytest.param(
        "hardware: {nodes: 8}\nparallelism: {pipeline_stages: 8, data_parallel: 1}",
        "parallelism.pipeline_stages",
        "cannot split 6 blocks into 8 stages (embedding + 4 layers + head)",
        "lower parallelism.pipeline_stages to at most 6 or raise model.layers",
        id="blocks",
    ),
    pytest.param(
        "hardware: {nodes: 3}\nparallelism: {data_parallel: 3}\n"
        "training: {global_batch_size: 2, steps: 1}",
        "training.global_batch_size",
        "global_batch_size 2 gives 2 micro-batches of 1, fewer than data_parallel 3: "
        "some replica would get none",
        "raise training.global_batch_size to at least 3 or lower parallelism.data_parallel",
        id="batch-under-d",
    ),
    pytest.param(
        "hardware: {nodes: 4}\nparallelism: {data_parallel: 4}\n"
        "training: {global_batch_size: 16, steps: 1, micro_batch_size: 3}",
        "training.micro_batch_size",
        "global_batch_size is 16, which is not a multiple of micro_batch_size 3",
        "set training.micro_batch_size to a divisor of 16 (1, 2, 4, 8, 16) or 'auto'",
        id="micro-with-d",
    ),
    pytest.param(
        "training: {global_batch_size: 16, steps: 1, micro_batch_size: 5}",
        "training.micro_batch_size",
        "global_batch_size is 16, which is not a multiple of micro_batch_size 5",
        "set training.micro_batch_size to a divisor of 16 (1, 2, 4, 8, 16) or 'auto'",
        id="micro-auto-d",
    ),
    pytest.param(
        "hardware: {device: cuda, accelerator: v100-pcie-16gb}\n"
        "training: {global_batch_size: 16, steps: 1, precision: bf16}",
        "training.precision",
        "v100-pcie-16gb has no bf16 rate (it lists fp32, fp16)",
        "set training.precision to one of fp32, fp16",
        id="accelerator-precision",
    ),
    pytest.param(
        "hardware: {accelerator: v100-sxm2-16gb}",
        "hardware.accelerator",
        "accelerator 'v100-sxm2-16gb' is a GPU, but hardware.device is 'cpu'",
        "set hardware.device: cuda or remove hardware.accelerator",
        id="accelerator-device",
    ),
    pytest.param(
        "elasticity: {min_devices: 4, max_devices: 2}",
        "elasticity.max_devices",
        "max_devices 2 is below min_devices 4",
        "raise elasticity.max_devices or lower elasticity.min_devices",
        id="elastic-range",
    ),
    pytest.param(
        "hardware: {backend: ssh, nodes: 2, hosts: [a.example]}",
        "hardware.hosts",
        "hosts lists 1 address for 2 nodes",
        "list exactly one host per node, or set hardware.nodes to the number of hosts",
        id="hosts",
    ),
    pytest.param(
        "data: {source: text}",
        "data.path",
        "source 'text' needs a `path`",
        "add data.path: <file.txt> next to source",
        id="text-needs-path",
    ),
    pytest.param(
        "data: {path: corpus.txt}",
        "data.path",
        "`path` is only read for sources text, tokens, hf, but source is 'synthetic'",
        "set data.source: tokens (or text, hf) or remove data.path",
        id="path-needs-text",
    ),
    pytest.param(
        "data: {source: tokens}",
        "data.path",
        "source 'tokens' needs a `path`",
        "add data.path: <train.bin> next to source",
        id="tokens-needs-path",
    ),
    pytest.param(
        "data: {source: hf, path: d.parquet}",
        "data.tokenizer",
        "source 'hf' needs a `tokenizer` folder to turn text into token ids",
        "add data.tokenizer: <folder with tokenizer.json> next to source",
        id="hf-needs-tokenizer",
    ),
    pytest.param(
        "data: {source: tokens, path: t.bin, eval: 0.9}",
        "data.eval",
        "eval fraction 0.9 is outside (0, 0.5]",
        "hold out a fraction such as 0.05, or give a path to a separate file",
        id="eval-fraction-range",
    ),
    pytest.param(
        "data: {source: tokens, path: t.bin, dtype: uint16}\nmodel: {vocab: 70000}",
        "data.dtype",
        "uint16 holds token ids below 65536, but model.vocab is 70000",
        "set data.dtype: uint32 (and write the token file as uint32)",
        id="dtype-too-narrow",
    ),
    pytest.param(
        "pruning: {start_step: 50, end_step: 50}",
        "pruning.start_step",
        "start_step 50 must be before end_step 50",
        "lower pruning.start_step or raise pruning.end_step",
        id="pruning-steps",
    ),
    pytest.param(
        "pruning: {initial_sparsity: 0.5, final_sparsity: 0.4}",
        "pruning.initial_sparsity",
        "initial_sparsity 0.5 exceeds final_sparsity 0.4",
        "pruning only grows sparsity: make initial_sparsity <= final_sparsity",
        id="pruning-sparsity",
    ),
    pytest.param(
        "model: {family: gpt, import: 'pkg.mod:blocks'}",
        "model.family",
        "`family` and `import` are exclusive: an imported model is not a builtin family",
        "remove model.family (or remove model.import to use the builtin family)",
        id="family-and-import",
    ),
    pytest.param(
        "model: {family: null}",
        "model.family",
        "no model given: `family` is null and there is no `import`",
        "set model.family: gpt or model.import: 'package.module:factory'",
        id="no-model",
    ),
    pytest.param(
        "training: {global_batch_size: 16, steps: 1, optimizer: adam, momentum: 0.9}",
        "training.momentum",
        "momentum is only used by optimizer 'sgd', but optimizer is 'adam'",
        "remove training.momentum or set training.optimizer: sgd",
        id="momentum",
    ),
    pytest.param(
        "parallelism: {schedule: gpipe, advance_num: 2}",
        "parallelism.advance_num",
        "advance_num is only used by schedule 'advance_forward', not 'gpipe'",
        "remove parallelism.advance_num or set parallelism.schedule: advance_forward",
        id="advance-num",
    ),
    pytest.param(
        "schedule: {timezone: UTC}",
        "schedule.cron",
        "a schedule needs exactly one of `cron` and `interval_s`, neither given",
        "keep one of schedule.cron / schedule.interval_s",
        id="schedule-neither",
    ),
    pytest.param(
        "schedule: {cron: '0 * * * *', interval_s: 60}",
        "schedule.cron",
        "a schedule needs exactly one of `cron` and `interval_s`, both given",
        "keep one of schedule.cron / schedule.interval_s",
        id="schedule-both",
    ),
]


@pytest.mark.parametrize(("extra", "path", "message", "fix"), RULE_CASES)
def test_cross_field_rule(extra: str, path: str, message: str, fix: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text(with_sections(extra), "job.yaml")
    [issue] = info.value.errors
    assert (issue.path, issue.message, issue.fix) == (path, message, fix)
    assert f"job.yaml:{issue.line}:{issue.column}: {path}: {message}\n  fix: {fix}" == str(
        info.value
    )


def test_rule_error_points_at_the_key_it_is_about() -> None:
    text = """\
    name: tiny
    model: {}
    training:
      global_batch_size: 16
      steps: 10
    hardware:
      nodes: 2
    parallelism:
      pipeline_stages: 2
      data_parallel: 4
    """
    assert issues_of(text) == [
        (
            9,
            3,
            "parallelism.pipeline_stages",
            "P x D = 8 devices but the pool has 2 (2 nodes x 1 processes)",
        ),
    ]


def test_rule_about_an_omitted_key_points_at_its_section() -> None:
    # `path` is not written at all, so the issue lands on the `data:` key.
    assert issues_of(MINIMAL + "data:\n  source: text\n") == [
        (6, 1, "data.path", "source 'text' needs a `path`")
    ]


@pytest.mark.parametrize("cron", ["*/5 * * * *", "0 3 * * mon-fri", "30 2 1 jan,jul *"])
def test_valid_cron_expressions(cron: str) -> None:
    spec = load(MINIMAL + f"schedule:\n  cron: '{cron}'\n")
    assert spec.schedule is not None and spec.schedule.cron == cron
    assert spec.schedule.interval_s is None and spec.schedule.timezone == "UTC"


def test_cron_with_wrong_field_count() -> None:
    with pytest.raises(SpecError) as info:
        load(MINIMAL + "schedule:\n  cron: '0 0 * * * *'\n")
    assert str(info.value) == (
        "job.yaml:7:9: schedule.cron: cron needs 5 fields, got 6 in '0 0 * * * *'\n"
        "  fix: write it as '<minute> <hour> <day of month> <month> <day of week>', "
        "e.g. '0 */6 * * *' for every six hours"
    )


def test_cron_with_value_out_of_range() -> None:
    assert issues_of(MINIMAL + "schedule:\n  cron: '61 * * * *'\n") == [
        (
            7,
            9,
            "schedule.cron",
            "invalid cron expression '61 * * * *': Error validating expression '61': "
            "the last value (61) is higher than the maximum value (59)",
        )
    ]


def test_timezone_must_exist_and_gets_a_suggestion() -> None:
    with pytest.raises(SpecError) as info:
        load(MINIMAL + "schedule:\n  interval_s: 60\n  timezone: Europe/Berln\n")
    [issue] = info.value.errors
    assert (issue.line, issue.column, issue.path) == (8, 13, "schedule.timezone")
    assert issue.message == "unknown time zone 'Europe/Berln'"
    assert issue.suggestion == "Europe/Berlin"


def test_schedule_window_must_end_after_it_starts() -> None:
    text = MINIMAL + "schedule:\n  interval_s: 60\n  start: 2025-02-01\n  end: 2025-01-01\n"
    assert issues_of(text) == [
        (
            9,
            3,
            "schedule.end",
            "the window ends (2025-01-01 00:00:00) before it starts (2025-02-01 00:00:00)",
        )
    ]
