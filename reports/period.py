"""Report periods: a calendar month, a range of whole UTC hours, the period before one."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache

HOUR = timedelta(hours=1)


@lru_cache(maxsize=8192)  # a month's charges name its ~720 hours again and again: three a row
def utc_text(moment: datetime) -> str:
    """A moment as every report file writes it: UTC, to the second, ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ReportError(ValueError):
    pass


# --- periods ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Period:
    """A half-open UTC window [start, end). ``label`` names it in file names and titles."""

    start: datetime
    end: datetime
    label: str

    @property
    def is_month(self) -> bool:
        return bool(re.fullmatch(r"\d{4}-\d{2}", self.label))

    @property
    def hours(self) -> int:
        return int((self.end - self.start) / HOUR)

    def previous(self) -> Period:
        if self.is_month:
            year, month = self.start.year, self.start.month - 1
            if month == 0:
                year, month = year - 1, 12
            return month_period(f"{year:04d}-{month:02d}")
        length = self.end - self.start
        start = self.start - length
        return Period(start, self.start, f"{_day_label(start)}_{_day_label(self.start)}")

    def days(self) -> list[date]:
        day, out = self.start.date(), []
        while datetime.combine(day, datetime.min.time(), UTC) < self.end:
            out.append(day)
            day += timedelta(days=1)
        return out


def _day_label(moment: datetime) -> str:
    if moment.hour or moment.minute:
        return moment.strftime("%Y-%m-%dT%H%MZ")
    return moment.strftime("%Y-%m-%d")


# Years a report period may fall in: the ledger counts hours from the Unix epoch, and a month's end
# (the next month's first day) must still be a date Python can hold.
FIRST_YEAR, LAST_YEAR = 1970, 9998


def month_period(text: str) -> Period:
    match = re.fullmatch(r"(\d{4})-(\d{2})", text)
    if not match or not 1 <= int(match.group(2)) <= 12:
        raise ReportError(f"period: expected YYYY-MM (value {text!r})")
    year, month = int(match.group(1)), int(match.group(2))
    if not FIRST_YEAR <= year <= LAST_YEAR:
        raise ReportError(f"period: year out of range {FIRST_YEAR}..{LAST_YEAR} (value {text!r})")
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=UTC)
    return Period(start, end, text)


def range_period(start: datetime, end: datetime) -> Period:
    start, end = _utc_hour(start), _utc_hour(end)
    for flag, moment in (("--from", start), ("--to", end)):
        if not FIRST_YEAR <= moment.year <= LAST_YEAR:
            raise ReportError(
                f"period: {flag} year out of range {FIRST_YEAR}..{LAST_YEAR} (value {moment.isoformat()})"
            )
    if end <= start:
        raise ReportError(
            f"period: --to must be after --from (value {start.isoformat()} .. {end.isoformat()})"
        )
    return Period(start, end, f"{_day_label(start)}_{_day_label(end)}")


def last_month(now: datetime) -> Period:
    first = now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    previous = first - timedelta(days=1)
    return month_period(f"{previous.year:04d}-{previous.month:02d}")


def _utc_hour(moment: datetime) -> datetime:
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return moment.replace(minute=0, second=0, microsecond=0)
