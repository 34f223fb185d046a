"""The spec's backend settings: hardware.slurm, hardware.kubernetes and hardware.ssh."""

from __future__ import annotations

import textwrap

import pytest

from jobctl.spec import SpecError, dump_yaml, load_spec_text
from jobctl.spec.sections import KubernetesSpec, SlurmSpec, SshSpec

BASE = """\
name: tiny
model: {}
training: {global_batch_size: 16, steps: 10}
"""


def load(hardware: str):
    return load_spec_text(BASE + textwrap.dedent(hardware), "job.yaml")


def issues(hardware: str) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        load(hardware)
    return [(i.path, i.message) for i in info.value.errors]


def test_defaults_keep_existing_specs_valid():
    hw = load("").hardware
    assert hw.slurm == SlurmSpec()
    assert hw.ssh == SshSpec()
    assert hw.kubernetes is None
    assert (hw.slurm.signal_before_s, hw.slurm.requeue, hw.ssh.port) == (120, None, 22)


def test_full_backend_sections_load_and_round_trip():
    spec = load(
        """\
        hardware:
          backend: slurm
          spot: true
          hosts: []
          slurm:
            partition: gpu,gpu-spot
            account: ml-team
            qos: low
            time_limit_minutes: 720
            signal_before_s: 300
            requeue: true
            sbatch_args: [--exclusive, --constraint=a100&ib]
          kubernetes:
            image: ghcr.io/acme/jobctl:0.1
            namespace: training
            kind: jobset
            secrets: [s3-credentials]
            node_selector: {gpu: a100}
            volume_claim: runs
          ssh: {user: alice, port: 2222, identity_file: ~/.ssh/id_ed25519}
        """
    )
    hw = spec.hardware
    assert hw.slurm.sbatch_args == ["--exclusive", "--constraint=a100&ib"]
    assert hw.kubernetes == KubernetesSpec(
        image="ghcr.io/acme/jobctl:0.1",
        namespace="training",
        kind="jobset",
        secrets=["s3-credentials"],
        node_selector={"gpu": "a100"},
        volume_claim="runs",
    )
    assert hw.ssh.user == "alice"
    assert load_spec_text(dump_yaml(spec), "again.yaml") == spec


@pytest.mark.parametrize(
    ("hardware", "path", "message"),
    [
        ("hardware: {slurm: {partition: 'gpu; rm -rf /'}}", "hardware.slurm.partition", "match"),
        (
            "hardware: {slurm: {sbatch_args: ['--wrap=a b']}}",
            "hardware.slurm.sbatch_args",
            "'--wrap=a b' is not an sbatch option",
        ),
        (
            "hardware: {slurm: {sbatch_args: ['-N2']}}",
            "hardware.slurm.sbatch_args",
            "'-N2' is not an sbatch option",
        ),
        (
            "hardware: {slurm: {time_limit_minutes: 0}}",
            "hardware.slurm.time_limit_minutes",
            "greater than or equal to 1",
        ),
        (
            "hardware: {slurm: {signal_before_s: 70000}}",
            "hardware.slurm.signal_before_s",
            "less than or equal to 65535",
        ),
        ("hardware: {kubernetes: {namespace: x}}", "hardware.kubernetes.image", "required"),
        (
            "hardware: {kubernetes: {image: i, namespace: Prod_1}}",
            "hardware.kubernetes.namespace",
            "match",
        ),
        (
            "hardware: {kubernetes: {image: i, secrets: ['My Secret']}}",
            "hardware.kubernetes.secrets[0]",
            "match",
        ),
        (
            "hardware: {kubernetes: {image: i, kind: mpijob}}",
            "hardware.kubernetes.kind",
            "'pytorchjob', 'jobset' or 'trainjob'",
        ),
        ("hardware: {ssh: {port: 0}}", "hardware.ssh.port", "greater than or equal to 1"),
        ("hardware: {ssh: {user: '-oProxyCommand=x'}}", "hardware.ssh.user", "match"),
        (
            "hardware: {ssh: {strict_host_key_checking: 'no'}}",
            "hardware.ssh.strict_host_key_checking",
            "'yes' or 'accept-new'",
        ),
    ],
)
def test_bad_backend_settings_name_their_path(hardware, path, message):
    found = issues(hardware)
    assert [p for p, _ in found] == [path], found
    assert message in found[0][1]


def test_misspelt_backend_setting_suggests_the_field():
    with pytest.raises(SpecError) as info:
        load("hardware: {slurm: {partiton: gpu}}")
    issue = info.value.errors[0]
    assert (issue.path, issue.suggestion) == ("hardware.slurm.partiton", "partition")
