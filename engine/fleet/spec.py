"""The fleet file: a job spec template plus the parameter sets that make its members.

.. code-block:: yaml

    name: sweep                       # the fleet: `jobctl fleet status sweep`
    base: quickstart.yaml             # or `template: |` with the spec inline
    member_name: "sweep-{{ lr }}-{{ layers }}"
    params: {lr: 0.01, layers: 4}     # every member's defaults; the base renders with these
    matrix: {lr: [0.01, 0.003], layers: [2, 4]}   # cartesian product
    zip: {seed: [0, 1], steps: [20, 40]}          # read in step, crossed with the matrix
    runs: [{lr: 0.1, layers: 2}]                   # explicit members, appended
    set: {training.lr: "{{ lr }}"}                 # dotted overrides for every member
    max_concurrent: 2

The base is a jinja2 template (``StrictUndefined``) over the job spec's YAML text; each
parameter set, plus ``fleet`` and ``index``, renders one member spec.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import Field, ValidationError, field_validator

from jobctl.spec import SpecIssue
from jobctl.spec.base import RULE_ERROR_TYPE, SpecModel, Violation
from jobctl.spec.errors import closest, dotted
from jobctl.spec.job import require_name
from jobctl.spec.source import Source

RESERVED = ("fleet", "index")


class FleetSpec(SpecModel):
    """A fleet of runs of one templated job spec, sharing one device pool."""

    name: str = Field(
        ..., description="Fleet name (job-name rules); `jobctl fleet status NAME` uses it."
    )
    base: str | None = Field(
        None, description="Job spec template file, relative to the fleet file (jinja2 over YAML)."
    )
    template: str | None = Field(
        None, description="The job spec template inline, as a YAML literal block (`template: |`)."
    )
    member_name: str = Field(
        "{{ fleet }}-{{ index }}",
        description="jinja2 pattern of each member's job name, e.g. 'sweep-{{ lr }}'; "
        "sanitised to job-name rules.",
    )
    params: dict[str, Any] = Field(
        default={}, description="Parameters of every member; the base spec renders with these."
    )
    matrix: dict[str, list[Any]] = Field(
        default={}, description="Parameter lists whose every combination is a member."
    )
    zip_: dict[str, list[Any]] = Field(
        default={},
        alias="zip",
        description="Equal-length lists read in step (the i-th values form one parameter "
        "set), crossed with `matrix`.",
    )
    runs: list[dict[str, Any]] = Field(
        default=[], description="Explicit members, one mapping of parameters each."
    )
    set_: dict[str, Any] = Field(
        default={},
        alias="set",
        description="Dotted job-spec overrides for every member, e.g. training.lr: "
        "'{{ lr }}'; strings are jinja2 templates, read as YAML once rendered.",
    )
    pool_devices: int | None = Field(
        None, ge=1, description="Devices the members share; default: the base spec's pool."
    )
    max_concurrent: int | None = Field(
        None, ge=1, description="Members running at once at most; default: what fits the pool."
    )
    max_total_usd: float | None = Field(
        None,
        gt=0.0,
        description="USD the whole fleet may cost (the members' predicted dollars to "
        "finish, summed): `fleet plan` and `fleet apply` refuse a fleet predicted above it.",
    )

    @field_validator("name")
    @classmethod
    def _name_is_safe(cls, value: str) -> str:
        return require_name(
            value,
            "fleet",
            fix="use lowercase letters, digits, '.', '_' and '-' (at most 63 characters)",
        )

    def _violations(self) -> Iterator[Violation]:
        if (self.base is None) == (self.template is None):
            given = "both" if self.base is not None else "neither"
            yield Violation("base", f"a fleet needs exactly one of `base` and `template`, {given}")
        if not (self.matrix or self.zip_ or self.runs):
            yield Violation("matrix", "no members: give `matrix`, `zip` or `runs`")
        lengths = {key: len(values) for key, values in self.zip_.items()}
        if len(set(lengths.values())) > 1:
            shown = ", ".join(f"{k}: {n}" for k, n in lengths.items())
            yield Violation("zip", f"zip lists must have one length, got {shown}")
        for key, values in self.matrix.items():
            if not values:
                yield Violation(f"matrix.{key}", "an empty list makes no members")
        for key in sorted(set(self.matrix) & set(self.zip_)):
            yield Violation(f"zip.{key}", f"'{key}' is in both `matrix` and `zip`")
        yield from _name_violations(self)


def _name_violations(spec: FleetSpec) -> Iterator[Violation]:
    sections = {"params": spec.params, "matrix": spec.matrix, "zip": spec.zip_}
    sections.update({f"runs.{i}": run for i, run in enumerate(spec.runs)})
    for section, values in sections.items():
        for key in values:
            if key in RESERVED:
                yield Violation(f"{section}.{key}", f"'{key}' is set by the fleet itself")
            elif not key.isidentifier():
                yield Violation(f"{section}.{key}", f"'{key}' is not a template variable name")


def fleet_issues(err: ValidationError, source: Source) -> list[SpecIssue]:
    """Positioned issues from a fleet file's validation error (cf. job specs)."""
    issues = []
    for error in err.errors():
        path = tuple(error["loc"])
        if error["type"] == RULE_ERROR_TYPE:
            for v in error["ctx"]["violations"]:
                where = (*path, *(int(p) if p.isdigit() else p for p in v["path"].split(".")))
                issues.append(_issue(source, where, v["message"], fix=v["fix"]))
        elif error["type"] == "extra_forbidden":
            near = closest(str(path[-1]), _keys()) if len(path) == 1 else None
            issues.append(_issue(source, path, f"unknown key '{path[-1]}'", near))
        elif error["type"] == "missing":
            issues.append(_issue(source, path, f"missing required key '{path[-1]}'"))
        else:
            ctx, shown = error.get("ctx", {}), repr(error["input"])
            msg = error["msg"] if shown in error["msg"] else f"{error['msg']}, got {shown}"
            suggestion, fix = ctx.get("suggestion"), ctx.get("fix")
            issues.append(_issue(source, path, msg, suggestion, fix, at_value=True))
    return issues


def _keys() -> list[str]:
    return [info.alias or name for name, info in FleetSpec.model_fields.items()]


def _issue(
    source: Source,
    path: tuple,
    message: str,
    suggestion: str | None = None,
    fix: str | None = None,
    at_value: bool = False,
) -> SpecIssue:
    """An issue at ``path`` (its key, or its value), else at its nearest ancestor's key."""
    target = path
    while target and target not in source.positions:
        target = target[:-1]
    if not target:
        line, column = source.positions[()].value
    else:
        pos = source.positions[target]
        line, column = pos.value if at_value and target == path else pos.key
    return SpecIssue(source.filename, line, column, dotted(path), message, suggestion, fix)
