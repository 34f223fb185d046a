"""Every package of the source tree is in the wheel: ``pyproject.toml`` lists the
packages by hand (the import names map onto spec/, engine/, backends/, templates/),
and a subpackage left out is missing from a non-editable install, where its first
import fails (jobctl.engine.averaging, model.graph and mobius once were)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _config() -> tuple[set[str], dict[str, str]]:
    """[tool.setuptools]'s packages and package-dir (read as text: tomllib is 3.11+)."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = re.search(r"^packages = \[(.*?)\]", text, re.M | re.S).group(1)
    table = re.search(r"^\[tool\.setuptools\.package-dir\]\n(.*?)(?:\n\[|\Z)", text, re.M | re.S)
    dirs = dict(re.findall(r'^"([\w.]+)" = "([\w/]+)"', table.group(1), re.M))
    return set(re.findall(r'"([\w.]+)"', listed)), dirs


def test_every_folder_with_an_init_is_a_listed_package():
    listed, dirs = _config()
    assert dirs["jobctl.engine"] == "engine"
    found = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - found == set(), "these listed packages have no folder"
