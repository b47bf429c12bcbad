"""Times the user types (a backfill's input time, a migration's cutover), parsed for real.

One form everywhere: ``YYYY-MM-DD`` then ``T`` or a space, ``HH:MM[:SS[.fraction]]`` and an
optional zone (``Z`` or ``+HH:MM``); without a zone it is UTC (the project runs Spark in UTC).
:func:`parse_time` is the check (the CLI, the Spark jobs, the DAGs' first tasks);
:data:`TIME_PATTERN` is the same set of strings as a JSON-schema pattern for the trigger forms.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from stateops.core.errors import StateOpsError

__all__ = ["EXAMPLE", "TIME_PATTERN", "format_span", "parse_past_time", "parse_time"]

EXAMPLE = "2026-11-21T03:00:00Z"

# Airflow 3.3 validates a Param with jsonschema's FormatChecker, whose "date-time" check exists
# only when the optional rfc3339-validator package is installed (it is not in this project's
# pinned set: there, month 13 passes), and RFC 3339 also wants seconds and a zone, which the
# forms do not ask for. A pattern is checked everywhere (form and REST alike), so the pattern
# itself admits real dates only: days per month, and 29 February in leap years (every 4th
# year, but of the century years only those divisible by 400).
_LEAP_YEAR = r"(?:\d{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
_DATE = (
    r"(?!0000)(?:"
    r"\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|1\d|2[0-8])"  # every month has days 1-28
    r"|\d{4}-(?:0[13-9]|1[0-2])-(?:29|30)"  # all but February have 29 and 30
    r"|\d{4}-(?:0[13578]|1[02])-31"
    rf"|{_LEAP_YEAR}-02-29"
    r")"
)
_CLOCK = r"(?:[01]\d|2[0-3]):[0-5]\d(?::[0-5]\d(?:\.\d+)?)?"
_ZONE = r"(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)?"
TIME_PATTERN = rf"{_DATE}[T ]{_CLOCK}{_ZONE}$"
"""A form's time field, to put after ``^`` in a Param's ``pattern`` (it ends with ``$``)."""

# The shape alone, so that a string of the right shape but an impossible value (month 13)
# gets Python's reason ("month must be in 1..12") rather than "not a time"; then the form's
# own pattern, so that the CLI and the forms accept exactly the same strings.
_SHAPE = re.compile(rf"\d{{4}}-\d{{2}}-\d{{2}}[T ]\d{{2}}:\d{{2}}(?::\d{{2}}(?:\.\d+)?)?{_ZONE}")
_REAL = re.compile(TIME_PATTERN)


def parse_time(value: str, field: str = "time") -> datetime:
    """``value`` as an aware datetime (UTC without a zone); a one-line refusal naming
    ``field`` and the value otherwise."""
    text = value.strip() if isinstance(value, str) else ""
    if not _SHAPE.fullmatch(text):
        raise StateOpsError(f"{field} {value!r} is not a time; write it like {EXAMPLE}")
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as err:
        raise StateOpsError(
            f"{field} {value!r} is not a real time ({err}); write it like {EXAMPLE}"
        ) from None
    if not _REAL.match(text):  # what Python accepts and the forms would not (year 0 aside)
        raise StateOpsError(f"{field} {value!r} is not a real time; write it like {EXAMPLE}")
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def parse_past_time(value: str, field: str = "time") -> datetime:
    """:func:`parse_time`, refusing a time still to come (input before it may yet land)."""
    moment = parse_time(value, field)
    if moment > datetime.now(UTC):
        raise StateOpsError(
            f"the {field} {moment.isoformat()} is in the future: input modified before it may "
            "still land; try again once it has passed"
        )
    return moment


def format_span(delta: timedelta) -> str:
    """A span as a person reads it in a reason: seconds up to two minutes, minutes up to two
    hours, hours up to two days, else days (rounded down)."""
    seconds = int(delta.total_seconds())
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"
