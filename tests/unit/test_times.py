"""Times parsed for real: the parser refuses impossible dates and clocks in one line naming the
field, and the forms' pattern admits exactly the strings the parser accepts."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta

import pytest

from stateops.core.errors import StateOpsError
from stateops.core.times import TIME_PATTERN, parse_past_time, parse_time

pytestmark = pytest.mark.unit

FORM = re.compile("^" + TIME_PATTERN)  # as the DAGs put it in a Param's pattern


def _parses(text: str) -> bool:
    try:
        parse_time(text)
    except StateOpsError:
        return False
    return True


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("2026-13-01T00:00:00Z", "month must be in 1..12"),
        ("2026-00-10T00:00:00Z", "month must be in 1..12"),
        ("2026-02-30T03:00", "day is out of range for month"),
        ("2027-02-29T03:00:00Z", "day is out of range for month"),  # not a leap year
        ("2100-02-29T03:00:00Z", "day is out of range for month"),  # century, not by 400
        ("2026-04-31 03:00", "day is out of range for month"),
        ("2026-01-01T25:00:00Z", "hour must be in 0..23"),
        ("2026-01-01T24:00:00Z", "hour must be in 0..23"),
        ("2026-01-01T03:61:00Z", "minute must be in 0..59"),
        ("2026-01-01T03:00:61Z", "second must be in 0..59"),
    ],
)
def test_an_impossible_time_is_refused_naming_the_field_the_value_and_the_reason(text, reason):
    with pytest.raises(StateOpsError) as refused:
        parse_time(text, "cutover")
    message = str(refused.value)
    assert message.startswith(f"cutover {text!r} is not a real time")
    assert reason in message and "2026-11-21T03:00:00Z" in message and "\n" not in message
    assert not FORM.match(text), "the form's pattern must refuse it too"


@pytest.mark.parametrize(
    "text",
    [
        "yesterday",
        "",
        "2026-11-21",
        "21/11/2026 03:00",
        "2026-11-21T3:00",
        "20261121T030000",
        "2026-11-21T03:00+01:67",
        "2026-11-21T03:00:00ZZ",
        "2026-W47-6T03:00",
    ],
)
def test_a_string_of_another_shape_is_not_a_time(text):
    with pytest.raises(StateOpsError, match=r"^input_before .* is not a time; write it like"):
        parse_time(text, "input_before")
    assert not FORM.match(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-21T03:00:00Z", datetime(2026, 11, 21, 3, tzinfo=UTC)),
        ("2026-11-21 03:00", datetime(2026, 11, 21, 3, tzinfo=UTC)),  # no zone: UTC
        ("2026-11-21T04:00:00+01:00", datetime(2026, 11, 21, 3, tzinfo=UTC)),
        ("2028-02-29T00:00:00.250Z", datetime(2028, 2, 29, 0, 0, 0, 250000, tzinfo=UTC)),
        ("2000-02-29T23:59:59-00:30", datetime(2000, 3, 1, 0, 29, 59, tzinfo=UTC)),
    ],
)
def test_real_times_parse_and_match_the_form(text, expected):
    assert parse_time(text) == expected
    assert FORM.match(text)


def test_the_form_pattern_and_the_parser_agree_on_every_day_of_leap_and_century_years():
    """Every month 0..13 and day 0..32 of years that exercise each leap-year rule."""
    years = [1, 4, 100, 400, 1600, 1700, 1900, 1996, 1999, 2000, 2024, 2026, 2100, 2400, 9999]
    for year in years:
        for month in range(14):
            for day in range(33):
                text = f"{year:04d}-{month:02d}-{day:02d}T12:00"
                assert bool(FORM.match(text)) == _parses(text), text
    assert not FORM.match("0000-01-01T00:00") and not _parses("0000-01-01T00:00")


def test_the_form_pattern_and_the_parser_agree_on_random_strings_of_the_right_shape():
    rnd = random.Random(16)

    def field(width: int, top: int) -> str:
        return f"{rnd.randint(0, top):0{width}d}"

    for _ in range(20000):
        text = (
            f"{field(4, 9999)}-{field(2, 19)}-{field(2, 39)}{rnd.choice('T ')}"
            f"{field(2, 29)}:{field(2, 69)}"
            + rnd.choice(["", f":{field(2, 69)}", f":{field(2, 69)}.{field(3, 999)}"])
            + rnd.choice(["", "Z", f"+{field(2, 29)}:{field(2, 69)}", f"-{field(2, 25)}:00"])
        )
        assert bool(FORM.match(text)) == _parses(text), text


def test_a_past_time_refuses_the_future():
    soon = (datetime.now(UTC) + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    with pytest.raises(StateOpsError, match="the cutover .* is in the future"):
        parse_past_time(soon, "cutover")
    assert parse_past_time("2026-01-01T00:00:00Z", "cutover").year == 2026
