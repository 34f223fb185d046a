"""Tests of spec error reports: positions, suggestions, fixes, and collecting every issue."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import yaml

from jobctl.spec import SpecError, SpecIssue, load_spec, load_spec_text

GOOD = """\
name: tiny
model:
  layers: 2
training:
  global_batch_size: 8
  steps: 5
hardware:
  nodes: 2
  interconnect:
    latency_us: 10
"""


def error_of(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec_text(text, "jobs/job.yaml")
    return info.value


def test_good_base_loads() -> None:
    spec = load_spec_text(GOOD)
    assert (spec.model.layers, spec.hardware.nodes) == (2, 2)
    assert spec.hardware.interconnect.latency_us == 10.0


def test_unknown_top_level_key_points_at_the_key_with_a_suggestion() -> None:
    err = error_of(GOOD + "trainng:\n  steps: 3\n")
    assert (
        str(err) == "jobs/job.yaml:11:1: trainng: unknown key 'trainng' (did you mean 'training'?)"
    )
    [issue] = err.errors
    assert issue == SpecIssue(
        "jobs/job.yaml", 11, 1, "trainng", "unknown key 'trainng'", "training"
    )


WHOLE_REPORTS = yaml.safe_load(
    (Path(__file__).parents[1] / "data" / "spec_error_reports.yaml").read_text()
)


@pytest.mark.parametrize("case", WHOLE_REPORTS.values(), ids=WHOLE_REPORTS)
def test_whole_report(case: dict) -> None:
    """The spec text of ``case`` (GOOD with one edit, or its own) and its whole report."""
    if "replace" in case:
        text = GOOD.replace(*case["replace"])
    else:
        text = case.get("text", GOOD + case.get("append", ""))
    assert str(error_of(text)) == case["report"]


def test_key_valid_in_several_sections_names_them_all() -> None:
    err = error_of(GOOD.replace("  nodes: 2", "  nodes: 2\n  enabled: true"))
    assert err.errors[0].fix == "'enabled' belongs under 'elasticity', 'pruning' or 'rebalancing'"


def test_yaml_1_1_boolean_words_stay_key_names() -> None:
    # `on:` is True to a YAML 1.1 loader; as a key it must be reported as written.
    err = error_of(GOOD + "on: 1\n")
    assert [(i.line, i.column, i.path, i.message) for i in err.errors] == [
        (11, 1, "on", "unknown key 'on'")
    ]


def test_section_of_the_wrong_shape() -> None:
    err = error_of(GOOD + "checkpoint: [1, 2]\n")
    assert [(i.line, i.column, i.path) for i in err.errors] == [(11, 13, "checkpoint")]
    assert err.errors[0].message == (
        "Input should be a valid dictionary or instance of CheckpointSpec, got a list"
    )


def test_invalid_name_suggests_a_safe_one() -> None:
    err = error_of(GOOD.replace("name: tiny", "name: 'My Job/1'"))
    [issue] = err.errors
    assert (issue.line, issue.column, issue.path) == (1, 7, "name")
    assert (issue.message, issue.suggestion) == ("'My Job/1' is not a valid job name", "my-job-1")


def test_yaml_syntax_error_has_a_position() -> None:
    err = error_of("name: tiny\nmodel:\n  layers: [1, 2\ntraining: {}\n")
    [issue] = err.errors
    assert (issue.file, issue.line, issue.column, issue.path) == ("jobs/job.yaml", 4, 9, "")
    assert str(err) == (
        "jobs/job.yaml:4:9: YAML syntax error: while parsing a flow sequence "
        "expected ',' or ']', but got ':'"
    )


def test_bad_indentation_is_a_syntax_error() -> None:
    err = error_of("name: tiny\nmodel:\n  layers: 2\n   hidden: 4\n")
    assert [(i.line, i.column) for i in err.errors] == [(4, 10)]
    assert err.errors[0].message == "YAML syntax error: mapping values are not allowed here"


def test_all_issues_are_collected_in_file_order() -> None:
    text = """\
name: tiny
model:
  hidden: 0
  heads: x
training:
  global_batch_size: 8
  stpes: 5
hardware:
  nodes: 2
  nodes: 3
  backend: slurmm
"""
    err = error_of(text)
    assert [(i.line, i.column, i.path) for i in err.errors] == [
        (3, 11, "model.hidden"),
        (4, 10, "model.heads"),
        (5, 1, "training.steps"),
        (7, 3, "training.stpes"),
        (10, 3, "hardware.nodes"),
        (11, 12, "hardware.backend"),
    ]
    assert [i.suggestion for i in err.errors] == [None, None, None, "steps", None, "slurm"]
    assert len(str(err).splitlines()) == 8  # six issues, two with a fix line


def test_missing_top_level_keys_point_at_the_document_start() -> None:
    err = error_of("# my job\nmodel: {}\n")
    assert [(i.line, i.column, i.path, i.fix) for i in err.errors] == [
        (2, 1, "name", "add 'name:' at the top level"),
        (2, 1, "training", "add 'training:' at the top level"),
    ]


def test_empty_file_reports_every_missing_section() -> None:
    err = error_of("")
    assert [i.path for i in err.errors] == ["name", "model", "training"]
    assert {(i.line, i.column) for i in err.errors} == {(1, 1)}


def test_error_inside_a_list_names_the_item() -> None:
    err = error_of(GOOD.replace("  nodes: 2", "  nodes: 2\n  hosts: [a, {b: 1}]"))
    assert [(i.line, i.column, i.path) for i in err.errors] == [(9, 14, "hardware.hosts[1]")]


def test_anchors_and_merge_keys_are_supported() -> None:
    text = GOOD + "x-net: &net {intra_node_gbps: 50}\n"
    err = error_of(text)  # x-net itself is not a spec key
    assert [i.path for i in err.errors] == ["x-net"]
    merged = GOOD.replace("    latency_us: 10", "    <<: {intra_node_gbps: 50}\n    latency_us: 10")
    spec = load_spec_text(merged)
    assert spec.hardware.interconnect.intra_node_gbps == 50.0


def test_unknown_tag_is_reported_at_the_value() -> None:
    err = error_of(GOOD.replace("steps: 5", "steps: !!python/int 5"))
    assert [(i.line, i.column, i.path) for i in err.errors][0] == (6, 10, "training.steps")
    assert err.errors[0].message.startswith("cannot read value: could not determine a constructor")


def test_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as info:
        load_spec(missing)
    [issue] = info.value.errors
    assert (issue.file, issue.line, issue.path) == (str(missing), None, "")
    assert issue.message.startswith("cannot read job spec: [Errno 2] No such file or directory")


def test_spec_error_survives_pickling() -> None:
    err = error_of(GOOD + "trainng: {}\n")
    again = pickle.loads(pickle.dumps(err))
    assert again.errors == err.errors and str(again) == str(err)


def test_errors_from_a_file_name_the_file(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(GOOD.replace("layers: 2", "layers: 0"))
    with pytest.raises(SpecError) as info:
        load_spec(job)
    assert str(info.value) == (
        f"{job}:3:11: model.layers: Input should be greater than or equal to 1, got 0"
    )
