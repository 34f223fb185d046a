"""Where the nodes meet the supervisor: the spec's default rendezvous host, and the
backends' refusal of a loopback address that nodes on other machines would dial."""

from __future__ import annotations

import socket

import pytest

from jobctl.backends import BackendError, get_backend
from jobctl.spec.sections import HardwareSpec, is_loopback

from ..render_contexts import KUBE, context

REMOTE = ["gpu-a", "gpu-b"]


@pytest.mark.parametrize(
    ("hardware", "expected"),
    [
        ({}, "127.0.0.1"),  # local: every node is this machine
        ({"backend": "local", "hosts": REMOTE}, "127.0.0.1"),  # hosts are for ssh only
        ({"backend": "ssh", "hosts": ["localhost", "127.0.0.2"]}, "127.0.0.1"),
        ({"backend": "ssh", "hosts": ["localhost", "gpu-b"]}, "supervisor-7"),
        ({"backend": "slurm"}, "supervisor-7"),  # Slurm's nodes: other machines
        ({"backend": "kubernetes", "kubernetes": KUBE}, "supervisor-7"),
        ({"backend": "slurm", "rendezvous_host": "10.0.0.5"}, "10.0.0.5"),
    ],
)
def test_the_rendezvous_defaults_to_this_machine_where_nodes_are_remote(
    hardware, expected, monkeypatch
):
    monkeypatch.setattr(socket, "gethostname", lambda: "supervisor-7")
    spec = HardwareSpec(**{"nodes": 2, **hardware})
    assert spec.rendezvous_host == expected
    # A chosen address is told apart from a default one (it is never re-derived).
    assert ("rendezvous_host" in spec.model_fields_set) == ("rendezvous_host" in hardware)


def test_loopback_names_and_addresses():
    for host in (
        "localhost",
        "LOCALHOST.",
        "127.0.0.1",
        "127.1.2.3",
        "::1",
        "[::1]",
        "0.0.0.0",
        "app.localhost",
        "ip6-localhost",
    ):
        assert is_loopback(host), host
    for host in ("gpu-a", "10.0.0.5", "supervisor.example.com", "::ffff:10.0.0.5"):
        assert not is_loopback(host), host


def _ssh(hardware: dict, endpoint: str = "127.0.0.1:29400"):
    return context("ssh", {"hosts": REMOTE, **hardware}, rdzv_endpoint=endpoint)


def test_ssh_refuses_a_chosen_loopback_rendezvous_for_remote_hosts(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "supervisor-7")
    chosen = _ssh({"rendezvous_host": "127.0.0.1"})
    with pytest.raises(BackendError) as info:
        get_backend("ssh").render(chosen)
    assert str(info.value) == (
        "the remote host(s) gpu-a, gpu-b cannot reach the rendezvous at 127.0.0.1 "
        "(hardware.rendezvous_host sets it): set hardware.rendezvous_host to an address "
        "of this machine that they reach (its host name is 'supervisor-7')"
    )
    # Loopback hosts reach a loopback rendezvous; a reachable address is kept as it is.
    get_backend("ssh").render(_ssh({"hosts": ["127.0.0.1", "localhost"]}))
    files = get_backend("ssh").render(_ssh({}, "supervisor-7:29400")).files
    assert "  --rdzv-endpoint=supervisor-7:29400 \\\n" in files["node-1.sh"]


def test_a_default_for_another_backend_is_refused_with_both_fixes(monkeypatch):
    # `--backend ssh` on a spec whose hardware.backend is local: its default is loopback.
    monkeypatch.setattr(socket, "gethostname", lambda: "supervisor-7")
    local_default = context(
        "ssh", {"backend": "local", "hosts": REMOTE}, rdzv_endpoint="127.0.0.1:29400"
    )
    with pytest.raises(
        BackendError,
        match=(
            r"defaults to it for hardware.backend 'local'\): set hardware.rendezvous_host .*"
            r" or set hardware.backend: ssh \(the default is then this machine's name\)$"
        ),
    ):
        get_backend("ssh").render(local_default)


def test_a_loopback_host_name_is_no_default_for_remote_nodes(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")
    ctx = _ssh({}, "localhost:29400")  # hardware.rendezvous_host defaulted to "localhost"
    assert ctx.hardware.rendezvous_host == "localhost"
    with pytest.raises(BackendError, match="defaults to this machine's host name, 'localhost'"):
        get_backend("ssh").render(ctx)


def test_slurm_keeps_a_chosen_loopback_but_refuses_a_foreign_default():
    # A one-machine cluster may rendezvous on 127.0.0.1 when the spec says so.
    chosen = context("slurm", {"rendezvous_host": "127.0.0.1"}, rdzv_endpoint="127.0.0.1:1234")
    assert (
        "--rdzv-endpoint=127.0.0.1:1234" in get_backend("slurm").render(chosen).files["node-0.sh"]
    )
    foreign = context("slurm", {"backend": "local"}, rdzv_endpoint="127.0.0.1:1234")
    with pytest.raises(BackendError, match="Slurm's nodes cannot reach the rendezvous"):
        get_backend("slurm").render(foreign)


def test_kubernetes_refuses_any_loopback_rendezvous():
    for host in ("127.0.0.1", "localhost"):
        chosen = context(
            "kubernetes",
            {"kubernetes": KUBE, "rendezvous_host": host},
            rdzv_endpoint=f"{host}:29400",
        )
        with pytest.raises(BackendError, match=f"the pods cannot reach the rendezvous at {host}"):
            get_backend("kubernetes").render(chosen)


def test_render_picks_a_port_for_a_rendezvous_on_another_address(tmp_path):
    from typer.testing import CliRunner

    from jobctl.engine.cli.app import app
    from jobctl.spec import dump_yaml

    from ..jobrun import tiny_spec

    # 203.0.113.7 (TEST-NET-3) is never this machine's: a NAT address the nodes dial, or
    # a supervisor elsewhere. Nothing connects to it; rendering only writes the scripts.
    spec = tiny_spec(**{"hardware.backend": "slurm", "hardware.rendezvous_host": "203.0.113.7"})
    (tmp_path / "job.yaml").write_text(dump_yaml(spec))
    args = ["render", str(tmp_path / "job.yaml"), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    if result.exception:
        raise result.exception
    node0 = tmp_path / "out" / "run" / "scripts" / "node-0.sh"  # the layout of a run's folder
    assert "  --rdzv-endpoint=203.0.113.7:" in node0.read_text()
