"""LangGraph's search filters and namespace conditions, with the semantics its own stores give
them (langgraph.store.memory): `{"field": value}` is an exact match (a nested object matches
the keys it names, a list matches only an equal list), `{"field": {"$op": operand}}` compares
with `$eq`, `$ne`, `$gt`, `$gte`, `$lt` or `$lte`.

Exact string matches also go to the server as a jsonb containment, which narrows what it sends
before the rest is checked here; what the server cannot express (comparisons, inequality)
is checked here on every row it sends. Where LangGraph's in-memory store raises on an item
that lacks a compared field or holds a non-number there, these skip the item, as its Postgres
store does; a bad filter raises a ValueError before anything is sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from langgraph.store.base import ListNamespacesOp, MatchCondition

OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
COMPARISONS = ("$gt", "$gte", "$lt", "$lte")


def check(filter: Any, *, where: str = "filter") -> None:
    """Raise a ValueError naming the place of anything a filter cannot mean."""
    if filter is None:
        return
    if not isinstance(filter, Mapping):
        raise ValueError(f"{where}: must be a dict of field names to values, "
                         f"not {type(filter).__name__}")
    for name, expected in filter.items():
        if not isinstance(name, str):
            raise ValueError(f"{where}: field names are strings, not {name!r}")
        if isinstance(expected, Mapping) and any(str(k).startswith("$") for k in expected):
            _check_operators(expected, where=f"{where}.{name}")
        elif isinstance(expected, Mapping):
            check(expected, where=f"{where}.{name}")


def _check_operators(operators: Mapping[Any, Any], *, where: str) -> None:
    for operator, operand in operators.items():
        if operator not in OPERATORS:
            raise ValueError(f"{where}: unknown operator {operator!r}; use one of "
                             f"{', '.join(OPERATORS)}")
        if operator in COMPARISONS and not _is_number(operand):
            raise ValueError(f"{where}.{operator}: compares numbers, not {operand!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def matches(value: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    return all(_compare(value.get(name), expected) for name, expected in (filter or {}).items())


def _compare(actual: Any, expected: Any) -> bool:
    if isinstance(expected, Mapping):
        if any(str(k).startswith("$") for k in expected):
            return all(_apply(actual, op, operand) for op, operand in expected.items())
        return isinstance(actual, Mapping) and matches(actual, expected)
    if isinstance(expected, list | tuple):
        return (isinstance(actual, list | tuple) and len(actual) == len(expected)
                and all(_compare(a, e) for a, e in zip(actual, expected, strict=True)))
    return bool(actual == expected)


def _apply(actual: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return bool(actual == operand)
    if operator == "$ne":
        return bool(actual != operand)
    try:
        number = float(actual)
    except (TypeError, ValueError):
        return False  # a missing field, or one that holds no number: not a match
    if operator == "$gt":
        return number > operand
    if operator == "$gte":
        return number >= operand
    if operator == "$lt":
        return number < operand
    return number <= operand


def containment(filter: Mapping[str, Any] | None) -> dict[str, str]:
    """The part of a filter the server can apply as a jsonb containment without ever leaving
    out an item the whole filter keeps: exact string matches (a number could be stored as
    true, which Python's == takes for 1 and jsonb does not)."""
    found: dict[str, str] = {}
    for name, expected in (filter or {}).items():
        if isinstance(expected, Mapping) and isinstance(expected.get("$eq"), str):
            found[name] = expected["$eq"]
        elif isinstance(expected, str):
            found[name] = expected
    return found


def condition_holds(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    else:
        raise ValueError(f"match_type: {condition.match_type!r} is neither prefix nor suffix")
    return all(want == "*" or label == want for label, want in pairs)


def prefix_of(op: ListNamespacesOp) -> tuple[str, ...]:
    """The prefix a listing asks for (the server narrows by it), or () for none."""
    for condition in op.match_conditions or ():
        if condition.match_type == "prefix":
            return tuple(condition.path)
    return ()


def select_namespaces(namespaces: Iterable[tuple[str, ...]],
                      op: ListNamespacesOp) -> list[tuple[str, ...]]:
    """The namespaces a listing answers: those meeting every condition, cut to `max_depth`,
    each once, sorted, then the page `offset`/`limit` asks for."""
    for name, number in (("limit", op.limit), ("offset", op.offset)):
        if not isinstance(number, int) or number < 0:
            raise ValueError(f"{name}: must be a whole number from 0, not {number!r}")
    if op.max_depth is not None and (not isinstance(op.max_depth, int) or op.max_depth < 1):
        raise ValueError(f"max_depth: must be a whole number from 1, not {op.max_depth!r}")
    kept = {ns for ns in namespaces
            if all(condition_holds(c, ns) for c in op.match_conditions or ())}
    if op.max_depth is not None:
        kept = {ns[:op.max_depth] for ns in kept}
    return sorted(kept)[op.offset:op.offset + op.limit]
