"""Every bad input to the agent memory routes gets a clear 4xx whose `detail` names what is
wrong, never a 500, and writes nothing.

Each group of cases runs against the real server with a memory (at version 2) and a session
stored first; after every case the memory tables, the ledger and the operations are compared
with how they stood: no row more, none changed. A group reports every case that fails, so one
run lists every bug at once.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import pytest

from tests.test_bad_input import detail_problem

pytestmark = pytest.mark.asyncio

U1A1 = {"user_id": "u1", "agent_id": "a1"}
TABLES = ("memories", "memory_history", "events", "sessions", "operations",
          "operation_decisions", "jobs", "memory_types")
UNKNOWN = "00000000-0000-4000-8000-000000000000"
NO_BODY = object()


@dataclass(frozen=True)
class Bad:
    name: str
    method: str
    path: str  # "{m}" is the stored memory's id
    body: Any = NO_BODY  # bytes are sent as they are, anything else as JSON
    status: int = 422
    words: tuple[str, ...] = ()  # each must appear in the detail (case-insensitive)
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, Any] = field(default_factory=dict)


def b64(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.urlsafe_b64encode(raw).decode()


def with_(base: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """`base` with fields replaced; a field set to `...` is left out."""
    return {k: v for k, v in {**base, **fields}.items() if v is not ...}


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        value = {"k": value}
    return value


def raw(text: str) -> bytes:
    """A body Python's JSON parser takes but JSON (and Postgres' jsonb) does not: NaN."""
    return text.encode()


# --- POST /v1/memories ------------------------------------------------------------------------

MEM = {"scope": U1A1, "type": "fact", "content": "a new fact"}


def memory_write_cases() -> list[Bad]:
    def post(name: str, body: Any, words: tuple[str, ...], status: int = 422) -> Bad:
        return Bad(name, "POST", "/v1/memories", body, status, words)

    scope_ids = [
        ("space", "u 1", ("whitespace",)), ("tab", "u1\t", ("whitespace",)),
        ("newline", "u1\n", ()), ("bell", "u\x07", ("control",)),
        ("zero-width space", "u\u200b", ()), ("line separator", "u\u2028", ()),
        ("no-break space", "u\u00a0", ()), ("NUL", "u\x00", ("NUL",)),
        ("lone surrogate", "u\ud800", ("Unicode",)), ("257 chars", "x" * 257, ("256",)),
        ("empty", "", ()), ("number", 5, ("string",)), ("bool", True, ("string",)),
        ("list", ["u1"], ("string",)), ("object", {"id": "u1"}, ("string",)),
    ]
    cases = []
    for key in ("user_id", "agent_id"):
        for label, value, words in scope_ids:
            cases.append(post(f"scope.{key} {label}",
                              with_(MEM, scope={**U1A1, key: value}), (f"scope.{key}", *words)))
    return [*cases,
        post("missing scope", with_(MEM, scope=...), ("scope", "required")),
        post("scope null", with_(MEM, scope=None), ("scope",)),
        post("scope a string", with_(MEM, scope="u1"), ("scope",)),
        post("scope empty, no visibility", with_(MEM, scope={}), ("scope", "user_id")),
        post("scope nulls, no visibility", with_(MEM, scope={"user_id": None, "agent_id": None}),
             ("scope", "user_id")),
        post("scope with session_id", with_(MEM, scope={**U1A1, "session_id": "s"}),
             ("unknown field", "scope.session_id")),
        post("scope with visibility", with_(MEM, scope={**U1A1, "visibility": "tenant"}),
             ("unknown field", "scope.visibility")),
        post("scope with tenant_id", with_(MEM, scope={**U1A1, "tenant_id": 1}),
             ("unknown field", "scope.tenant_id")),
        post("unknown type", with_(MEM, type="gossip"), ("type", "gossip")),
        post("empty type", with_(MEM, type=""), ("type",)),
        post("type a number", with_(MEM, type=3), ("type", "string")),
        post("missing type", with_(MEM, type=...), ("type", "required")),
        post("confidence 1.5", with_(MEM, confidence=1.5), ("confidence",)),
        post("confidence -0.01", with_(MEM, confidence=-0.01), ("confidence",)),
        post("confidence a string", with_(MEM, confidence="0.5"), ("confidence",)),
        post("confidence a bool", with_(MEM, confidence=True), ("confidence",)),
        post("confidence null", with_(MEM, confidence=None), ("confidence",)),
        post("confidence NaN", raw('{"scope": {"user_id": "u1"}, "type": "fact", '
                                   '"content": "x", "confidence": NaN}'), ("confidence",)),
        post("confidence Infinity", raw('{"scope": {"user_id": "u1"}, "type": "fact", '
                                        '"content": "x", "confidence": Infinity}'),
             ("confidence",)),
        post("visibility unknown", with_(MEM, visibility="public"), ("visibility",)),
        post("visibility user without user", with_(MEM, scope={"agent_id": "a1"},
                                                   visibility="user"), ("user_id",)),
        post("visibility private without agent", with_(MEM, scope={"user_id": "u1"},
                                                       visibility="private"), ("agent_id",)),
        post("visibility user, empty scope", with_(MEM, scope={}, visibility="user"),
             ("user_id",)),
        post("visibility private, empty scope", with_(MEM, scope={}, visibility="private"),
             ("agent_id",)),
        post("content empty", with_(MEM, content=""), ("content",)),
        post("content whitespace only", with_(MEM, content=" \n\t "), ("content",)),
        post("content missing", with_(MEM, content=...), ("content", "required")),
        post("content too long", with_(MEM, content="x" * 20_001), ("content", "20000")),
        post("content NUL", with_(MEM, content="a\x00b"), ("content", "NUL")),
        post("content lone surrogate", with_(MEM, content="a\udfffb"), ("content", "Unicode")),
        post("metadata nested NUL value", with_(MEM, metadata={"a": {"b": ["x", "y\x00"]}}),
             ("metadata", "NUL")),
        post("metadata NUL key", with_(MEM, metadata={"a\x00": 1}), ("metadata", "NUL")),
        post("metadata nested NUL key", with_(MEM, metadata={"a": [{"k\x00": "v"}]}),
             ("metadata", "NUL")),
        post("metadata lone surrogate", with_(MEM, metadata={"a": ["\ud800"]}),
             ("metadata", "Unicode")),
        post("metadata NaN", raw('{"scope": {"user_id": "u1"}, "type": "fact", "content": "x",'
                                 ' "metadata": {"score": NaN}}'), ("metadata",)),
        post("metadata nested -Infinity", raw(
            '{"scope": {"user_id": "u1"}, "type": "fact", "content": "x",'
            ' "metadata": {"a": [1, {"b": -Infinity}]}}'), ("metadata",)),
        post("metadata too large", with_(MEM, metadata={"k": "v" * 16_001}),
             ("metadata", "16000")),
        post("metadata too deep", with_(MEM, metadata=nested(20)), ("metadata", "16")),
        post("metadata a list", with_(MEM, metadata=["a"]), ("metadata", "dictionary")),
        post("metadata a string", with_(MEM, metadata="{}"), ("metadata", "dictionary")),
        post("hints too many", with_(MEM, hints=[f"h{i}" for i in range(21)]), ("hints",)),
        post("hint too long", with_(MEM, hints=["h" * 201]), ("hints.0",)),
        post("hints a string", with_(MEM, hints="tea"), ("hints",)),
        post("hint NUL", with_(MEM, hints=["a\x00"]), ("hints.0", "NUL")),
        post("pinned a string", with_(MEM, pinned="yes"), ("pinned",)),
        post("pinned a number", with_(MEM, pinned=1), ("pinned",)),
        post("observed_at without zone", with_(MEM, observed_at="2024-01-01T10:00:00"),
             ("observed_at",)),
        post("observed_at a number", with_(MEM, observed_at=1_700_000_000),
             ("observed_at", "ISO 8601")),
        post("observed_at words", with_(MEM, observed_at="yesterday"), ("observed_at",)),
        post("observed_at before year 1 in UTC",
             with_(MEM, observed_at="0001-01-01T00:00:00+01:00"), ("observed_at", "9999")),
        post("session_id with space", with_(MEM, session_id="s 1"), ("session_id",)),
        post("session_id empty", with_(MEM, session_id=""), ("session_id",)),
        post("source_events missing event_id", with_(MEM, source_events=[{"session_id": "s"}]),
             ("source_events.0.event_id",)),
        post("source_events bad event_id",
             with_(MEM, source_events=[{"session_id": "s", "event_id": "e 1"}]),
             ("source_events.0.event_id",)),
        post("source_events unknown field",
             with_(MEM, source_events=[{"session_id": "s", "event_id": "e", "seq": 1}]),
             ("unknown field", "source_events.0.seq")),
        post("source_events too many", with_(MEM, source_events=[
            {"session_id": "s", "event_id": f"e{i}"} for i in range(101)]),
             ("source_events",)),
        post("source too long", with_(MEM, source="s" * 257), ("source",)),
        post("unknown field user_id", with_(MEM, user_id="u1"), ("unknown field", "user_id")),
        post("unknown field id", with_(MEM, id=UNKNOWN), ("unknown field", "id")),
        post("unknown field version", with_(MEM, version=7), ("unknown field", "version")),
        post("unknown field embedding", with_(MEM, embedding=[0.1]),
             ("unknown field", "embedding")),
        post("body a list", [MEM], ("JSON object",)),
        post("body malformed", b'{"scope": {"user_id": "u1"}, "type": ', ("JSON",)),
        post("body not UTF-8", b'{"scope": {"user_id": "u1"}, "type": "fact", '
                               b'"content": "caf\xe9"}', ("UTF-8",)),
    ]


# --- PATCH, invalidate, DELETE, GET of one memory ---------------------------------------------

PATCH = {"scope": U1A1, "expected_version": 2, "content": "changed again"}
INVALIDATE = {"scope": U1A1, "expected_version": 2, "reason": "no longer true"}


def memory_change_cases() -> list[Bad]:
    one = "/v1/memories/{m}"

    def patch(name: str, body: Any, words: tuple[str, ...], status: int = 422,
              headers: dict[str, Any] | None = None) -> Bad:
        return Bad(f"PATCH {name}", "PATCH", one, body, status, words, headers=headers or {})

    def invalidate(name: str, body: Any, words: tuple[str, ...], status: int = 422,
                   headers: dict[str, Any] | None = None) -> Bad:
        return Bad(f"invalidate {name}", "POST", one + "/invalidate", body, status, words,
                   headers=headers or {})

    def delete(name: str, status: int, words: tuple[str, ...], path: str = one,
               params: dict[str, Any] | None = None,
               headers: dict[str, Any] | None = None) -> Bad:
        return Bad(name, "DELETE", path, NO_BODY, status, words,
                   params=U1A1 if params is None else params,
                   headers=headers or {})

    unversioned = with_(PATCH, expected_version=...)
    return [
        patch("no expected_version nor If-Match", unversioned, ("expected_version",)),
        patch("expected_version null", with_(PATCH, expected_version=None),
              ("expected_version",)),
        patch("stale expected_version", with_(PATCH, expected_version=1), ("version 2",), 409),
        patch("stale If-Match", unversioned, ("version 2",), 409, {"If-Match": '"1"'}),
        patch("stale weak If-Match", unversioned, ("version 2",), 409, {"If-Match": 'W/"1"'}),
        patch("future expected_version", with_(PATCH, expected_version=3), ("version 2",), 409),
        patch("If-Match not a number", unversioned, ("If-Match",), 422, {"If-Match": '"abc"'}),
        patch("If-Match empty", unversioned, ("If-Match",), 422, {"If-Match": ""}),
        patch("If-Match star", unversioned, ("If-Match",), 422, {"If-Match": "*"}),
        patch("If-Match negative", unversioned, ("If-Match",), 422, {"If-Match": '"-1"'}),
        patch("If-Match huge", unversioned, ("If-Match",), 422,
              {"If-Match": '"99999999999999999999"'}),
        patch("If-Match superscript two", unversioned, ("If-Match",), 422,
              {"If-Match": b'"\xb2"'}),
        patch("If-Match list", unversioned, ("If-Match",), 422, {"If-Match": '"1", "2"'}),
        patch("If-Match and expected_version differ", with_(PATCH, expected_version=1),
              ("If-Match", "expected_version"), 422, {"If-Match": '"2"'}),
        patch("expected_version 0", with_(PATCH, expected_version=0), ("expected_version",)),
        patch("expected_version negative", with_(PATCH, expected_version=-1),
              ("expected_version",)),
        patch("expected_version a string", with_(PATCH, expected_version="2"),
              ("expected_version",)),
        patch("expected_version 2.5", with_(PATCH, expected_version=2.5),
              ("expected_version",)),
        patch("expected_version past int32", with_(PATCH, expected_version=2**31),
              ("expected_version",)),
        patch("expected_version past int64", with_(PATCH, expected_version=2**64),
              ("expected_version",)),
        patch("missing scope", with_(PATCH, scope=...), ("scope", "required")),
        patch("scope user with space", with_(PATCH, scope={"user_id": "u 1"}),
              ("scope.user_id",)),
        patch("scope that cannot see it", with_(PATCH, scope={"user_id": "u2"}), ("memory",),
              404),
        patch("empty scope cannot see it", with_(PATCH, scope={}), ("memory",), 404),
        patch("unknown type", with_(PATCH, type="gossip"), ("type", "gossip")),
        patch("confidence 2", with_(PATCH, confidence=2), ("confidence",)),
        patch("content empty", with_(PATCH, content=""), ("content",)),
        patch("content NUL", with_(PATCH, content="\x00"), ("content", "NUL")),
        patch("metadata nested NUL", with_(PATCH, metadata={"a": {"b": "\x00"}}),
              ("metadata", "NUL")),
        patch("metadata NaN", raw('{"scope": {"user_id": "u1", "agent_id": "a1"}, '
                                  '"expected_version": 2, "metadata": {"x": NaN}}'),
              ("metadata",)),
        patch("observed_at without zone", with_(PATCH, observed_at="2024-01-01T00:00:00"),
              ("observed_at",)),
        patch("hints null item", with_(PATCH, hints=[None]), ("hints.0",)),
        patch("unknown field visibility", with_(PATCH, visibility="tenant"),
              ("unknown field", "visibility")),
        patch("unknown field user_id", with_(PATCH, user_id="u2"),
              ("unknown field", "user_id")),
        patch("unknown field session_id", with_(PATCH, session_id="s2"),
              ("unknown field", "session_id")),
        patch("unknown field valid_until", with_(PATCH, valid_until="2030-01-01T00:00:00Z"),
              ("unknown field", "valid_until")),
        patch("unknown field version", with_(PATCH, version=9), ("unknown field", "version")),
        Bad("PATCH id not a uuid", "PATCH", "/v1/memories/not-a-uuid", PATCH, 422,
            ("memory_id",)),
        Bad("PATCH unknown id", "PATCH", f"/v1/memories/{UNKNOWN}", PATCH, 404, ("memory",)),
        invalidate("missing reason", with_(INVALIDATE, reason=...), ("reason", "required")),
        invalidate("empty reason", with_(INVALIDATE, reason=""), ("reason",)),
        invalidate("reason too long", with_(INVALIDATE, reason="r" * 1001), ("reason",)),
        invalidate("reason NUL", with_(INVALIDATE, reason="r\x00"), ("reason", "NUL")),
        invalidate("stale expected_version", with_(INVALIDATE, expected_version=1),
                   ("version 2",), 409),
        invalidate("stale If-Match", with_(INVALIDATE, expected_version=...), ("version 2",),
                   409, {"If-Match": '"1"'}),
        invalidate("bad If-Match", with_(INVALIDATE, expected_version=...), ("If-Match",), 422,
                   {"If-Match": "v2"}),
        invalidate("If-Match superscript", with_(INVALIDATE, expected_version=...),
                   ("If-Match",), 422, {"If-Match": b"\xb2"}),
        invalidate("valid_until without zone", with_(INVALIDATE,
                                                     valid_until="2030-01-01T00:00:00"),
                   ("valid_until",)),
        invalidate("valid_until words", with_(INVALIDATE, valid_until="soon"),
                   ("valid_until",)),
        invalidate("unknown field superseded_by", with_(INVALIDATE, superseded_by=UNKNOWN),
                   ("unknown field", "superseded_by")),
        invalidate("scope that cannot see it", with_(INVALIDATE, scope={"agent_id": "a1"}),
                   ("memory",), 404),
        invalidate("missing scope", with_(INVALIDATE, scope=...), ("scope",)),
        Bad("invalidate id not a uuid", "POST", "/v1/memories/123/invalidate", INVALIDATE, 422,
            ("memory_id",)),
        delete("DELETE stale If-Match", 409, ("version 2",), headers={"If-Match": '"1"'}),
        delete("DELETE bad If-Match", 422, ("If-Match",), headers={"If-Match": "two"}),
        delete("DELETE If-Match superscript", 422, ("If-Match",),
               headers={"If-Match": b'"\xb2"'}),
        delete("DELETE user_id with space", 422, ("user_id",), params={"user_id": "u 1"}),
        delete("DELETE agent_id NUL", 422, ("agent_id", "NUL"), params={"agent_id": "a\x00"}),
        delete("DELETE scope that cannot see it", 404, ("memory",), params={"user_id": "u2"}),
        delete("DELETE no scope", 404, ("memory",), params={}),
        delete("DELETE id not a uuid", 422, ("memory_id",), path="/v1/memories/xyz"),
        delete("DELETE unknown id", 404, ("memory",), path=f"/v1/memories/{UNKNOWN}"),
        Bad("GET id not a uuid", "GET", "/v1/memories/1234", params=U1A1, words=("memory_id",)),
        Bad("GET user_id empty", "GET", "/v1/memories/{m}", params={"user_id": ""},
            words=("user_id",)),
        Bad("GET user_id 257", "GET", "/v1/memories/{m}", params={"user_id": "u" * 257},
            words=("user_id", "256")),
        Bad("history id not a uuid", "GET", "/v1/memories/abc/history", params=U1A1,
            words=("memory_id",)),
        Bad("history agent_id with newline", "GET", "/v1/memories/{m}/history",
            params={"agent_id": "a\n1"}, words=("agent_id",)),
    ]


# --- lists and their cursors -----------------------------------------------------------------

NOW = "2024-01-01T00:00:00+00:00"


def read_cases() -> list[Bad]:
    def listing(name: str, params: dict[str, Any], words: tuple[str, ...],
                path: str = "/v1/memories", status: int = 422) -> Bad:
        return Bad(name, "GET", path, params={**U1A1, **params}, status=status, words=words)

    events = "/v1/sessions/s1/events"
    return [
        listing("memories cursor not base64", {"cursor": "!!!"}, ("cursor",)),
        listing("memories cursor garbage", {"cursor": "abcd"}, ("cursor",)),
        listing("memories cursor not UTF-8", {"cursor": b64(b"\xff\xfe|x")}, ("cursor",)),
        listing("memories cursor no time", {"cursor": b64(f"yesterday|{UNKNOWN}")},
                ("cursor",)),
        listing("memories cursor no uuid", {"cursor": b64(f"{NOW}|not-a-uuid")}, ("cursor",)),
        listing("memories cursor before year 1 in UTC",
                {"cursor": b64(f"0001-01-01T00:00:00+14:00|{UNKNOWN}")}, ("cursor",)),
        listing("memories cursor after year 9999 in UTC",
                {"cursor": b64(f"9999-12-31T23:59:59-14:00|{UNKNOWN}")}, ("cursor",)),
        listing("memories cursor too long", {"cursor": "a" * 201}, ("cursor",)),
        listing("memories cursor NUL", {"cursor": "a\x00b"}, ("cursor", "NUL")),
        listing("memories limit 0", {"limit": 0}, ("limit",)),
        listing("memories limit 501", {"limit": 501}, ("limit",)),
        listing("memories limit a word", {"limit": "ten"}, ("limit",)),
        listing("memories valid_only maybe", {"valid_only": "maybe"}, ("valid_only",)),
        listing("memories user_id with space", {"user_id": "u 1"}, ("user_id",)),
        listing("memories agent_id empty", {"agent_id": ""}, ("agent_id",)),
        listing("memories type NUL", {"type": "fa\x00ct"}, ("type", "NUL")),
        listing("sessions cursor not base64", {"cursor": "!!!"}, ("cursor",), "/v1/sessions"),
        listing("sessions cursor two parts", {"cursor": b64("a|b")}, ("cursor",),
                "/v1/sessions"),
        listing("sessions cursor no time", {"cursor": b64("yesterday")}, ("cursor",),
                "/v1/sessions"),
        listing("sessions cursor before year 1 in UTC",
                {"cursor": b64("0001-01-01T00:00:00+14:00")}, ("cursor",), "/v1/sessions"),
        listing("sessions limit 0", {"limit": 0}, ("limit",), "/v1/sessions"),
        listing("sessions user_id tab", {"user_id": "u\t1"}, ("user_id",), "/v1/sessions"),
        listing("events cursor not base64", {"cursor": "!!!"}, ("cursor",), events),
        listing("events cursor one part", {"cursor": b64(NOW)}, ("cursor",), events),
        listing("events cursor seq a word", {"cursor": b64(f"{NOW}|x")}, ("cursor",), events),
        listing("events cursor seq negative", {"cursor": b64(f"{NOW}|-1")}, ("cursor",),
                events),
        listing("events cursor seq superscript", {"cursor": b64(f"{NOW}|\u00b2")},
                ("cursor",), events),
        listing("events cursor seq past int64",
                {"cursor": b64(f"{NOW}|99999999999999999999")}, ("cursor",), events),
        listing("events cursor time words", {"cursor": b64("soon|3")}, ("cursor",), events),
        listing("events cursor before year 1 in UTC",
                {"cursor": b64("0001-01-01T00:00:00+14:00|3")}, ("cursor",), events),
        listing("events since words", {"since": "yesterday"}, ("since",), events),
        listing("events since before year 1 in UTC", {"since": "0001-01-01T00:00:00+14:00"},
                ("since",), events),
        listing("events limit 1001", {"limit": 1001}, ("limit",), events),
        listing("events path id with space", {}, ("session_id",), "/v1/sessions/s%201/events"),
        listing("events path id 257", {}, ("session_id", "256"),
                "/v1/sessions/" + "s" * 257 + "/events"),
        listing("session path id newline", {}, ("session_id",), "/v1/sessions/s%0A1"),
        listing("session path id NUL", {}, ("session_id",), "/v1/sessions/s%001"),
        Bad("delete session path id with space", "DELETE", "/v1/sessions/s%201", params=U1A1,
            words=("session_id",)),
        Bad("delete session user_id with space", "DELETE", "/v1/sessions/s1",
            params={"user_id": "u 1"}, words=("user_id",)),
        Bad("delete session that the scope cannot see", "DELETE", "/v1/sessions/s1",
            params={"user_id": "u2"}, status=404, words=("session",)),
        listing("trace id with space", {}, ("trace_id",), "/v1/traces/t%201"),
        listing("trace id 257", {}, ("trace_id",), "/v1/traces/" + "t" * 257),
        listing("unknown trace", {}, ("trace",), "/v1/traces/nope", 404),
    ]


# --- search and context ----------------------------------------------------------------------

SEARCH = {"query": "fact", "scope": U1A1}
CONTEXT = {"scope": U1A1, "query": "fact"}


def search_context_cases() -> list[Bad]:
    def search(name: str, body: Any, words: tuple[str, ...]) -> Bad:
        return Bad(f"search {name}", "POST", "/v1/memories/search", body, 422, words)

    def context(name: str, body: Any, words: tuple[str, ...], status: int = 422) -> Bad:
        return Bad(f"context {name}", "POST", "/v1/context", body, status, words)

    return [
        search("missing query", with_(SEARCH, query=...), ("query", "required")),
        search("empty query", with_(SEARCH, query=""), ("query",)),
        search("blank query", with_(SEARCH, query="  \t "), ("query",)),
        search("query too long", with_(SEARCH, query="q" * 2001), ("query", "2000")),
        search("query NUL", with_(SEARCH, query="a\x00"), ("query", "NUL")),
        search("query a number", with_(SEARCH, query=5), ("query", "string")),
        search("missing scope", with_(SEARCH, scope=...), ("scope", "required")),
        search("scope user with space", with_(SEARCH, scope={"user_id": "u 1"}),
               ("scope.user_id",)),
        search("scope with session_id", with_(SEARCH, scope={"session_id": "s1"}),
               ("unknown field", "scope.session_id")),
        search("limit 0", with_(SEARCH, limit=0), ("limit",)),
        search("limit 101", with_(SEARCH, limit=101), ("limit",)),
        search("limit a string", with_(SEARCH, limit="10"), ("limit",)),
        search("limit 2.5", with_(SEARCH, limit=2.5), ("limit",)),
        search("offset -1", with_(SEARCH, offset=-1), ("offset",)),
        search("offset 10001", with_(SEARCH, offset=10_001), ("offset",)),
        search("include_events a string", with_(SEARCH, include_events="true"),
               ("include_events",)),
        search("types a string", with_(SEARCH, types="fact"), ("types",)),
        search("types too many", with_(SEARCH, types=["fact"] * 51), ("types",)),
        search("as_of without zone", with_(SEARCH, as_of="2024-01-01T00:00:00"), ("as_of",)),
        search("min_confidence 1.5", with_(SEARCH, min_confidence=1.5), ("min_confidence",)),
        search("after words", with_(SEARCH, after="last week"), ("after",)),
        search("before a number", with_(SEARCH, before=0), ("before",)),
        search("session_id with space", with_(SEARCH, session_id="s 1"), ("session_id",)),
        search("unknown field filters", with_(SEARCH, filters={}), ("unknown field", "filters")),
        search("unknown field user_id", with_(SEARCH, user_id="u1"),
               ("unknown field", "user_id")),
        search("body malformed", b'{"query": ', ("JSON",)),
        context("no query and no session", with_(CONTEXT, query=...), ("query",)),
        context("empty query", with_(CONTEXT, query=""), ("query",)),
        context("blank query", with_(CONTEXT, query="   "), ("query",)),
        context("query NUL", with_(CONTEXT, query="\x00"), ("query", "NUL")),
        context("max_tokens 15", with_(CONTEXT, max_tokens=15), ("max_tokens",)),
        context("max_tokens 100001", with_(CONTEXT, max_tokens=100_001), ("max_tokens",)),
        context("max_tokens negative", with_(CONTEXT, max_tokens=-1), ("max_tokens",)),
        context("max_tokens a string", with_(CONTEXT, max_tokens="1000"), ("max_tokens",)),
        context("max_tokens 1000.5", with_(CONTEXT, max_tokens=1000.5), ("max_tokens",)),
        context("max_tokens null", with_(CONTEXT, max_tokens=None), ("max_tokens",)),
        context("max_tokens past int64", with_(CONTEXT, max_tokens=2**70), ("max_tokens",)),
        context("session_id with space", with_(CONTEXT, session_id="s 1"), ("session_id",)),
        context("unknown session", with_(CONTEXT, session_id="nope"), ("session",), 404),
        context("session the scope cannot see", with_(CONTEXT, scope={"user_id": "u2"},
                                                      session_id="s1"), ("session",), 404),
        context("missing scope", with_(CONTEXT, scope=...), ("scope", "required")),
        context("scope agent empty", with_(CONTEXT, scope={"agent_id": ""}),
                ("scope.agent_id",)),
        context("unknown field limit", with_(CONTEXT, limit=5), ("unknown field", "limit")),
        context("body a string", "fact", ("JSON object",)),
    ]


# --- sessions and events ---------------------------------------------------------------------

EVENT = {"event_id": "e9", "role": "user", "content": "hello"}
EVENTS = {"scope": U1A1, "events": [EVENT]}


def session_cases() -> list[Bad]:
    def write(name: str, body: Any, words: tuple[str, ...], status: int = 422,
              session: str = "s-new", params: dict[str, Any] | None = None) -> Bad:
        return Bad(name, "POST", f"/v1/sessions/{session}/events", body, status, words,
                   params=params or {})

    def event(name: str, words: tuple[str, ...], **fields: Any) -> Bad:
        return write(name, with_(EVENTS, events=[with_(EVENT, **fields)]), words)

    def extract(name: str, body: Any, words: tuple[str, ...], status: int = 422,
                session: str = "s1") -> Bad:
        return Bad(name, "POST", f"/v1/sessions/{session}/extract", body, status, words)

    nan_event = ('{"scope": {"user_id": "u1", "agent_id": "a1"}, "events": [{"event_id": "e9",'
                 ' "role": "user", "content": "hi", "metadata": {"v": [NaN]}}]}')
    return [
        write("missing scope", with_(EVENTS, scope=...), ("scope", "required")),
        write("scope empty", with_(EVENTS, scope={}), ("scope",)),
        write("scope null", with_(EVENTS, scope=None), ("scope",)),
        write("scope user with space", with_(EVENTS, scope={"user_id": "u 1"}),
              ("scope.user_id", "whitespace")),
        write("scope user 257", with_(EVENTS, scope={"user_id": "u" * 257}),
              ("scope.user_id", "256")),
        write("scope agent control char", with_(EVENTS, scope={"agent_id": "a\x1b"}),
              ("scope.agent_id",)),
        write("scope user a number", with_(EVENTS, scope={"user_id": 1}),
              ("scope.user_id", "string")),
        write("scope with visibility", with_(EVENTS, scope={**U1A1, "visibility": "tenant"}),
              ("unknown field", "scope.visibility")),
        write("visibility at the top", with_(EVENTS, visibility="tenant"),
              ("unknown field", "visibility")),
        write("missing events", with_(EVENTS, events=...), ("events", "required")),
        write("no events", with_(EVENTS, events=[]), ("events",)),
        write("501 events", with_(EVENTS, events=[with_(EVENT, event_id=f"e{i}")
                                                  for i in range(501)]), ("events", "500")),
        write("events an object", with_(EVENTS, events=EVENT), ("events",)),
        event("role unknown", ("events.0.role",), role="bot"),
        event("role missing", ("events.0.role", "required"), role=...),
        event("type unknown", ("events.0.type",), type="VIDEO"),
        event("type lowercase", ("events.0.type",), type="text"),
        event("event_id missing", ("events.0.event_id", "required"), event_id=...),
        event("event_id with space", ("events.0.event_id",), event_id="e 1"),
        event("event_id 257", ("events.0.event_id", "256"), event_id="e" * 257),
        event("event_id a number", ("events.0.event_id", "string"), event_id=9),
        event("content missing", ("events.0.content", "required"), content=...),
        event("content too long", ("events.0.content", "20000"), content="c" * 20_001),
        event("content NUL", ("events.0.content", "NUL"), content="a\x00"),
        event("created_at without zone", ("events.0.created_at",),
              created_at="2024-01-01T10:00:00"),
        event("created_at a number", ("events.0.created_at",), created_at=1_700_000_000),
        event("created_at before year 1 in UTC", ("events.0.created_at",),
              created_at="0001-01-01T00:00:00+01:00"),
        event("metadata nested NUL", ("events.0.metadata", "NUL"),
              metadata={"a": [{"b": "\x00"}]}),
        event("metadata NUL key", ("events.0.metadata", "NUL"), metadata={"\x00": 1}),
        event("metadata a list", ("events.0.metadata",), metadata=[1]),
        event("sender_name empty", ("events.0.sender_name",), sender_name=""),
        event("sender_id with space", ("events.0.sender_id",), sender_id="a b"),
        event("trace_id with space", ("events.0.trace_id",), trace_id="t 1"),
        event("span_id newline", ("events.0.span_id",), span_id="s\n"),
        event("ending a string", ("events.0.ending",), ending="yes"),
        event("unknown field user_id", ("unknown field", "events.0.user_id"), user_id="u2"),
        event("unknown field seq", ("unknown field", "events.0.seq"), seq=1),
        write("metadata NaN", raw(nan_event), ("events.0.metadata",)),
        write("second event bad", with_(EVENTS, events=[EVENT, with_(EVENT, event_id="e10",
                                                                     role="robot")]),
              ("events.1.role",)),
        write("wait negative", EVENTS, ("wait",), params={"wait": -1}),
        write("wait 61", EVENTS, ("wait",), params={"wait": 61}),
        write("wait a word", EVENTS, ("wait",), params={"wait": "soon"}),
        write("wait NaN", EVENTS, ("wait",), params={"wait": "nan"}),
        write("path id with space", EVENTS, ("session_id",), session="s%201"),
        write("path id 257", EVENTS, ("session_id", "256"), session="s" * 257),
        write("path id NUL", EVENTS, ("session_id",), session="s%00"),
        write("session of U1 written by U2", with_(EVENTS, scope={"user_id": "u2",
                                                                  "agent_id": "a1"}),
              ("session",), 409, session="s1"),
        write("session of U1/A1 written by U1 alone", with_(EVENTS, scope={"user_id": "u1"}),
              ("session",), 409, session="s1"),
        write("session of U1/A1 written by A1 alone", with_(EVENTS, scope={"agent_id": "a1"}),
              ("session",), 409, session="s1"),
        write("session of U1/A1 written by U1/A2", with_(EVENTS, scope={"user_id": "u1",
                                                                       "agent_id": "a2"}),
              ("session",), 409, session="s1"),
        extract("extract without scope", {}, ("scope", "required")),
        extract("extract unknown field", {"scope": U1A1, "force": True},
                ("unknown field", "force")),
        extract("extract scope that cannot see it", {"scope": {"user_id": "u2"}},
                ("session",), 404),
        extract("extract unknown session", {"scope": U1A1}, ("session",), 404, "nope"),
        extract("extract path id with space", {"scope": U1A1}, ("session_id",), 422, "s%201"),
    ]


# --- operations, memory types, delete by scope ------------------------------------------------


def other_cases() -> list[Bad]:
    def types(name: str, body: Any, words: tuple[str, ...]) -> Bad:
        return Bad(name, "POST", "/v1/memory-types", body, 422, words)

    def forget(name: str, body: Any, words: tuple[str, ...]) -> Bad:
        return Bad(name, "POST", "/v1/memories/delete", body, 422, words)

    return [
        Bad("operation id not a uuid", "GET", "/v1/operations/not-a-uuid",
            words=("operation_id",)),
        Bad("operation id a number", "GET", "/v1/operations/42", words=("operation_id",)),
        Bad("unknown operation", "GET", f"/v1/operations/{UNKNOWN}", status=404,
            words=("operation",)),
        Bad("unknown operation, waiting", "GET", f"/v1/operations/{UNKNOWN}",
            params={"wait": 0.1}, status=404, words=("operation",)),
        Bad("operation wait 61", "GET", f"/v1/operations/{UNKNOWN}", params={"wait": 61},
            words=("wait",)),
        Bad("operation wait negative", "GET", f"/v1/operations/{UNKNOWN}",
            params={"wait": -0.5}, words=("wait",)),
        Bad("operation user_id with space", "GET", f"/v1/operations/{UNKNOWN}",
            params={"user_id": "u 1"}, words=("user_id",)),
        types("type name with capitals", {"name": "Gossip"}, ("name",)),
        types("type name with space", {"name": "my type"}, ("name",)),
        types("type name from a digit", {"name": "1type"}, ("name",)),
        types("type name 65", {"name": "t" * 65}, ("name",)),
        types("type name built in", {"name": "fact"}, ("name", "built-in")),
        types("type name missing", {"description": "d"}, ("name", "required")),
        types("type description too long", {"name": "mood", "description": "d" * 1001},
              ("description",)),
        types("type description NUL", {"name": "mood", "description": "\x00"},
              ("description", "NUL")),
        types("type unknown field", {"name": "mood", "builtin": False},
              ("unknown field", "builtin")),
        forget("delete with empty scope", {"scope": {}}, ("empty scope",)),
        forget("delete with a null user", {"scope": {"user_id": None}}, ("empty scope",)),
        forget("delete with nulls only", {"scope": {"user_id": None, "agent_id": None,
                                                    "session_id": None}}, ("empty scope",)),
        forget("delete without scope", {}, ("scope", "required")),
        forget("delete scope null", {"scope": None}, ("scope",)),
        forget("delete scope user with space", {"scope": {"user_id": "u 1"}},
               ("scope.user_id",)),
        forget("delete scope user empty", {"scope": {"user_id": ""}}, ("scope.user_id",)),
        forget("delete scope with visibility", {"scope": {"user_id": "u1",
                                                          "visibility": "user"}},
               ("unknown field", "scope.visibility")),
        forget("delete unknown field", {"scope": {"user_id": "u1"}, "dry_run": True},
               ("unknown field", "dry_run")),
        forget("delete body a list", [{"scope": {"user_id": "u1"}}], ("JSON object",)),
    ]


GROUPS = {
    "memory_write": memory_write_cases,
    "memory_change": memory_change_cases,
    "reads": read_cases,
    "search_context": search_context_cases,
    "sessions": session_cases,
    "other": other_cases,
}


# --- the machinery ---------------------------------------------------------------------------


async def snapshot(pool: asyncpg.Pool) -> dict[str, Any]:
    async def rows(sql: str) -> list[dict[str, Any]]:
        return [dict(r) for r in await pool.fetch(sql)]

    return {
        "counts": {t: await pool.fetchval(f"SELECT count(*) FROM {t}") for t in TABLES},
        "memories": await rows(
            "SELECT tenant_id, id, user_id, agent_id, session_id, visibility, type, content, "
            "confidence, source, metadata, hints, pinned, observed_at, valid_until, "
            "invalid_reason, version, updated_at, access_count, accessed_at FROM memories "
            "ORDER BY id"),
        "history": await rows("SELECT memory_id, version, operation FROM memory_history "
                              "ORDER BY memory_id, version"),
        "sessions": await rows(
            "SELECT tenant_id, id, user_id, agent_id, visibility, last_write_at, events, "
            "ended_at, extracted_seq, first_event_at, last_event_at FROM sessions ORDER BY id"),
        "events": await rows("SELECT seq, session_id, event_id, content FROM events "
                             "ORDER BY seq"),
        "jobs": await rows("SELECT id, kind, status, run_after, payload FROM jobs ORDER BY id"),
        "operations": await rows("SELECT id, kind, job_id, result, finished_at FROM operations "
                                 "ORDER BY id"),
        "types": await rows("SELECT name, description FROM memory_types ORDER BY name"),
    }


def problem(r: httpx.Response, case: Bad) -> str | None:
    """What is wrong with a refusal, or None when it has the status and a useful detail."""
    return detail_problem(r, case.status, case.words)


async def send(c: httpx.AsyncClient, case: Bad, memory_id: str) -> httpx.Response:
    kwargs: dict[str, Any] = {"params": case.params, "headers": dict(case.headers)}
    if case.body is not NO_BODY:
        kwargs["content"] = case.body if isinstance(case.body, bytes) else json.dumps(
            case.body).encode()
        kwargs["headers"].setdefault("Content-Type", "application/json")
    return await c.request(case.method, case.path.replace("{m}", memory_id), **kwargs)


@pytest.fixture
async def stored(http: httpx.AsyncClient, pool: asyncpg.Pool) -> dict[str, Any]:
    """A memory at version 2 and a session of one event, stored (not processed) first."""
    r = await http.post("/v1/memories", json={**MEM, "content": "the existing fact"})
    assert r.status_code == 201, r.text
    memory_id = r.json()["memory"]["id"]
    r = await http.patch(f"/v1/memories/{memory_id}", json={
        "scope": U1A1, "expected_version": 1, "content": "the existing fact, changed"})
    assert r.status_code == 200 and r.json()["memory"]["version"] == 2, r.text
    r = await http.post("/v1/sessions/s1/events", json={"scope": U1A1, "events": [
        {"event_id": "e1", "role": "user", "content": "the existing fact was said"}]})
    assert r.status_code == 202, r.text
    return {"memory_id": memory_id, "state": await snapshot(pool)}


@pytest.mark.parametrize("group", list(GROUPS))
async def test_bad_input_is_refused_and_writes_nothing(
        group: str, http: httpx.AsyncClient, pool: asyncpg.Pool,
        stored: dict[str, Any]) -> None:
    cases = GROUPS[group]()
    assert len({c.name for c in cases}) == len(cases), "case names must be unique"
    failures = []
    for case in cases:
        r = await send(http, case, stored["memory_id"])
        found = [problem(r, case)]
        now = await snapshot(pool)
        if now != stored["state"]:
            changed = [k for k in now if now[k] != stored["state"][k]]
            found.append(f"the database changed ({', '.join(changed)})")
            stored["state"] = now  # so later cases are judged on their own
        if any(found):
            failures.append(f"{case.name}: {'; '.join(f for f in found if f)}")
    assert not failures, f"{len(failures)} of {len(cases)} cases wrong:\n" + "\n".join(failures)


async def test_duplicate_event_ids_in_one_batch(
        http: httpx.AsyncClient, pool: asyncpg.Pool, stored: dict[str, Any]) -> None:
    """A batch naming one event id twice is either refused whole (a 422 naming event_id, and
    nothing written) or stored once with the repeat counted as a duplicate, as a resent event
    is; never a 500 and never two rows."""
    batch = [{"event_id": "d1", "role": "user", "content": "first say"},
             {"event_id": "d1", "role": "user", "content": "second say"},
             {"event_id": "d2", "role": "assistant", "content": "an answer"},
             {"event_id": "e1", "role": "user", "content": "resent in s1? no: new session"}]
    r = await http.post("/v1/sessions/s-dup/events", json={"scope": U1A1, "events": batch})
    assert r.status_code in (202, 422), r.text
    if r.status_code == 422:
        assert "event_id" in r.json()["detail"] and "d1" in r.json()["detail"], r.text
        assert await snapshot(pool) == stored["state"]
        return
    assert (r.json()["stored"], r.json()["duplicates"]) == (3, 1), r.text
    rows = await pool.fetch("SELECT event_id, content FROM events WHERE session_id = 's-dup' "
                            "ORDER BY event_id")
    assert [row["event_id"] for row in rows] == ["d1", "d2", "e1"]
    assert await pool.fetchval("SELECT events FROM sessions WHERE id = 's-dup'") == 3
    # The same batch again: all four are duplicates now.
    again = await http.post("/v1/sessions/s-dup/events", json={"scope": U1A1, "events": batch})
    assert again.status_code == 202, again.text
    assert (again.json()["stored"], again.json()["duplicates"]) == (0, 4)
    assert await pool.fetchval("SELECT events FROM sessions WHERE id = 's-dup'") == 3


async def test_odd_but_valid_requests_answer(
        http: httpx.AsyncClient, stored: dict[str, Any]) -> None:
    """Queries with no searchable word, and scope ids at the limits, are answered, not
    failed: a 2xx, never a 500."""
    failures = []
    for query in ("the", "!!!", "a'b\"c\\", "日本語のテキスト", "-- ; DROP TABLE memories",
                  "x" * 2000, "\u00b2 \u0663", "ñ" * 50):
        for include_events in (False, True):
            r = await http.post("/v1/memories/search", json={
                "query": query, "scope": U1A1, "include_events": include_events})
            if r.status_code != 200:
                failures.append(f"search {query[:20]!r}: {r.status_code} {r.text[:200]}")
        r = await http.post("/v1/context", json={"scope": U1A1, "query": query})
        if r.status_code != 200:
            failures.append(f"context {query[:20]!r}: {r.status_code} {r.text[:200]}")
    longest = {"user_id": "u" * 256, "agent_id": "é" * 256}
    r = await http.post("/v1/memories", json={**MEM, "scope": longest})
    if r.status_code != 201:
        failures.append(f"256-character ids: {r.status_code} {r.text[:200]}")
    r = await http.get("/v1/memories", params={**U1A1, "limit": 1})
    page = r.json()
    if r.status_code != 200 or page["next_cursor"] is not None:
        failures.append(f"list: {r.status_code} {r.text[:200]}")
    r = await http.post("/v1/context", json={"scope": U1A1, "session_id": "s1"})
    if r.status_code != 200:
        failures.append(f"context of a session, no query: {r.status_code} {r.text[:200]}")
    assert not failures, "\n".join(failures)
