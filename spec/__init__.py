"""jobctl.spec: the job spec models, and loading them from YAML with friendly errors."""

from .data import DataSpec
from .errors import SpecError, SpecIssue
from .job import JobSpec
from .loader import load_spec, load_spec_text
from .phases import CheckpointSpec, ElasticitySpec, PruningSpec, RebalancingSpec
from .schedule import ScheduleSpec
from .sections import (
    HardwareSpec,
    InterconnectSpec,
    ModelSpec,
    ParallelismSpec,
    TrainingSpec,
)
from .serialization import dump_yaml, json_schema, spec_hash

__all__ = [
    "CheckpointSpec",
    "DataSpec",
    "ElasticitySpec",
    "HardwareSpec",
    "InterconnectSpec",
    "JobSpec",
    "ModelSpec",
    "ParallelismSpec",
    "PruningSpec",
    "RebalancingSpec",
    "ScheduleSpec",
    "SpecError",
    "SpecIssue",
    "TrainingSpec",
    "dump_yaml",
    "json_schema",
    "load_spec",
    "load_spec_text",
    "spec_hash",
]
