"""Shared base of every spec model and the protocol by which rules report violations.

A rule that involves more than one field cannot be pinned on a single input value by
pydantic, so it reports a :class:`Violation` naming the dotted path (relative to the
model that owns the rule) it is about. All violations of one model are raised together
as one ``spec_rule`` error whose context carries them; the loader expands that error
back into one issue per violation, each at the YAML position of its path. Plain Python
users still get a readable :class:`pydantic.ValidationError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_validator,
)
from pydantic_core import PydanticCustomError
from typing_extensions import Self

RULE_ERROR_TYPE = "spec_rule"


class Violation(NamedTuple):
    """One broken rule: the dotted path it is about, what is wrong, and how to fix it."""

    path: str
    message: str
    fix: str | None = None


def rule_error(violations: list[Violation]) -> PydanticCustomError:
    """Bundle ``violations`` into one pydantic error the loader can take apart again."""
    summary = "; ".join(f"{v.path}: {v.message}" for v in violations)
    # Braces would be read as template fields by pydantic; the summary has no context keys.
    summary = summary.replace("{", "(").replace("}", ")")
    payload = tuple(v._asdict() for v in violations)
    return PydanticCustomError(RULE_ERROR_TYPE, summary, {"violations": payload})


def friendly_error(
    error_type: str, message: str, *, suggestion: str | None = None, fix: str | None = None
) -> PydanticCustomError:
    """A single-value error whose context carries an optional suggestion and fix hint."""
    context: dict[str, Any] = {}
    if suggestion is not None:
        context["suggestion"] = suggestion
    if fix is not None:
        context["fix"] = fix
    return PydanticCustomError(error_type, message.replace("{", "(").replace("}", ")"), context)


def require_match(
    value: str,
    pattern: str,
    error_type: str,
    message: str,
    *,
    suggestion: str | None = None,
    fix: str | None = None,
) -> str:
    """``value`` if ``pattern`` matches all of it, else a ``friendly_error``."""
    if not re.fullmatch(pattern, value):
        raise friendly_error(error_type, message, suggestion=suggestion, fix=fix)
    return value


def one_error(error_type: str, expected: str, fix: str | None = None):
    """A wrap validator for a union field (``int | "auto"`` and the like) that reports
    one clear error, ``expected {expected}, got {value!r}``, instead of one per branch."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as err:
            message = f"expected {expected}, got {value!r}"
            raise friendly_error(error_type, message, fix=fix) from err

    return validate


#: Validate ``int >= 1 | "auto"``.
int_or_auto = one_error("int_or_auto", "an integer >= 1 or 'auto'")


class SpecModel(BaseModel):
    """Base of every spec section: immutable, strict about keys, aliases accepted."""

    # allow_inf_nan: `.inf` passes `gt=0` and `.nan` passes every bound.
    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False
    )

    def _violations(self) -> Iterator[Violation]:
        """Yield every cross-field rule this model breaks; sections override it."""
        return iter(())

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        violations = list(self._violations())
        if violations:
            raise rule_error(violations)
        return self
