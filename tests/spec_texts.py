"""The smallest valid job spec as YAML text, and loading spec text as a file would be."""

from __future__ import annotations

import textwrap

import pytest

from jobctl.spec import JobSpec, SpecError, load_spec_text

MINIMAL = """\
name: tiny
model: {}
training:
  global_batch_size: 16
  steps: 10
"""


def load(text: str, **kwargs: object) -> JobSpec:
    return load_spec_text(textwrap.dedent(text), "job.yaml", **kwargs)  # type: ignore[arg-type]


def spec_error(text: str, path: str) -> str:
    """The message of the SpecError that ``text``, loaded as the file ``path``, raises
    (the test fails if it raises none)."""
    with pytest.raises(SpecError) as info:
        load_spec_text(text, path)
    return str(info.value)
