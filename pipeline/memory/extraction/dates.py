"""Relative time expressions ("yesterday", "last week", "two days ago", "on Monday", "in May")
resolved against the moment a turn was said, so a memory read months later still says when.

Calendar arithmetic uses the reference's own time zone: "yesterday" said at 23:00 in New York
is the New York yesterday, which is the day the speaker meant. The result is that calendar
day (or the first day of the week, month or year) at midnight UTC, so it stores and compares
as an aware datetime without pretending to know the hour.

Tense matters for bare names: "on Monday" and "in May" look back by default (a statement of
what happened) and forward when the caller says the sentence is a plan.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal

Granularity = Literal["day", "week", "month", "year"]
Tense = Literal["past", "future"]

MONTHS = (
    "january", "february", "march", "april", "may", "june",
    "july", "august", "september", "october", "november", "december",
)
_MONTH_NUMBER = {name: i + 1 for i, name in enumerate(MONTHS)}
_MONTH_NUMBER.update({name[:3]: i + 1 for i, name in enumerate(MONTHS)})
_MONTH_NUMBER["sept"] = 9
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
    "a couple of": 2, "a couple": 2, "couple of": 2,
}
# Counts that are not counts: resolved to a likely value, labelled as an approximation.
_VAGUE = {"a few": 3, "few": 3, "several": 4}

_MONTH = (r"(?P<month>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|"
          r"aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)")
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_COUNT = (r"(?P<count>\d{1,3}|a couple(?: of)?|couple of|a few|few|several|an?|one|two|"
          r"three|four|five|six|seven|eight|nine|ten|eleven|twelve)")
_UNIT = r"(?P<unit>day|week|month|year)s?"
_WEEKDAY = r"(?P<weekday>monday|tuesday|wednesday|thursday|friday|saturday|sunday)"


@dataclass(frozen=True)
class ResolvedDate:
    """A time expression found in a sentence and what it means.

    `when` is the start of the period (the day, the Monday of the week, the first of the month
    or of the year); `label` says it in words with its preposition ("on 7 May 2023", "in the
    week of 1 May 2023"), ready to append to a memory; `start`/`end` locate `phrase` in the
    sentence so a caller can cut it out.
    """

    when: datetime
    granularity: Granularity
    phrase: str
    label: str
    start: int
    end: int

    @property
    def day(self) -> date:
        return self.when.date()


def format_day(d: date) -> str:
    return f"{d.day} {MONTHS[d.month - 1].capitalize()} {d.year}"


def _label(d: date, granularity: Granularity) -> str:
    if granularity == "day":
        return f"on {format_day(d)}"
    if granularity == "week":
        return f"in the week of {format_day(d)}"
    if granularity == "month":
        return f"in {MONTHS[d.month - 1].capitalize()} {d.year}"
    return f"in {d.year}"


def _midnight_utc(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def _add_months(d: date, months: int) -> date:
    """The same day `months` later (or earlier), clamped to the month's last day."""
    index = d.year * 12 + d.month - 1 + months
    year, month = divmod(index, 12)
    month += 1
    next_month = date(year + (month == 12), month % 12 + 1, 1)
    return date(year, month, min(d.day, (next_month - timedelta(days=1)).day))


def _monday(d: date) -> date:
    return d - timedelta(days=d.weekday())


def _period_start(d: date, granularity: Granularity) -> date:
    if granularity == "week":
        return _monday(d)
    if granularity == "month":
        return d.replace(day=1)
    if granularity == "year":
        return d.replace(month=1, day=1)
    return d


def _shift(d: date, unit: str, n: int) -> date:
    if unit == "day":
        return d + timedelta(days=n)
    if unit == "week":
        return d + timedelta(weeks=n)
    if unit == "month":
        return _add_months(d, n)
    return _add_months(d, 12 * n)


def _safe_date(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:
        return None


class _Match:
    """A match whose missing groups read as "", so rules can share group names: the second
    month rule spells "which" twice (as `which2`) because Python forbids a repeated name."""

    def __init__(self, m: re.Match[str]) -> None:
        self._m = m

    def __getitem__(self, name: str) -> str:
        groups = self._m.groupdict()
        if name == "which" and not groups.get("which"):
            return groups.get("which2") or ""
        return groups.get(name) or ""

    def span(self) -> tuple[int, int]:
        return self._m.span()


# Each rule takes the match, the reference day and the tense, and answers (day, granularity,
# label) or None when the match turns out not to be a date ("31 February", "may" the verb).
_Answer = tuple[date, Granularity, str] | None
_Rule = Callable[[_Match, date, Tense], _Answer]
def _iso(m: _Match, ref: date, tense: Tense) -> _Answer:
    d = _safe_date(int(m["year"]), int(m["month"]), int(m["day"]))
    return (d, "day", _label(d, "day")) if d else None


def _month_number(m: _Match) -> int | None:
    word = m["month"]
    if word.lower() == "may" and not word.startswith("M"):
        return None  # "may" the verb; the month is written with a capital
    return _MONTH_NUMBER[word.lower()]


def _day_month(m: _Match, ref: date, tense: Tense) -> _Answer:
    month = _month_number(m)
    if month is None:
        return None
    if m["year"]:
        d = _safe_date(int(m["year"]), month, int(m["day"]))
    else:  # no year: the nearest such day in the direction of the tense
        d = _safe_date(ref.year, month, int(m["day"]))
        if d is not None and tense == "past" and d > ref:
            d = _safe_date(ref.year - 1, month, int(m["day"]))
        elif d is not None and tense == "future" and d < ref:
            d = _safe_date(ref.year + 1, month, int(m["day"]))
    return (d, "day", _label(d, "day")) if d else None


def _month(m: _Match, ref: date, tense: Tense) -> _Answer:
    month = _month_number(m)
    if month is None:
        return None
    which = m["which"].lower()
    if m["year"]:
        year = int(m["year"])
    elif which == "last":  # the most recent such month before the current one
        year = ref.year if month < ref.month else ref.year - 1
    elif which == "next":
        year = ref.year if month > ref.month else ref.year + 1
    elif which == "this":
        year = ref.year
    elif tense == "future":
        year = ref.year if month >= ref.month else ref.year + 1
    else:
        year = ref.year if month <= ref.month else ref.year - 1
    d = date(year, month, 1)
    return d, "month", _label(d, "month")


def _year(m: _Match, ref: date, tense: Tense) -> _Answer:
    d = date(int(m["year"]), 1, 1)
    return d, "year", _label(d, "year")


_DAY_WORDS = {
    "the day before yesterday": -2, "yesterday": -1, "last night": -1,
    "today": 0, "tonight": 0, "this morning": 0, "this afternoon": 0, "this evening": 0,
    "earlier today": 0, "tomorrow": 1, "the day after tomorrow": 2,
}


def _day_word(m: _Match, ref: date, tense: Tense) -> _Answer:
    d = ref + timedelta(days=_DAY_WORDS[" ".join(m["word"].lower().split())])
    return d, "day", _label(d, "day")


def _relative_period(m: _Match, ref: date, tense: Tense) -> _Answer:
    which, unit = m["which"].lower(), m["unit"].lower()
    step = {"last": -1, "past": -1, "this": 0, "next": 1}[which]
    if unit == "weekend":  # named by its Saturday; "last weekend" on a Sunday is the one before
        d = _monday(ref) + timedelta(days=5, weeks=step)
        return d, "week", f"on the weekend of {format_day(d)}"
    granularity: Granularity = unit  # type: ignore[assignment]
    d = _period_start(_shift(ref, unit, step), granularity)
    return d, granularity, _label(d, granularity)


def _ago(m: _Match, ref: date, tense: Tense) -> _Answer:
    count_word, unit = " ".join(m["count"].lower().split()), m["unit"].lower()
    vague = count_word in _VAGUE
    n = int(count_word) if count_word.isdigit() else _VAGUE.get(count_word) or _NUMBERS[count_word]
    d = _shift(ref, unit, -n)
    if vague:  # say it as vaguely as it was said, against the day it was said
        granularity: Granularity = "week" if unit == "day" else unit  # type: ignore[assignment]
        return d, granularity, f"{count_word} {unit}s before {format_day(ref)}"
    if unit == "day":
        return d, "day", _label(d, "day")
    granularity = unit  # type: ignore[assignment]
    d = _period_start(d, granularity)
    return d, granularity, _label(d, granularity)


def _weekday(m: _Match, ref: date, tense: Tense) -> _Answer:
    target = WEEKDAYS.index(m["weekday"].lower())
    which = m["which"].lower()
    which = "" if which == "on" else which
    if which == "this":
        d = _monday(ref) + timedelta(days=target)
    elif which == "next" or (not which and tense == "future"):
        d = ref + timedelta(days=(target - ref.weekday() - 1) % 7 + 1)
    else:  # "last Friday", "on Friday": the most recent one before the reference
        d = ref - timedelta(days=(ref.weekday() - target - 1) % 7 + 1)
    return d, "day", _label(d, "day")


_RULES: tuple[tuple[re.Pattern[str], _Rule], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), rule)
    for pattern, rule in (
        (rf"\b(?:on\s+)?{_YEAR}-(?P<month>[01]\d)-(?P<day>[0-3]\d)\b", _iso),
        (rf"\b(?:on\s+)?(?:the\s+)?{_DAY}(?:\s+of)?\s+{_MONTH}\.?(?:,?\s+{_YEAR})?\b", _day_month),
        (rf"\b(?:on\s+)?{_MONTH}\.?\s+{_DAY}(?:,?\s+{_YEAR})?\b(?!:)", _day_month),
        (r"\b(?P<word>the\s+day\s+before\s+yesterday|the\s+day\s+after\s+tomorrow|yesterday"
         r"|last\s+night|earlier\s+today|today|tonight|this\s+(?:morning|afternoon|evening)"
         r"|tomorrow)\b", _day_word),
        (rf"\b{_COUNT}\s+{_UNIT}\s+ago\b", _ago),
        (r"\b(?P<which>last|past|this|next)\s+(?P<unit>weekend|week|month|year)\b",
         _relative_period),
        (rf"\b(?:on\s+)?(?P<which>last|this|next|on)\s+{_WEEKDAY}\b", _weekday),
        (rf"\b(?:(?:in|during)\s+)?(?P<which>last|this|next)?\s*{_MONTH}\.?\s+{_YEAR}\b",
         _month),
        (rf"\b(?:(?:in|during)\s+(?P<which>last|this|next)?\s*|(?P<which2>last|this|next)\s+)"
         rf"{_MONTH}\b", _month),
        (rf"\b(?:in|during)\s+{_YEAR}\b", _year),
    )
)


def find_dates(sentence: str, reference: datetime, *, tense: Tense = "past") -> list[ResolvedDate]:
    """Every time expression in the sentence, in order; the more specific rules claim text
    first, so "8 May 2023" is one day and not also "May"."""
    ref = _local_day(reference)
    taken: list[tuple[int, int]] = []
    found: list[ResolvedDate] = []
    for pattern, rule in _RULES:
        for m in pattern.finditer(sentence):
            start, end = m.span()
            if any(start < e and s < end for s, e in taken):
                continue
            answer = rule(_Match(m), ref, tense)
            if answer is None:
                continue
            d, granularity, label = answer
            phrase = sentence[start:end].strip()
            taken.append((start, end))
            found.append(ResolvedDate(_midnight_utc(d), granularity, phrase, label, start, end))
    return sorted(found, key=lambda r: r.start)


def resolve(sentence: str, reference: datetime, *, tense: Tense = "past") -> ResolvedDate | None:
    """The first time expression of the sentence, resolved; None when it has none."""
    found = find_dates(sentence, reference, tense=tense)
    return found[0] if found else None


def parse_date(text: str) -> datetime | None:
    """An explicit date or datetime ("2023-05-07", "2023-05-07T10:00:00Z", "7 May 2023"),
    aware in UTC (a naive one is taken as UTC); None when it is not one. For answers of a
    model, which are not always the ISO format they were asked for."""
    text = text.strip()
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        pass
    else:
        if parsed.tzinfo is None:
            return parsed.replace(tzinfo=UTC)
        return parsed.astimezone(UTC)
    for pattern, rule in _RULES[:3]:  # the explicit forms only: no reference to resolve against
        m = pattern.fullmatch(text)
        if m and (m["year"] or rule is _iso):
            answer = rule(_Match(m), date(2000, 1, 1), "past")  # the year is written
            if answer is not None:
                return _midnight_utc(answer[0])
    return None


def _local_day(reference: datetime) -> date:
    """The reference's calendar day where it was said (naive: taken as UTC)."""
    if reference.tzinfo is None:
        reference = reference.replace(tzinfo=UTC)
    return reference.date()
