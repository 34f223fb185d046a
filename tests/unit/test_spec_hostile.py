"""Hostile job specs (#24 items 12, 13, 19, 20): every one is a located SpecError, fast.

Before the bounds an alias bomb grew past 3 GB, 600 nested brackets raised
RecursionError, `1e30` layers overflowed in `plan`, control characters were placed by a
character offset and non-UTF-8 bytes by a codec message.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobctl.spec import SpecError, load_spec, load_spec_text
from jobctl.spec.limits import MAX_LAYERS, MAX_NODES, MAX_PROCESSES

from ..spec_texts import MINIMAL


def spec_with(extra: dict[str, str]) -> str:
    """A valid spec with ``extra`` flow-mapping entries added to its sections."""
    sections = {"model": "", "training": "global_batch_size: 16, steps: 10"}
    for section, entry in extra.items():
        sections[section] = ", ".join(part for part in (sections.get(section), entry) if part)
    return "name: tiny\n" + "".join(f"{k}: {{{v}}}\n" for k, v in sections.items())


def issues_of(text: str) -> list:
    start = time.monotonic()
    with pytest.raises(SpecError) as info:
        load_spec_text(text, "job.yaml")
    assert time.monotonic() - start < 5.0, "a hostile spec must fail fast"
    return info.value.errors


def the_issue(text: str, words: str):
    found = [issue for issue in issues_of(text) if words in issue.message]
    assert found, f"no issue says {words!r}"
    return found[0]


BOMB = 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10)
)
MERGES = "m0: &m0 {x: 1, y: 2}\n" + "".join(
    f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], z{i}: 1}}\n" for i in range(1, 40)
)


def test_an_alias_bomb_is_stopped_at_the_value_that_crosses_the_bound():
    issue = the_issue(MINIMAL + BOMB, "once its aliases are expanded")
    assert issue.line == 6 and issue.fix


def test_doubling_merges_are_stopped():
    assert the_issue(MINIMAL + MERGES, "more than 10000 values").line is not None


@pytest.mark.parametrize(
    "text, line",
    [("a: " + "[" * 600 + "]" * 600, 1), ("".join(" " * i + f"k{i}:\n" for i in range(300)), 64)],
    ids=["brackets", "mappings"],
)
def test_deep_nesting_is_a_located_error_not_a_recursion_error(text, line):
    issue = the_issue(text, "nested deeper than 64 levels")
    assert issue.line == line


def test_too_many_values_and_too_many_bytes():
    assert the_issue("a: [" + "1," * 20000 + "]", "more than 10000 values").line == 1
    huge = the_issue("a: " + "x" * (2 << 20), "longer than")
    assert (huge.line, huge.column) == (1, (1 << 20) + 1)


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("model.layers", "1.0e+30", ""),
        ("model.layers", str(MAX_LAYERS + 1), f"less than or equal to {MAX_LAYERS}"),
        ("training.global_batch_size", str(10**30), "less than or equal to"),
        ("hardware.processes_per_node", str(2**63), f"less than or equal to {MAX_PROCESSES}"),
        ("hardware.nodes", str(MAX_NODES + 1), f"less than or equal to {MAX_NODES}"),
        ("training.steps", str(10**30), "less than or equal to"),
        ("hardware.memory_gb", ".inf", "finite number"),
        ("training.lr", ".nan", "finite number"),
        ("checkpoint.keep_last", str(2**70), "less than or equal to"),
    ],
)
def test_count_fields_have_upper_bounds_with_a_fix(key, value, words):
    section, field = key.split(".")
    issue = the_issue(spec_with({section: f"{field}: {value}"}), words)
    assert issue.path == key and issue.line is not None
    assert issue.fix or not words


@pytest.mark.parametrize(
    "hardware, path",
    [
        ('rendezvous_host: "a\\nb"', "rendezvous_host"),
        ('rendezvous_host: "$(touch x)"', "rendezvous_host"),
        ("hosts: ['../../..'], nodes: 1", "hosts[0]"),
        ("hosts: ['-oProxyCommand=x'], nodes: 1", "hosts[0]"),
        ("kubernetes: {image: Acme/Jobctl}", "kubernetes.image"),
        ('kubernetes: {image: "img:$(id)"}', "kubernetes.image"),
        ('kubernetes: {image: i, node_selector: {"a\\nb": x}}', "kubernetes.node_selector"),
        ('kubernetes: {image: i, node_selector: {k: "$(id)"}}', "kubernetes.node_selector"),
        ('kubernetes: {image: i, gpu_resource: "x$(id)"}', "kubernetes.gpu_resource"),
        # Leftover (d): the ssh backend's key file and remote Python were unchecked.
        ('ssh: {identity_file: "~/.ssh/id\\nrm -rf ~"}', "ssh.identity_file"),
        ('ssh: {identity_file: "  "}', "ssh.identity_file"),
        ('ssh: {known_hosts_file: "k\\x01"}', "ssh.known_hosts_file"),
        ('ssh: {python: "python3; rm -rf ~"}', "ssh.python"),
        ('ssh: {python: "python3 -X dev"}', "ssh.python"),
        ('ssh: {python: "-c"}', "ssh.python"),
        ('ssh: {python: "$(id)"}', "ssh.python"),
    ],
)
def test_names_handed_to_other_systems_are_validated(hardware, path):
    issues = issues_of(spec_with({"hardware": hardware}))
    found = [issue for issue in issues if issue.path == f"hardware.{path}"]
    assert found and found[0].line is not None and found[0].fix, [str(i) for i in issues]


@pytest.mark.parametrize(
    "hardware",
    [
        "rendezvous_host: gpu-a.example.com",
        "rendezvous_host: '10.0.0.5'",
        "rendezvous_host: '::1'",
        "backend: ssh, nodes: 2, hosts: [node_1, '127.0.0.1']",
        "kubernetes: {image: 'localhost:5000/acme/jobctl:0.1', node_selector: "
        "{cloud.google.com/gke-spot: 'true', gpu: ''}, gpu_resource: amd.com/gpu}",
        "kubernetes: {image: 'ghcr.io/acme/jobctl@sha256:" + "a" * 64 + "'}",
        "ssh: {python: python3.11, identity_file: ~/.ssh/id_ed25519}",
        "ssh: {python: /opt/venv-2/bin/python, known_hosts_file: /etc/ssh/known hosts}",
        "ssh: {python: ~/miniconda3/envs/train/bin/python}",
    ],
)
def test_real_names_still_pass(hardware):
    load_spec_text(spec_with({"hardware": hardware}), "job.yaml")


def test_a_missing_ssh_key_is_a_located_validate_error_with_a_fix(tmp_path: Path):
    """At `validate` (exit 2), not while the spec loads: the nodes load it too, and the
    key is only on this machine."""
    from typer.testing import CliRunner

    from jobctl.engine.cli.app import app

    key = tmp_path / "id_test"
    text = spec_with(
        {"hardware": f"backend: ssh, nodes: 1, hosts: [127.0.0.1], ssh: {{identity_file: '{key}'}}"}
    )
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert load_spec(path).hardware.ssh.identity_file == str(key)
    r = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    assert "hardware.ssh.identity_file" in r.output and "does not exist" in r.output
    assert f"{path}:4:" in r.output and "private key" in r.output
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    r = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output


def test_control_characters_are_placed_by_line_and_column():
    issue = the_issue(MINIMAL + "data:\n  seed: 1\x07\n", "control character #x07")
    assert (issue.line, issue.column) == (7, 10) and issue.fix


def test_bytes_that_are_not_utf8_are_placed_by_line_and_column(tmp_path: Path):
    path = tmp_path / "job.yaml"
    path.write_bytes(MINIMAL.encode() + b"# caf\xc3\xa9 \xff\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    [issue] = info.value.errors
    assert (issue.line, issue.column) == (6, 8)
    assert "0xff" in issue.message and "codec" not in issue.message and issue.fix


def test_a_relative_ssh_key_is_the_one_beside_the_spec(tmp_path: Path, monkeypatch):
    """A relative ``identity_file`` was checked against the current folder at
    `validate` and then handed as written to ssh, which start.sh runs from the run
    folder, where it was not; it resolves against the spec's folder now, as
    ``data.path`` does (``~`` stays for ssh to expand)."""
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    ssh = "ssh: {identity_file: keys/id, known_hosts_file: ~/.ssh/kh}"
    text = spec_with({"hardware": f"backend: ssh, nodes: 1, hosts: [127.0.0.1], {ssh}"})
    (tmp_path / "job.yaml").write_text(text)
    monkeypatch.chdir("/")
    got = load_spec(tmp_path / "job.yaml").hardware.ssh
    assert (got.identity_file, got.known_hosts_file) == (str(tmp_path / "keys/id"), "~/.ssh/kh")
