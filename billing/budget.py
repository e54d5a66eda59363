"""Teams' month-to-date cost, the forecast to month end, and their budgets (docs/billing.md §4.4).

Everything is read from the ledger at the moment asked (the service's scrape), in UTC: the month is
the calendar month in UTC that holds ``now``, like the billing hours and the monthly reports. The
forecast is plain arithmetic a finance analyst can redo from the report's daily CSV:

    forecast = month-to-date + (cost of the last 7 whole UTC days / hours of them ingested)
                               × hours from the cutoff to the end of the month

where the cutoff is the end of the newest hour ingested (not before the 1st, 00:00 UTC).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

from gpumeter.billing.config import Budget
from gpumeter.billing.ledger.base import Ledger
from gpumeter.billing.models import HOUR

__all__ = ["FORECAST_WINDOW_DAYS", "TeamMonth", "month_bounds", "team_months"]

# Whole UTC days whose cost sets the forecast's rate: a week holds every weekday once and every hour
# of the day seven times, so neither a quiet weekend nor the night shift tilts it.
FORECAST_WINDOW_DAYS = 7


@dataclass(frozen=True)
class TeamMonth:
    """One team's month so far, in one currency."""

    team: str
    currency: str
    month_start: datetime
    month_end: datetime
    cutoff: datetime  # end of the newest hour ingested, within [month_start, month_end]
    month_to_date: Decimal  # the team's lines of the month ingested so far (sums of rounded lines)
    window_start: datetime
    window_end: datetime
    window_cost: Decimal
    window_hours: int  # hours of the window the ledger holds (successful ingest runs)
    budget: Budget | None

    @property
    def remaining_hours(self) -> int:
        return (self.month_end - self.cutoff) // HOUR

    @property
    def forecast(self) -> Fraction | None:
        """Exact; None when no hour of the window was ingested (no rate to project with)."""
        if self.window_hours == 0:
            return None
        rate = Fraction(self.window_cost) / self.window_hours
        return Fraction(self.month_to_date) + rate * self.remaining_hours


def month_bounds(moment: datetime) -> tuple[datetime, datetime]:
    """[1st 00:00 UTC, next 1st 00:00 UTC) of the month that holds ``moment``."""
    moment = moment.astimezone(UTC)
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end


def team_months(
    ledger: Ledger,
    budgets: Mapping[str, Budget],
    now: datetime,
    last_success: datetime | None,
    window_days: int = FORECAST_WINDOW_DAYS,
) -> list[TeamMonth]:
    """Every team with a budget or with cost this month or in the forecast window, sorted by team
    and currency. ``last_success``: the end of the newest hour ingested (the ledger's summary)."""
    start, end = month_bounds(now)
    cutoff = min(max(last_success or start, start), end)
    window_end = cutoff.replace(hour=0, minute=0, second=0, microsecond=0)
    window_start = window_end - timedelta(days=window_days)
    month = ledger.team_costs(start, end)
    window = ledger.team_costs(window_start, window_end)
    hours = len(ledger.ingested_hours(window_start, window_end))
    keys = set(month) | set(window) | {(b.team, b.currency) for b in budgets.values()}
    return [
        TeamMonth(
            team=team,
            currency=currency,
            month_start=start,
            month_end=end,
            cutoff=cutoff,
            month_to_date=month.get((team, currency), Decimal(0)),
            window_start=window_start,
            window_end=window_end,
            window_cost=window.get((team, currency), Decimal(0)),
            window_hours=hours,
            budget=budget if (budget := budgets.get(team)) and budget.currency == currency else None,
        )
        for team, currency in sorted(keys)
    ]
