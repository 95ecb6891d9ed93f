"""The calendar days a question names: "what happened on December 1?", "notes from
2026-12-01", "the 3rd of March 2025", "what did Priya say yesterday?".

A document dated one of them (``occurred_at``: front matter ``date``, a daily note's
file name, a conversation's session) is a subject the question names, as a document
whose title it names is (``statement`` joins both as the title lane's subjects).

Only whole days are read: a month or a year alone ("in March", "2025") names too
much to be a subject. A day written without its year is its last occurrence up to
today, and its next one as well when that is at most ``AHEAD_DAYS`` ahead: asked on
2026-12-05, "December 1" is 2026-12-01, "May 5" 2026-05-05, and "January 22" both
2026-01-22 and 2027-01-22 (the offsite being planned). "May" is a month only with its
capital ("you may 2 times" names no day).
"Today", "yesterday" and "tomorrow" are the server's days in UTC. Each phrase is read
by ``derive.nlp.normalise_date``, the reader extraction dates claims with.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta

from orchestrator.derive.nlp import MONTHS, normalise_date

# At most this many days a question: more is a list of dates, not a subject.
MOST_DAYS = 4
# A day written without its year is also looked for this far ahead of today.
AHEAD_DAYS = 92
# The month names (and abbreviations) extraction's date reader knows, longest first.
_MONTH = "(?:" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?:[12]\d|3[01]|0?[1-9])(?:st|nd|rd|th)?"
_YEAR = r"(?:,?\s+(?P<{}>[12]\d{{3}}))?"
_PHRASES = re.compile(
    r"\b(?:(?P<iso>[12]\d{3}-\d{2}-\d{2})"
    rf"|{_MONTH}\s+{_DAY}{_YEAR.format('y1')}"
    rf"|{_DAY}\s+(?:of\s+)?{_MONTH}{_YEAR.format('y2')}"
    r"|(?P<relative>today|yesterday|tomorrow))(?![\w-])",
    re.IGNORECASE)


def named_days(question: str, today: date | None = None) -> list[datetime]:
    """The days ``question`` names (midnight UTC each, in the order named, no repeats, at
    most ``MOST_DAYS``); an impossible date ("February 30") names none."""
    today = today or datetime.now(UTC).date()
    days: list[datetime] = []
    for match in _PHRASES.finditer(question):
        phrase = match.group(0)
        if re.match(r"may\b", phrase) and not match.group("iso"):
            continue  # "may" is a month only as "May": "you may 2 times"
        when = normalise_date(phrase, anchor=today)
        if when is None or when.precision != "day" or not isinstance(when.value, date):
            continue
        dated = bool(match.group("iso") or match.group("relative") or match.group("y1")
                     or match.group("y2"))
        for day in ([when.value] if dated else _occurrences(when.value, today)):
            moment = datetime(day.year, day.month, day.day, tzinfo=UTC)
            if moment not in days and len(days) < MOST_DAYS:
                days.append(moment)
    return days


def _occurrences(day: date, today: date) -> list[date]:
    """A day written without its year: its last occurrence up to today, and the next one
    when it is at most ``AHEAD_DAYS`` away (plans: "the offsite on January 22")."""
    found: list[date] = []
    for year in (today.year - 1, today.year, today.year + 1):
        try:
            found.append(day.replace(year=year))
        except ValueError:  # February 29th outside a leap year
            continue
    past = [d for d in found if d <= today]
    ahead = [d for d in found if today < d <= today + timedelta(days=AHEAD_DAYS)]
    return past[-1:] + ahead[:1]


def day_bounds(days: Sequence[datetime]) -> dict[str, list[datetime] | None]:
    """The recall statement's ``days`` and ``days_end`` parameters: the first instant of each
    of ``days`` (``named_days``) and of the day after it (None and None for no day)."""
    if not days:
        return {"days": None, "days_end": None}
    return {"days": list(days), "days_end": [d + timedelta(days=1) for d in days]}
