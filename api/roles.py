"""Which role each request needs: one table, applied in the auth middleware before the body is
read, and read by the OpenAPI document (api/openapi.py), so neither a new route nor the docs
can forget it.

Roles go read < write < admin < operator (pipeline/tenants.py). By default a request that
only reads needs `read` and any other needs `write`; the rules below raise that for the routes
that manage the tenant (admin) or the installation (operator). The routes' own checks remain
where the answer depends on the data (an operator acting on another tenant's job)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.tenants import Role

READING_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# POSTs that only read: their questions are too large or too structured for a query string.
READING_POSTS = frozenset({"/v1/search", "/v1/memories/search", "/v1/context",
                           "/v1/items/lookup"})
# Open to any valid key, whatever the method: each MCP tool call is an API request of its own
# (api/mcp.py), which needs the role its route needs, so the envelope needs none.
ENVELOPES = frozenset({"/mcp"})


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    role: Role
    why: str


def _rule(pattern: str, role: Role, why: str) -> Rule:
    return Rule(re.compile(pattern), role, why)


# The first rule whose pattern matches the path decides, for every method.
RULES: tuple[Rule, ...] = (
    _rule(r"^/v1/tenants(/|$)", "operator", "tenants are managed by the installation's operator"),
    _rule(r"^/v1/queues/[^/]+/(pause|resume)$", "operator",
          "pausing a job kind affects every tenant"),
    _rule(r"^/v1/(keys|webhooks|audit|export|import)(/|$)", "admin",
          "the tenant's keys, webhooks, audit log, export and import are its admins'"),
    _rule(r"^/v1/memory-policy$", "admin",
          "the memory policy decides when every memory of the tenant expires"),
)

READ_ONLY_REFUSAL = "this key is read-only: it can read, but not change anything"


def changes_something(method: str, path: str) -> bool:
    """Whether a request may change data: what a read-only key is refused (403)."""
    return (method not in READING_METHODS and path not in READING_POSTS
            and path not in ENVELOPES)


def required(method: str, path: str) -> Rule | None:
    """The rule raising what `path` needs above the default, if any."""
    for rule in RULES:
        if rule.pattern.search(path):
            return rule
    return None


def role_needed(method: str, path: str) -> Role:
    rule = required(method, path)
    if rule is not None:
        return rule.role
    return "write" if changes_something(method, path) else "read"


def refusal(method: str, path: str, role: Role) -> str:
    """Why a key of `role` may not make this request (the 403's detail)."""
    rule = required(method, path)
    if rule is not None:
        return f"this key's role is {role!r}; this needs {rule.role!r}: {rule.why}"
    return READ_ONLY_REFUSAL
