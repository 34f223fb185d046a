"""Spec sections for money: ``budget`` (caps in USD) and ``planner`` (what a plan optimises).

Prices live with the pool (``hardware.price_per_hour``, ``spot_price_per_hour``,
``preemptions_per_hour``); these sections say how much the whole job may cost, and
whether the planner picks the fastest plan, the cheapest, or the cheapest that
finishes before a deadline. ``cost_violations`` holds the rules that tie them to the
pool (checked by ``JobSpec``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from .base import SpecModel, Violation, friendly_error

if TYPE_CHECKING:
    from .sections import HardwareSpec

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_PART = r"(\d+(?:\.\d+)?)\s*([smhd])"
DURATION_FIX = "write a duration such as 36h, 90m, 1h30m, 2d, or a number of seconds"


def parse_duration(value: Any) -> Any:
    """Seconds from ``36h``, ``90m``, ``1h30m``, ``2d``, ``45s`` or a plain number."""
    if isinstance(value, bool):
        raise friendly_error("duration", f"{value!r} is not a duration", fix=DURATION_FIX)
    if isinstance(value, int | float):
        return value
    text = str(value).strip().lower()
    if re.fullmatch(rf"(?:{DURATION_PART}\s*)+", text):
        return sum(float(n) * UNITS[u] for n, u in re.findall(DURATION_PART, text))
    try:
        return float(text)
    except ValueError:
        raise friendly_error("duration", f"{value!r} is not a duration", fix=DURATION_FIX) from None


Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0.0)]


class BudgetSpec(SpecModel):
    """What the job may cost: the plan refuses to exceed it, the run stops or shrinks at it."""

    max_total_usd: float | None = Field(
        None,
        gt=0.0,
        description="USD the whole job may cost: `plan` refuses a plan predicted above it "
        "(printing the cheapest that fits); a run reaching it checkpoints and stops.",
    )
    max_hourly_usd: float | None = Field(
        None,
        gt=0.0,
        description="USD per hour the pool may cost: `plan` refuses a layout above it; a "
        "run above it morphs onto fewer devices.",
    )

    @property
    def capped(self) -> bool:
        return self.max_total_usd is not None or self.max_hourly_usd is not None


class PlannerSpec(SpecModel):
    """What the planner optimises among the layouts it simulates."""

    objective: Literal["throughput", "cost", "deadline"] = Field(
        "throughput",
        description="throughput: the fastest plan within the budget; cost: the cheapest "
        "(within the deadline when one is given); deadline: the cheapest that finishes "
        "before `deadline`.",
    )
    deadline: Duration | None = Field(
        None,
        description="Wall time the whole job (start-up, steps, checkpoints, expected "
        "preemptions) must finish within, e.g. 36h, 90m, 2d; objectives cost and deadline.",
    )

    def _violations(self) -> Iterator[Violation]:
        if self.objective == "deadline" and self.deadline is None:
            yield Violation(
                "deadline",
                "objective 'deadline' needs a deadline",
                "set planner.deadline, e.g. 36h, or planner.objective: cost",
            )
        if self.objective == "throughput" and self.deadline is not None:
            yield Violation(
                "deadline",
                "a deadline is only used by objectives 'deadline' and 'cost'",
                "set planner.objective: deadline, or remove planner.deadline",
            )


def run_price(hw: HardwareSpec) -> float:
    """USD per device-hour the run pays: the spot price on spot capacity when given."""
    if hw.spot and hw.spot_price_per_hour is not None:
        return hw.spot_price_per_hour
    return hw.price_per_hour


def cost_violations(hw: HardwareSpec, budget: BudgetSpec) -> Iterator[Violation]:
    """The rules tying the budget and the preemption rate to the pool's prices."""
    price = run_price(hw)
    if budget.capped and price == 0:
        which = (
            "spot_price_per_hour"
            if hw.spot and hw.spot_price_per_hour is not None
            else "price_per_hour"
        )
        yield Violation(
            f"hardware.{which}",
            "a budget is set but the pool's price is 0, so every plan costs $0",
            f"set hardware.{which} (USD per device-hour) or remove the budget section",
        )
    if budget.max_hourly_usd is not None and 0 < budget.max_hourly_usd < price:
        yield Violation(
            "budget.max_hourly_usd",
            f"max_hourly_usd {budget.max_hourly_usd:g} is below one device's price "
            f"({price:g} USD/h): no plan fits",
            f"raise budget.max_hourly_usd to at least {price:g}",
        )
    if hw.preemptions_per_hour > 0 and not hw.spot and hw.spot_price_per_hour is None:
        yield Violation(
            "hardware.preemptions_per_hour",
            "a preemption rate is given for on-demand capacity",
            "set hardware.spot: true (or hardware.spot_price_per_hour), or remove it",
        )
