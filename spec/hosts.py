"""Names the spec hands to other systems: host names, Kubernetes label keys and values,
container image references, extended resource names, and the ssh backend's key files
and remote Python.

These values are quoted wherever they reach a shell script or a manifest, so a stray
newline or ``$(...)`` would be inert there; they are still checked here, at `validate`,
because such a value can only be a mistake and would fail much later, on a cluster.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from .base import SpecModel, Violation, friendly_error, require_match

HOST_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
HOST_NAME = rf"^{HOST_LABEL}(\.{HOST_LABEL})*\.?$"
# A Kubernetes qualified name: an optional DNS-subdomain prefix and '/', then a name.
LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{LABEL_NAME}$"
LABEL_VALUE = rf"^({LABEL_NAME})?$"
# A container image reference: [registry[:port]/]path[:tag][@digest] (the distribution
# spec's grammar, lowercase path components).
_COMPONENT = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*"
_REGISTRY = r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?/"
IMAGE_REF = (
    rf"^({_REGISTRY})?{_COMPONENT}(/{_COMPONENT})*(:[\w][\w.-]{{0,127}})?"
    r"(@sha256:[a-f0-9]{64})?$"
)


def require_host(value: str) -> str:
    """``value`` if it is a host name or an IP address, else a ``host_name`` error."""
    if _is_ip(value) or (len(value) <= 253 and re.fullmatch(HOST_NAME, value)):
        return value
    raise friendly_error(
        "host_name",
        f"{value!r} is not a host name or IP address",
        fix="write a name such as gpu-a.example.com or an address such as 10.0.0.5",
    )


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    return True


def require_labels(labels: dict[str, str]) -> dict[str, str]:
    """``labels`` if every key and value is a valid Kubernetes label key and value."""
    for key, value in labels.items():
        require_match(
            key,
            LABEL_KEY,
            "label_key",
            f"{key!r} is not a Kubernetes label key",
            fix="write it as 'name' or 'prefix.example.com/name' (letters, digits, '-', '_', "
            "'.'; a name of at most 63 characters)",
        )
        require_match(
            value,
            LABEL_VALUE,
            "label_value",
            f"{value!r} (label {key!r}) is not a Kubernetes label value",
            fix="at most 63 letters, digits, '-', '_' or '.', starting and ending with a "
            "letter or digit",
        )
    return labels


def require_image(value: str) -> str:
    """``value`` if it is a container image reference, else an ``image_reference`` error."""
    return require_match(
        value,
        IMAGE_REF,
        "image_reference",
        f"{value!r} is not a container image reference",
        fix="write it as [registry/]path[:tag][@sha256:digest], e.g. 'ghcr.io/acme/jobctl:0.1'",
    )


def require_resource(value: str) -> str:
    """``value`` if it is an extended resource name such as ``nvidia.com/gpu``."""
    return require_match(
        value,
        LABEL_KEY,
        "resource_name",
        f"{value!r} is not an extended resource name",
        fix="write it as 'vendor-domain/resource', e.g. 'nvidia.com/gpu' or 'amd.com/gpu'",
    )


def is_loopback(host: str) -> bool:
    """True for names and addresses that reach only the machine using them: localhost,
    127.x, ::1 (and 0.0.0.0, which no other machine can dial)."""
    name = host.strip().lower().rstrip(".")
    if name in ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"):
        return True
    try:
        ip = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return name.endswith(".localhost")
    return ip.is_loopback or ip.is_unspecified


def default_rendezvous_host(data: dict[str, Any]) -> str:
    """127.0.0.1 when every node runs on this machine, else this machine's host name (no
    DNS lookup while a spec loads; set hardware.rendezvous_host where nodes need another)."""
    backend, hosts = data.get("backend", "local"), data.get("hosts", [])
    if backend == "local" or (backend == "ssh" and all(map(is_loopback, hosts))):
        return "127.0.0.1"
    return socket.gethostname()


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# A program to run: a name found on PATH (python3.11) or a path to one, one word.
EXECUTABLE = r"^[A-Za-z0-9_.~+/@%:,=][A-Za-z0-9_.~+/@%:,=-]*$"


def require_path(value: str) -> str:
    """``value`` if it can name a file: not blank, no control character (a newline there
    could only be a paste gone wrong), else a ``file_path`` error."""
    if not value.strip() or _CONTROL.search(value):
        raise friendly_error(
            "file_path",
            f"{value!r} is not a file path (blank, or it holds a control character)",
            fix="write the path on one line, e.g. ~/.ssh/id_ed25519",
        )
    return value


def require_executable(value: str) -> str:
    """``value`` if it is one program name or path, else an ``executable`` error."""
    return require_match(
        value,
        EXECUTABLE,
        "executable",
        f"{value!r} is not a program name or path (one word: no spaces, options or "
        "control characters)",
        fix="write a name on the hosts' PATH such as python3, or a path such as "
        "/opt/venv/bin/python",
    )


def ssh_violations(ssh: SshSpec, backend: str) -> list[Violation]:
    """What this machine shows wrong with the ssh settings, checked at ``validate`` (not
    while the spec loads: the nodes load it too, and the key lives only here): an
    identity file that is missing or not a readable file."""
    path = ssh.identity_file
    if backend != "ssh" or path is None:
        return []
    found = os.path.expanduser(path)
    if os.path.isfile(found) and os.access(found, os.R_OK):
        return []
    why = "is not a readable file" if os.path.exists(found) else "does not exist"
    return [
        Violation(
            "hardware.ssh.identity_file",
            f"{path} {why} on this machine",
            "point it at your private key (ssh -i's file), or remove it to use "
            "ssh's own configuration",
        )
    ]


HostName = Annotated[str, AfterValidator(require_host)]
Labels = Annotated[dict[str, str], AfterValidator(require_labels)]
ImageRef = Annotated[str, AfterValidator(require_image)]
ResourceName = Annotated[str, AfterValidator(require_resource)]
FilePath = Annotated[str, AfterValidator(require_path)]
Executable = Annotated[str, AfterValidator(require_executable)]


class SshSpec(SpecModel):
    """How the ssh backend reaches hardware.hosts."""

    user: str | None = Field(
        None, pattern=r"^[A-Za-z0-9._][A-Za-z0-9._-]*$", description="Login; null = ssh's."
    )
    port: int = Field(22, ge=1, le=65535, description="sshd port on every host.")
    identity_file: FilePath | None = Field(
        None, description="Private key file on this machine; null = ssh's."
    )
    known_hosts_file: FilePath | None = Field(
        None, description="Known-hosts file; null = ~/.ssh/known_hosts."
    )
    strict_host_key_checking: Literal["yes", "accept-new"] = Field(
        "accept-new", description="'yes' refuses unknown hosts; 'accept-new' records them."
    )
    connect_timeout_s: int = Field(
        10, ge=1, le=3600, description="Seconds to wait for a connection."
    )
    python: Executable | None = Field(
        None, description="Python on the hosts; null = the same path as the supervisor's."
    )
