"""Spec section for when a job is (re)started from its latest checkpoint: cron or interval."""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterator
from datetime import datetime

from apscheduler.triggers.cron import CronTrigger
from pydantic import Field, field_validator

from .base import SpecModel, Violation, friendly_error
from .errors import closest

CRON_FIELDS = ("minute", "hour", "day of month", "month", "day of week")


class ScheduleSpec(SpecModel):
    """Resume the job on a cron rule or every `interval_s` seconds, within a time window."""

    cron: str | None = Field(
        None, description="5-field cron expression (minute hour day month weekday)."
    )
    interval_s: float | None = Field(None, gt=0.0, description="Seconds between (re)starts.")
    timezone: str = Field("UTC", description="IANA time zone of the rule, e.g. Europe/Berlin.")
    start: datetime | None = Field(None, description="No (re)start before this time.")
    end: datetime | None = Field(None, description="No (re)start after this time.")

    @field_validator("cron")
    @classmethod
    def _cron_parses(cls, value: str | None) -> str | None:
        if value is None:
            return value
        fields = value.split()
        if len(fields) != len(CRON_FIELDS):
            raise friendly_error(
                "cron_fields",
                f"cron needs {len(CRON_FIELDS)} fields, got {len(fields)} in {value!r}",
                fix="write it as '" + " ".join(f"<{name}>" for name in CRON_FIELDS) + "', "
                "e.g. '0 */6 * * *' for every six hours",
            )
        try:
            CronTrigger.from_crontab(value, timezone="UTC")
        except ValueError as err:
            raise friendly_error(
                "cron_syntax", f"invalid cron expression {value!r}: {err}"
            ) from err
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone_exists(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as err:
            raise friendly_error(
                "timezone",
                f"unknown time zone {value!r}",
                suggestion=closest(value, zoneinfo.available_timezones()),
                fix="use an IANA name such as 'UTC' or 'Europe/Berlin'",
            ) from err
        return value

    def _violations(self) -> Iterator[Violation]:
        if (self.cron is None) == (self.interval_s is None):
            given = "both" if self.cron is not None else "neither"
            yield Violation(
                "cron",
                f"a schedule needs exactly one of `cron` and `interval_s`, {given} given",
                "keep one of schedule.cron / schedule.interval_s",
            )
        if self.start is not None and self.end is not None and _ends_first(self.start, self.end):
            yield Violation(
                "end",
                f"the window ends ({self.end}) before it starts ({self.start})",
                "make schedule.end later than schedule.start",
            )


def _ends_first(start: datetime, end: datetime) -> bool:
    """Whether ``end`` is not after ``start``; a naive and an aware time compare as wall-clock."""
    if (start.tzinfo is None) != (end.tzinfo is None):
        return end.replace(tzinfo=None) <= start.replace(tzinfo=None)
    return end <= start
