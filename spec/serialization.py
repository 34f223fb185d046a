"""A loaded spec as text: its identity hash, its JSON schema and YAML that loads back."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from .job import JobSpec


def spec_hash(spec: JobSpec) -> str:
    """First 16 hex digits of the sha256 of the spec's canonical JSON (sorted keys)."""
    canonical = json.dumps(
        spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=True
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def json_schema() -> dict[str, Any]:
    """The JSON schema of a job spec file (YAML keys, so ``import`` not ``import_``)."""
    return JobSpec.model_json_schema(by_alias=True)


def dump_yaml(spec: JobSpec) -> str:
    """The full spec, every default written out, as YAML that ``load_spec_text`` accepts."""
    return yaml.safe_dump(
        spec.model_dump(mode="json", by_alias=True), sort_keys=False, allow_unicode=True
    )
