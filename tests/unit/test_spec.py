"""Tests of the job spec models: examples, defaults, immutability, rules and serialisation."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError

from jobctl.spec import (
    SpecError,
    dump_yaml,
    json_schema,
    load_spec,
    load_spec_text,
    spec_hash,
)

from ..spec_texts import MINIMAL, load

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def test_quickstart_example_loads() -> None:
    spec = load_spec(JOBS / "quickstart.yaml")
    assert spec.name == "quickstart"
    assert (spec.model.layers, spec.model.hidden, spec.model.heads) == (4, 64, 4)
    assert (spec.model.seq_len, spec.model.vocab, spec.data.source) == (32, 256, "synthetic")
    t = spec.training
    assert (t.global_batch_size, t.micro_batch_size, t.steps) == (16, 2, 60)
    assert (t.optimizer, t.lr, t.seed) == ("adamw", 1e-2, 0)
    hw = spec.hardware
    assert (hw.backend, hw.nodes, hw.processes_per_node, hw.device) == ("local", 2, 2, "cpu")
    assert hw.memory_gb == 2.0 and hw.devices == 4
    p = spec.parallelism
    assert (p.pipeline_stages, p.data_parallel, p.schedule) == (2, 2, "1f1b")
    assert spec.checkpoint.interval == 30


def test_spot_example_loads() -> None:
    spec = load_spec(JOBS / "gpt-small-spot.yaml")
    assert spec.name == "gpt-small-spot"
    assert (spec.hardware.device, spec.hardware.nodes, spec.hardware.processes_per_node) == (
        "cuda",
        4,
        8,
    )
    assert spec.hardware.spot is True
    assert (spec.parallelism.pipeline_stages, spec.parallelism.data_parallel) == ("auto", "auto")
    assert spec.parallelism.schedule == "varuna"
    assert spec.elasticity.enabled is True
    assert spec.checkpoint.remote == "s3://my-bucket/runs/gpt-small"
    assert spec.pruning.enabled is False and spec.pruning.final_sparsity == 0.8
    assert spec.training.betas == (0.9, 0.95)
    assert spec.schedule is not None and spec.schedule.cron == "*/30 * * * *"


def test_model_data_and_training_defaults() -> None:
    spec = load(MINIMAL)
    m = spec.model
    assert (m.family, m.layers, m.hidden, m.heads, m.seq_len, m.vocab) == ("gpt", 4, 64, 4, 32, 256)
    assert (m.dropout, m.tie_embeddings, m.import_, m.import_args) == (0.0, True, None, {})
    assert (spec.data.source, spec.data.path, spec.data.seed) == ("synthetic", None, 0)
    t = spec.training
    assert (t.micro_batch_size, t.optimizer, t.lr, t.weight_decay) == ("auto", "adamw", 1e-3, 0.0)
    assert (t.betas, t.momentum, t.lr_schedule, t.warmup_steps) == (
        (0.9, 0.999),
        0.0,
        "constant",
        0,
    )
    assert (t.seed, t.precision, t.log_every) == (0, "fp32", 1)


def test_hardware_and_parallelism_defaults() -> None:
    spec = load(MINIMAL)
    hw = spec.hardware
    assert (hw.backend, hw.nodes, hw.processes_per_node, hw.device) == ("local", 1, 1, "cpu")
    assert (hw.memory_gb, hw.flops_tflops, hw.price_per_hour, hw.spot) == (4.0, None, 0.0, False)
    net = hw.interconnect
    assert (net.intra_node_gbps, net.inter_node_gbps, net.latency_us) == (100.0, 10.0, 50.0)
    assert (hw.hosts, hw.rendezvous_host, hw.rendezvous_port) == ([], "127.0.0.1", None)
    p = spec.parallelism
    assert (p.pipeline_stages, p.data_parallel, p.schedule) == ("auto", "auto", "1f1b")
    assert (p.recompute, p.advance_num, p.placement) == ("none", None, "stage_major")


def test_phase_defaults() -> None:
    spec = load(MINIMAL)
    e = spec.elasticity
    assert (e.enabled, e.min_devices, e.max_devices) == (False, 1, None)
    assert (e.heartbeat_timeout_s, e.straggler_threshold, e.exclude_stragglers) == (
        30.0,
        0.15,
        False,
    )
    pr = spec.pruning
    assert (pr.enabled, pr.initial_sparsity, pr.final_sparsity) == (False, 0.0, 0.9)
    assert (pr.start_step, pr.end_step, pr.frequency, pr.sparse_threshold) == (0, 100, 10, "auto")
    assert pr.prunable == ["layers.*.attn.*.weight", "layers.*.mlp.*.weight"]
    r = spec.rebalancing
    assert (r.enabled, r.balancer, r.by, r.pack, r.target_devices, r.tolerance) == (
        False,
        "partition",
        "time",
        False,
        None,
        0.05,
    )
    c = spec.checkpoint
    assert (c.interval, c.local_dir, c.remote, c.keep_last, c.keep_every, c.upload_retries) == (
        50,
        None,
        None,
        3,
        None,
        5,
    )
    assert spec.schedule is None


def test_default_prunable_list_is_not_shared() -> None:
    first, second = load(MINIMAL), load(MINIMAL)
    assert first.pruning.prunable is not second.pruning.prunable


def test_spec_is_frozen() -> None:
    spec = load(MINIMAL)
    with pytest.raises(ValidationError, match="frozen"):
        spec.training.steps = 5  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        spec.name = "other"  # type: ignore[misc]
    assert spec.training.steps == 10 and spec.name == "tiny"


def test_import_alias_sets_family_to_none_and_dumps_as_import() -> None:
    spec = load(
        MINIMAL.replace(
            "model: {}", "model:\n  import: my_pkg.models:blocks\n  import_args: {width: 8}"
        )
    )
    assert spec.model.import_ == "my_pkg.models:blocks"
    assert spec.model.family is None and spec.model.num_blocks is None
    assert spec.model.import_args == {"width": 8}
    text = dump_yaml(spec)
    assert "  import: my_pkg.models:blocks\n" in text and "import_" not in text.replace(
        "import_args", ""
    )
    assert load_spec_text(text) == spec


def test_import_reference_must_name_a_factory() -> None:
    with pytest.raises(SpecError) as info:
        load(MINIMAL.replace("model: {}", "model: {import: my_pkg.models}"))
    assert str(info.value) == (
        "job.yaml:2:17: model.import: 'my_pkg.models' is not a factory reference\n"
        "  fix: write it as 'package.module:factory', e.g. 'mypkg.models:build_blocks'"
    )


def test_json_schema_describes_every_property() -> None:
    schema = json_schema()
    models = {"JobSpec": schema, **schema["$defs"]}
    assert set(models) == {
        "JobSpec",
        "ModelSpec",
        "DataSpec",
        "TrainingSpec",
        "HardwareSpec",
        "InterconnectSpec",
        "ParallelismSpec",
        "ElasticitySpec",
        "PruningSpec",
        "RebalancingSpec",
        "CheckpointSpec",
        "ScheduleSpec",
        "SlurmSpec",
        "KubernetesSpec",
        "SshSpec",
        "BudgetSpec",
        "PlannerSpec",
        "HuggingFaceSpec",
        "TopologySpec",
        "LossScaleSpec",
    }
    undocumented = [
        f"{name}.{prop}"
        for name, model in models.items()
        for prop, info in model["properties"].items()
        if not info.get("description", "").strip()
    ]
    assert undocumented == []
    assert "import" in schema["$defs"]["ModelSpec"]["properties"]
    assert "import_" not in schema["$defs"]["ModelSpec"]["properties"]
    assert schema["required"] == ["name", "model", "training"]
    assert schema["$defs"]["TrainingSpec"]["properties"]["micro_batch_size"]["anyOf"] == [
        {"maximum": 1 << 20, "minimum": 1, "type": "integer"},
        {"const": "auto", "type": "string"},
    ]


@pytest.mark.parametrize("name", ["quickstart.yaml", "gpt-small-spot.yaml"])
def test_dump_yaml_round_trips_examples(name: str) -> None:
    spec = load_spec(JOBS / name)
    assert load_spec_text(dump_yaml(spec)) == spec


def test_dump_yaml_round_trips_schedule_window() -> None:
    spec = load(
        MINIMAL + "schedule:\n  interval_s: 90\n  timezone: Europe/Berlin\n"
        "  start: 2025-01-01T00:00:00Z\n  end: 2025-02-01T00:00:00Z\n"
    )
    assert spec.schedule is not None
    assert spec.schedule.start == datetime(2025, 1, 1, tzinfo=timezone.utc)
    again = load_spec_text(dump_yaml(spec))
    assert again == spec and spec_hash(again) == spec_hash(spec)


def test_spec_hash_is_stable_and_tracks_changes() -> None:
    spec = load(MINIMAL)
    digest = spec_hash(spec)
    assert re.fullmatch(r"[0-9a-f]{16}", digest)
    reordered = (
        "training:\n  steps: 10\n  global_batch_size: 16  # comment\nmodel: {}\nname: tiny\n"
    )
    assert spec_hash(load(reordered)) == digest
    assert spec_hash(load(MINIMAL)) == digest
    assert spec_hash(load(MINIMAL, overrides={"training.steps": 11})) != digest
    changed = spec.model_copy(update={"name": "tiny2"})
    assert spec_hash(changed) != digest


def test_overrides_apply_before_validation() -> None:
    spec = load_spec(
        JOBS / "quickstart.yaml",
        overrides={"training.steps": 3, "hardware.nodes": 1, "parallelism.data_parallel": 1},
    )
    assert (spec.training.steps, spec.hardware.nodes, spec.parallelism.data_parallel) == (3, 1, 1)


def test_override_creates_missing_sections_and_accepts_field_names() -> None:
    spec = load(
        MINIMAL,
        overrides={
            "hardware.interconnect.latency_us": 5,
            "model.import_": "m:f",
            "schedule.cron": "0 0 * * *",
        },
    )
    assert spec.hardware.interconnect.latency_us == 5.0
    assert spec.model.import_ == "m:f" and spec.model.family is None
    assert spec.schedule is not None and spec.schedule.cron == "0 0 * * *"


def test_unknown_override_names_the_override() -> None:
    with pytest.raises(SpecError) as info:
        load(MINIMAL, overrides={"training.stepz": 3, "training.steps.x": 1})
    assert str(info.value) == (
        "job.yaml: training.stepz: unknown override: no key 'stepz' in 'training' "
        "(did you mean 'training.steps'?)\n"
        "job.yaml: training.steps.x: override 'training.steps.x': 'training.steps' is a value, "
        "not a section"
    )


def test_bad_override_value_is_reported_as_coming_from_the_override() -> None:
    with pytest.raises(SpecError) as info:
        load(MINIMAL, overrides={"training.steps": 0})
    [issue] = info.value.errors
    assert (issue.line, issue.column, issue.path) == (None, None, "training.steps")
    assert issue.message == (
        "Input should be greater than or equal to 1, got 0 (from override training.steps=0)"
    )


def test_text_data_path_resolves_against_the_spec_folder(tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    folder.mkdir()
    job = folder / "job.yaml"
    job.write_text(MINIMAL + "data:\n  source: text\n  path: ../data/corpus.txt\n")
    spec = load_spec(job)
    assert spec.data.path == str(tmp_path / "data" / "corpus.txt")
    absolute = tmp_path / "abs.txt"
    job.write_text(MINIMAL + f"data:\n  source: text\n  path: {absolute}\n")
    assert load_spec(job).data.path == str(absolute)


def test_text_data_path_from_a_string_resolves_against_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spec = load_spec_text(MINIMAL + "data: {source: text, path: corpus.txt}\n")
    assert spec.data.path == str(tmp_path / "corpus.txt")
