"""Month arithmetic on ``datetime.date`` values."""
import calendar
from datetime import date


def add_months(d, months):
    """Return *d* shifted by *months* calendar months (may be negative).

    The day of the month is kept where possible and otherwise clamped to the
    last day of the target month: Jan 31 + 1 month is Feb 28 (or 29).
    """
    month_index = d.month + months
    year = d.year + month_index // 12
    month = month_index % 12
    day = min(d.day, calendar.monthrange(year, month)[1])
    return d.replace(year=year, month=month, day=day)


def end_of_month(d):
    """Return the last day of the month that contains *d*."""
    return date(d.year, d.month, calendar.monthrange(d.year, d.month)[1])


def months_between(start, end):
    """Number of whole months from *start* to *end* (negative if end < start)."""
    months = (end.year - start.year) * 12 + (end.month - start.month)
    if months > 0 and end.day < start.day:
        months -= 1
    elif months < 0 and end.day > start.day:
        months += 1
    return months


def quarter_of(d):
    """Return the calendar quarter (1-4) of *d*."""
    return (d.month - 1) // 3 + 1
