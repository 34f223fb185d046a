"""The smallest valid job spec as YAML text, and loading spec text as a file would be."""

from __future__ import annotations

import textwrap

from jobctl.spec import JobSpec, load_spec_text

MINIMAL = """\
name: tiny
model: {}
training:
  global_batch_size: 16
  steps: 10
"""


def load(text: str, **kwargs: object) -> JobSpec:
    return load_spec_text(textwrap.dedent(text), "job.yaml", **kwargs)  # type: ignore[arg-type]
