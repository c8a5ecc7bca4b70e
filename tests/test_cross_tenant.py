"""Tenant B attacks tenant A through every route of the API, and learns nothing.

Tenant A (its admin key, through the API) makes one of everything: items (one with two
versions, two whose URL cannot be fetched and so dead-letter, one left queued), memories of
each visibility, a registered memory type, a session of events with a trace, an extraction, a
delete by scope, a webhook with a delivery, and a key. Every text A writes holds a marker; the
ids, names and secrets of all A's rows are read from the catalog (every table with a
`tenant_id`), so a column added later is watched without being listed here.

Then the probes are generated from B's view of `/openapi.json`: every operation under `/v1/`,
with each path parameter filled with A's id of its kind, `*_id` query parameters with A's ids,
and a JSON body built from the schema (its required fields, every id field of them holding A's
id) or, where that cannot be generic, from `BODIES`. A path parameter, query parameter or body
field whose kind this file does not know fails the test: a new route is never left unprobed.

What must hold: a request naming A's object in its path gets 404 (403 where the route needs a
role B's key lacks); no answer to B, whatever its status, holds A's marker, A's tenant name or
any id or secret of A's other than those B's request itself carried; A's rows are exactly as
they were. The same path probes sent with A's key then succeed, so B's 404s were about real
objects; and A's answers, which do hold A's data, prove the leak check sees it.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import asyncpg
import httpx
import pytest

from api.roles import changes_something, role_needed
from pipeline import tenants, webhooks
from pipeline.settings import Settings
from tests.conftest import drain
from tests.test_bad_input import leaves, put, resolve, sample
from tests.test_webhooks import Receiver

RUN = uuid.uuid4().hex[:8]
MARKER = f"ALPHA{RUN}zq"  # in every text A writes
B_MARKER = f"BRAVO{RUN}zq"  # in every text B writes: A's answers must never hold it
A_USER, A_AGENT, A_GONE = f"a-{RUN}-user", f"a-{RUN}-agent", f"a-{RUN}-gone-user"
A_ITEM, A_SESSION, A_TRACE = f"a-{RUN}/notes/bread", f"a-{RUN}-session", f"a-{RUN}-trace"
A_TYPE, A_EVENT, A_SPAN = f"a_{RUN}_kind", f"a-{RUN}-event-1", f"a-{RUN}-span-root"
ROLES = ("read", "write", "admin", "operator")
PROBED_METHODS = ("get", "post", "put", "patch", "delete")
ID_NAME = re.compile(r"(^|_)ids?$")
SHORTEST_SECRET = 8  # shorter values (a role, a kind) are not A's alone

# Path parameter -> the kind of A's id that fills it; a name missing here fails the test.
PATH_IDS = {
    "item_id": "item", "job_id": "dead_job", "dead_letter_id": "dead_letter",
    "memory_id": "memory", "session_id": "session", "trace_id": "trace",
    "operation_id": "operation", "webhook_id": "webhook", "delivery_id": "delivery",
    "key_id": "key", "tenant_id": "tenant",
    "kind": "job_kind",  # not an object: a job kind, on the operator's pause and resume
    "run_id": "run", "to_id": "related_memory", "user_id": "user", "topic": "topic",
}
# Where one operation needs another object of the same kind than the table's.
PATH_IDS_BY_OPERATION = {
    ("POST /v1/jobs/{job_id}/cancel", "job_id"): "queued_job",
    ("DELETE /v1/memories/{memory_id}/relations/{kind}/{to_id}", "kind"): "relation_kind"}
# Query parameters ending in `id`, and id fields of JSON bodies -> the kind of A's id.
QUERY_IDS = {"item_id": "item", "user_id": "user", "agent_id": "agent", "tenant_id": "tenant",
             "session_id": "session"}
BODY_IDS = {
    "item_id": "item", "item_ids": "item", "media_item_id": "item", "user_id": "user",
    "agent_id": "agent", "sender_id": "user", "session_id": "session", "event_id": "event",
    "trace_id": "trace", "span_id": "span", "parent_span_id": "span", "tenant_id": "tenant",
    "memory_id": "memory", "webhook_id": "webhook", "key_id": "key", "job_id": "dead_job",
    "operation_id": "operation", "delivery_id": "delivery", "dead_letter_id": "dead_letter",
    "to_id": "related_memory",
    # A bare `id`/`ids` names an item: only the item routes name objects so.
    "id": "item", "ids": "item",
}
BARE_ID_OPERATIONS = {"POST /v1/items", "POST /v1/items/batch", "POST /v1/items/lookup"}
# The path names B's own namespace (sessions are per tenant): B writing to A's session id
# makes B's own session, with this status.
OWN_NAMESPACE = {"POST /v1/sessions/{session_id}/events": 202,
                 "PUT /v1/profiles/{user_id}/topics/{topic}": 200}
# What B's writes that name A's ids in their bodies answer: made in B's own namespace, or
# refused (POST /v1/keys names A's tenant; tenants are an operator's). Others: below 500.
WRITES = {"POST /v1/items": 202, "POST /v1/items/batch": 202, "POST /v1/items/upload": 202,
          "POST /v1/dead-letters/replay": 200, "POST /v1/memories": 201,
          "POST /v1/memories/delete": 202, "POST /v1/memory-types": 201, "POST /v1/keys": 404,
          "POST /v1/tenants": 403, "POST /v1/webhooks": 201, "POST /v1/import": 202,
          "POST /v1/consolidation/runs": 202}
# For the probe where the parent is B's own and the child A's: B's ids of the parent kinds.
B_PARENTS = {"webhook_id": "webhook", "memory_id": "memory", "kind": "relation_kind",
             "user_id": "user"}
# Tables of maintained counts, which a fold may rewrite whoever asks: not A's objects.
AGGREGATES = {"job_counts", "job_count_deltas", "job_stats", "job_stat_deltas", "text_stats",
              "lexeme_stats", "tag_stats", "tenant_usage", "tenant_usage_deltas",
              "tenant_usage_counted", "provider_calls"}


class Uncovered(AssertionError):
    """An operation this file does not know how to probe: a new route must be covered."""


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Webhooks deliver to a receiver on loopback, which only the allow list lets through."""
    return settings.model_copy(update={"fetch_allow": ["127.0.0.1"]})


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    state = Receiver()
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    yield state
    server.close()
    await server.wait_closed()


# --- What A has, and what of it must never reach B -------------------------------------------


@dataclass
class Secrets:
    """Everything of A's that B must never read: texts carry the marker; ids, names, keys and
    secrets are matched exactly (numbers only as whole numbers)."""

    marker: str
    strings: set[str] = field(default_factory=set)
    numbers: set[int] = field(default_factory=set)

    def found(self, sent: str, answer: str) -> list[str]:
        """What of A's is in `answer` that the request (`sent`: its URL and body) did not
        itself carry: an echo of what B sent ("no memory <id>") is no leak."""
        sent = sent + "\n" + unquote(sent)
        echoed = sorted((s for s in self.strings if s in sent), key=len, reverse=True)
        for s in echoed:
            answer = answer.replace(s, "<sent>").replace(quote(s, safe=""), "<sent>")
        leaks = [f"marker {self.marker}"] if self.marker.lower() in answer.lower() else []
        leaks += [s for s in self.strings if s in answer]
        for n in self.numbers:
            whole = re.compile(rf"(?<!\d){n}(?!\d)")
            if whole.search(answer) and not whole.search(sent):
                leaks.append(str(n))
        return leaks


async def spread_identities(pool: asyncpg.Pool) -> None:
    """Give each table's generated ids a range of its own (the n-th table from n billion), so
    that a number in an answer names one row of one table: A's key 3000000001 is never also
    B's dead letter, nor a count."""
    columns = await pool.fetch(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE is_identity = 'YES' AND table_schema = current_schema() ORDER BY 1, 2")
    for n, c in enumerate(columns, start=2):
        await pool.execute(f'ALTER TABLE "{c["table_name"]}" ALTER COLUMN "{c["column_name"]}" '
                           f"RESTART WITH {n * 1_000_000_000 + 1}")


async def tenant_tables(pool: asyncpg.Pool) -> list[str]:
    return [r["table_name"] for r in await pool.fetch(
        "SELECT table_name FROM information_schema.columns WHERE column_name = 'tenant_id' "
        "AND table_schema = current_schema() ORDER BY 1")]


async def catalog_secrets(pool: asyncpg.Pool, tenant_id: int, secrets: Secrets) -> None:
    """Every id of A's rows in every table with a `tenant_id`: uuid columns, `id`/`*_id` text
    columns, generated numbers, hashes and secrets."""
    columns = await pool.fetch(
        "SELECT c.table_name, c.column_name, c.data_type, c.is_identity "
        "FROM information_schema.columns c WHERE c.table_schema = current_schema() "
        "AND c.table_name IN (SELECT table_name FROM information_schema.columns "
        "  WHERE column_name = 'tenant_id' AND table_schema = current_schema()) "
        "AND c.column_name NOT IN ('tenant_id', 'worker_id') AND (c.data_type = 'uuid' "
        "  OR c.is_identity = 'YES' OR (c.data_type = 'text' AND (c.column_name ~ '(^|_)id$' "
        "  OR c.column_name IN ('prefix', 'secret', 'content_hash', 'text_hash', 'url'))))")
    assert len(columns) > 30, columns
    for c in columns:
        values = await pool.fetch(
            f'SELECT DISTINCT "{c["column_name"]}"::text AS v FROM "{c["table_name"]}" '
            f'WHERE tenant_id = $1 AND "{c["column_name"]}" IS NOT NULL', tenant_id)
        for row in values:
            if c["is_identity"] == "YES":
                secrets.numbers.add(int(row["v"]))
            elif len(row["v"]) >= SHORTEST_SECRET:
                secrets.strings.add(row["v"])


async def rows_of(pool: asyncpg.Pool, tenant_id: int) -> dict[str, str]:
    """A digest of each table's rows of the tenant, maintained counts left out."""
    digests = {}
    for table in await tenant_tables(pool):
        if table not in AGGREGATES:
            digests[table] = await pool.fetchval(
                f'SELECT md5(coalesce(string_agg(t::text, \'|\' ORDER BY t::text), \'\')) '
                f'FROM "{table}" t WHERE tenant_id = $1', tenant_id)
    return digests


async def settled_rows(pool: asyncpg.Pool, tenant_id: int) -> dict[str, str]:
    """A's rows once what the API writes after answering (a key's last use) is written."""
    rows = await rows_of(pool, tenant_id)
    for _ in range(50):
        await asyncio.sleep(0.1)
        again = await rows_of(pool, tenant_id)
        if again == rows:
            return rows
        rows = again
    return rows


def client(api_url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=api_url, timeout=60,
                             headers={"Authorization": f"Bearer {key}"})


async def ok(c: httpx.AsyncClient, method: str, url: str, status: int = 200,
             **kwargs: Any) -> Any:
    r = await c.request(method, url, **kwargs)
    assert r.status_code == status, f"{method} {url}: {r.status_code} {r.text}"
    return r.json() if r.content else None


async def make_tenant(ops: httpx.AsyncClient, name: str) -> tuple[int, str]:
    made = await ok(ops, "POST", "/v1/tenants", 201, json={"name": name})
    return made["tenant"]["id"], made["key"]


async def build_tenant_a(a: httpx.AsyncClient, receiver: Receiver, settings: Settings,
                         pool: asyncpg.Pool) -> dict[str, Any]:
    """One of everything, through A's admin key; the ids the probes name."""
    ids: dict[str, Any] = {"user": A_USER, "agent": A_AGENT, "session": A_SESSION,
                           "trace": A_TRACE, "event": A_EVENT, "span": A_SPAN, "item": A_ITEM,
                           "memory_type": A_TYPE, "job_kind": "embed"}
    hook = await ok(a, "POST", "/v1/webhooks", 201, json={
        "url": receiver.url(f"/a-{RUN}"), "events": sorted(webhooks.EVENTS),
        "description": f"{MARKER} hook"})
    ids["webhook"], ids["webhook_secret"] = hook["id"], hook["secret"]
    ping = await ok(a, "POST", f"/v1/webhooks/{hook['id']}/test", 202)
    ids["delivery"] = ping["id"]
    await ok(a, "POST", "/v1/memory-types", 201,
             json={"name": A_TYPE, "description": f"{MARKER} kind of A"})
    for content in (f"{MARKER} Sourdough rises thanks to wild yeast.",
                    f"{MARKER} Sourdough rises thanks to wild yeast and patience."):
        await ok(a, "POST", "/v1/items", 202, json={
            "id": A_ITEM, "content": content, "title": f"{MARKER} bread",
            "tags": {"topic": f"{MARKER}-baking"}})
    await ok(a, "POST", "/v1/items", 202, json={
        "id": f"a-{RUN}/notes/tea", "content": f"{MARKER} Green tea is steeped briefly."})
    dead = {}
    for n in ("one", "two"):  # a private address: refused by the fetch, dead at once
        put_ = await ok(a, "POST", "/v1/items", 202, json={
            "id": f"a-{RUN}/web/{n}", "uri": f"http://10.255.255.1/{MARKER}/{n}"})
        dead[n] = put_
    scope = {"user_id": A_USER, "agent_id": A_AGENT}
    memories = {}
    for visibility, mscope, extra in (("user", scope, {}), ("private", {"agent_id": A_AGENT},
                                                            {"pinned": True}),
                                      ("tenant", {}, {"type": A_TYPE}),
                                      ("user", {"user_id": A_GONE}, {})):
        made = await ok(a, "POST", "/v1/memories", 201, json={
            "scope": mscope, "visibility": visibility, "type": "fact",
            "content": f"{MARKER} {visibility} memory: Ana loves hiking in the Alps.",
            "metadata": {"note": MARKER}, **extra})
        memories.setdefault(visibility, made["memory"]["id"])
    ids["memory"] = memories["user"]
    ids["related_memory"], ids["relation_kind"] = memories["tenant"], "related_to"
    await ok(a, "POST", f"/v1/memories/{ids['memory']}/relations", 201, json={
        "scope": scope, "kind": "related_to", "to_id": ids["related_memory"]})
    await ok(a, "POST", f"/v1/sessions/{A_SESSION}/events", 202, json={"scope": scope, "events": [
        {"event_id": A_EVENT, "role": "user", "sender_name": f"Ana {MARKER}", "trace_id": A_TRACE,
         "span_id": A_SPAN, "content": f"{MARKER} I love beaches and hiking in the Alps.",
         "created_at": "2024-03-01T10:00:00Z"},
        {"event_id": f"a-{RUN}-event-2", "role": "assistant", "trace_id": A_TRACE,
         "span_id": f"a-{RUN}-span-child", "parent_span_id": A_SPAN,
         "content": f"{MARKER} Noted: beaches it is.", "created_at": "2024-03-01T10:01:00Z"}]})
    extraction = await ok(a, "POST", f"/v1/sessions/{A_SESSION}/extract", 202,
                          json={"scope": scope})
    ids["operation"] = extraction["operation_id"]
    forget = await ok(a, "POST", "/v1/memories/delete", 202, json={"scope": {"user_id": A_GONE}})
    key = await ok(a, "POST", "/v1/keys", 201, json={"name": f"a-{RUN}-svc", "role": "write",
                                                     "user_id": A_USER})
    ids["key"], ids["extra_key"] = key["key_info"]["id"], key["key"]
    await drain(settings, pool)
    await ok(a, "POST", f"/v1/memories/{ids['memory']}/references", 201, json={
        "scope": scope, "item_id": A_ITEM})
    ids["topic"] = f"a-{RUN}-topic"
    await ok(a, "PUT", f"/v1/profiles/{A_USER}/topics/{ids['topic']}", json={
        "level": "expert", "summary": f"{MARKER} Ana knows sourdough"})
    await ok(a, "PUT", "/v1/working-memory", json={
        "scope": scope, "session_id": A_SESSION, "content": f"{MARKER} A's plan",
        "expected_version": 0})
    run = await ok(a, "POST", "/v1/consolidation/runs", 202, json={"steps": ["decay", "link"]})
    ids["run"] = run["run_id"]
    await drain(settings, pool)

    # A sees its own work: otherwise B's 404s would prove nothing.
    assert (await ok(a, "GET", f"/v1/operations/{forget['operation_id']}"))["status"] == "done"
    assert (await ok(a, "GET", f"/v1/operations/{ids['operation']}",
                     params=scope))["status"] == "done"
    assert (await ok(a, "GET", f"/v1/items/{quote(A_ITEM, safe='')}"))["version"] == 2
    memory = await ok(a, "GET", f"/v1/memories/{ids['memory']}", params=scope)
    ids["memory_version"] = memory["version"]
    letters = (await ok(a, "GET", "/v1/dead-letters",
                        params={"item_id": f"a-{RUN}/web/one"}))["data"]
    assert len(letters) == 1, letters
    ids["dead_letter"] = letters[0]["id"]
    ids["dead_job"] = dead["two"]["jobs"][0]["id"]
    job = await ok(a, "GET", f"/v1/jobs/{ids['dead_job']}")
    assert job["status"] == "dead", job
    delivery = await ok(a, "GET", f"/v1/webhooks/{ids['webhook']}/deliveries/{ids['delivery']}")
    assert delivery["status"] == "delivered", delivery
    assert len(receiver.posts(f"/a-{RUN}")) > 3
    queued = await ok(a, "POST", "/v1/items", 202, json={
        "id": f"a-{RUN}/queued", "content": f"{MARKER} Queued and never run."})
    ids["queued_job"] = queued["jobs"][0]["id"]
    export = await a.get("/v1/export")
    assert export.status_code == 200 and MARKER in export.text, export.text[:500]
    ids["export"] = export.text
    return ids


# --- Probes generated from the document ------------------------------------------------------


@dataclass
class Probe:
    label: str
    method: str
    template: str  # "METHOD path" is `operation`
    url: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None
    files: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    expect: set[int] | None = None  # None: any status below 500

    @property
    def operation(self) -> str:
        return f"{self.method} {self.template}"


Body = dict[str, Any]  # keyword arguments of httpx's request: json, content, files, params...


def import_body(ids: dict[str, Any], b_ids: dict[str, Any]) -> Body:
    """A's own export with A's texts made B's: a valid file that names every id of A's."""
    lines = []
    for line in ids["export"].splitlines():
        row = json.loads(line.replace(MARKER, B_MARKER))
        row.pop("content_hash", None)  # the content changed
        lines.append(json.dumps(row))
    return {"content": ("\n".join(lines) + "\n").encode(), "params": {"on_conflict": "skip"},
            "headers": {"Content-Type": "application/x-ndjson"}}


def scope(ids: dict[str, Any]) -> dict[str, str]:
    return {"user_id": ids["user"], "agent_id": ids["agent"]}


# Bodies the schema cannot give generically (a valid URL, a known memory type, a file), keyed
# by operation; a builder takes A's ids and B's own. Every other JSON body is generic.
BODIES: dict[str, Callable[[dict[str, Any], dict[str, Any]], Body]] = {
    "POST /v1/items": lambda a, b: {"json": {"id": a["item"],
                                             "content": f"{B_MARKER} B's own bread."}},
    "POST /v1/items/batch": lambda a, b: {"json": {"items": [
        {"id": a["item"], "content": f"{B_MARKER} B's own batch."}]}},
    "POST /v1/items/upload": lambda a, b: {"files": [
        ("file", (a["item"], f"{B_MARKER} B's own file.".encode(), "text/plain"))]},
    "POST /v1/search": lambda a, b: {"json": {
        "query": "sourdough yeast bread tea", "filters": {"item_ids": [a["item"]]}}},
    "POST /v1/memories": lambda a, b: {"json": {
        "scope": scope(a), "type": "fact", "content": f"{B_MARKER} B's own memory.",
        "session_id": a["session"],
        "source_events": [{"session_id": a["session"], "event_id": a["event"]}]}},
    "POST /v1/memories/search": lambda a, b: {"json": {
        "query": "hiking Alps beaches", "scope": scope(a), "include_events": True,
        "session_id": a["session"], "valid_only": False}},
    "PATCH /v1/memories/{memory_id}": lambda a, b: {"json": {
        "scope": scope(a), "expected_version": a["memory_version"],
        "content": f"{B_MARKER} changed by the caller."}},
    "POST /v1/memory-types": lambda a, b: {"json": {"name": a["memory_type"],
                                                    "description": f"{B_MARKER} B's kind"}},
    "POST /v1/context": lambda a, b: {"json": {"scope": scope(a), "query": "hiking beaches",
                                               "session_id": a["session"]}},
    "POST /v1/sessions/{session_id}/events": lambda a, b: {"json": {
        "scope": scope(a), "events": [{
            "event_id": a["event"], "role": "user", "content": f"{B_MARKER} B's own turn.",
            "trace_id": a["trace"], "span_id": a["span"], "media_item_id": a["item"]}]}},
    "POST /v1/webhooks": lambda a, b: {"json": {"url": b["hook_url"],
                                                "events": ["item.ready"]}},
    "POST /v1/import": import_body,
}


def known(table: dict[str, str], name: str, where: str) -> str:
    kind = table.get(name)
    if kind is None:
        raise Uncovered(f"{where}: a new route must be covered: tests/test_cross_tenant.py does "
                        f"not know which of A's ids {name!r} names (add it to its tables)")
    return kind


def exists(body: Any, where: tuple[str | int, ...]) -> bool:
    for step in where:
        if isinstance(step, int):
            if not isinstance(body, list) or not body:
                return False
            body = body[0]
        elif isinstance(body, dict) and step in body:
            body = body[step]
        else:
            return False
    return True


def generic_body(operation: str, schema: dict[str, Any], doc: dict[str, Any],
                 ids: dict[str, Any]) -> Any:
    """The required fields only, and every id field of the objects they make holding A's id
    of its kind."""
    body = sample(schema, doc)
    for where, what, leaf in leaves(schema, doc):
        names = [w for w in where if isinstance(w, str)]
        if what != "value" or not names or not ID_NAME.search(names[-1]):
            continue
        kind = known(BODY_IDS, names[-1], f"{operation} body field {'.'.join(map(str, where))}")
        if names[-1] in ("id", "ids") and operation not in BARE_ID_OPERATIONS:
            raise Uncovered(f"{operation}: a new route must be covered: its body names an "
                            "object by a bare `id`; say which kind in BARE_ID_OPERATIONS")
        if exists(body, where[:-1]):
            value = ids[kind]
            body = put(body, where, int(value) if leaf.get("type") == "integer" else value)
    return body


def body_of(operation: str, spec: dict[str, Any], doc: dict[str, Any], ids: dict[str, Any],
            b_ids: dict[str, Any]) -> Body:
    if operation in BODIES:
        return BODIES[operation](ids, b_ids)
    content = spec.get("requestBody", {}).get("content", {})
    if not content:
        return {}
    if "application/json" not in content:
        raise Uncovered(f"{operation}: a new route must be covered: its body is "
                        f"{sorted(content)}, which only BODIES can build")
    return {"json": generic_body(operation, content["application/json"]["schema"], doc, ids)}


def expected(method: str, path: str, role: str) -> int:
    return 403 if ROLES.index(role_needed(method, path)) > ROLES.index(role) else 404


def probes_of(doc: dict[str, Any], ids: dict[str, Any], b_ids: dict[str, Any],
              role: str = "admin") -> list[Probe]:
    """Every operation under /v1/, naming A's ids; an operation with path parameters also once
    with B's own parent and A's child (B's webhook, A's delivery)."""
    probes, uncovered = [], []
    for template, item in doc["paths"].items():
        if not template.startswith("/v1/"):
            continue
        for method in (m for m in item if m in PROBED_METHODS):
            spec, method = item[method], method.upper()
            operation = f"{method} {template}"
            try:
                probes += operation_probes(doc, operation, spec, ids, b_ids, role)
            except Uncovered as exc:
                uncovered.append(str(exc))
    if uncovered:
        raise Uncovered("\n".join(uncovered))
    return probes


def operation_probes(doc: dict[str, Any], operation: str, spec: dict[str, Any],
                     ids: dict[str, Any], b_ids: dict[str, Any], role: str) -> list[Probe]:
    method, template = operation.split(" ", 1)
    parameters = [resolve(p, doc) for p in spec.get("parameters", [])]
    path_kinds = {p["name"]: PATH_IDS_BY_OPERATION.get(
        (operation, p["name"]), known(PATH_IDS, p["name"], f"{operation} path parameter"))
        for p in parameters if p["in"] == "path"}
    query = {p["name"]: ids[known(QUERY_IDS, p["name"], f"{operation} query parameter")]
             for p in parameters if p["in"] == "query" and ID_NAME.search(p["name"])}
    body = body_of(operation, spec, doc, ids, b_ids)
    variants = [({n: ids[k] for n, k in path_kinds.items()}, "A's ids")]
    parents = list(path_kinds)[:-1]
    if parents:
        own = {n: b_ids[known(B_PARENTS, n, f"{operation} parent")] for n in parents}
        variants.append(({n: ids[k] for n, k in path_kinds.items()} | own,
                         "B's parent, A's child"))
    probes = []
    for values, what in variants:
        url = template.format(**{n: quote(str(v), safe="") for n, v in values.items()})
        status: set[int] | None = None
        if operation in OWN_NAMESPACE:
            status = {OWN_NAMESPACE[operation]}
        elif operation in WRITES and role != "read":
            status = {WRITES[operation]}
        elif path_kinds:
            status = {expected(method, url, role)}
        for params in ({}, query) if query else ({},):
            kwargs = {k: v for k, v in body.items() if k != "params"}
            probes.append(Probe(f"{operation} [{what}{', ids in query' if params else ''}]",
                                method, template, url, params=body.get("params", {}) | params,
                                expect=status, **kwargs))
    return probes


def reading(probe: Probe) -> bool:
    return not changes_something(probe.method, probe.url)


def order(probes: list[Probe]) -> list[list[Probe]]:
    """Reads first; then changes naming A's objects in the path; then B's own writes (to its
    session of A's session id, then what makes new objects, an import last), so that nothing
    B makes is there when B asks for A's."""
    reads = [p for p in probes if reading(p)]
    changes = [p for p in probes if not reading(p) and "{" in p.template
               and p.operation not in OWN_NAMESPACE]
    own = [p for p in probes if p.operation in OWN_NAMESPACE]
    writes = [p for p in probes if not reading(p) and "{" not in p.template]
    writes.sort(key=lambda p: p.operation == "POST /v1/import")
    return [reads, changes, own, writes]


@dataclass
class Attacker:
    http: httpx.AsyncClient
    secrets: Secrets
    sent: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    answers: list[tuple[Probe, httpx.Response]] = field(default_factory=list)

    async def send(self, probe: Probe, *, allowed: str | None = None) -> httpx.Response:
        """Send a probe; note a wrong status or any of A's data in the answer. `allowed`: what
        else counts as sent (for a listing after B's writes: everything B ever sent)."""
        request = self.http.build_request(probe.method, probe.url, params=probe.params or None,
                                          json=probe.json, content=probe.content,
                                          files=probe.files, headers=probe.headers or None)
        sent = f"{unquote(str(request.url))}\n{(await request.aread()).decode('latin-1')}"
        self.sent.append(sent)
        r = await self.http.send(request)
        await r.aread()
        self.answers.append((probe, r))
        if r.status_code >= 500 or (probe.expect is not None
                                    and r.status_code not in probe.expect):
            self.problems.append(f"{probe.label}: status {r.status_code}, expected "
                                 f"{sorted(probe.expect or {'< 500'})}: {r.text[:300]}")
        answer = "\n".join(f"{k}: {v}" for k, v in r.headers.items()) + "\n" + r.text
        leaks = self.secrets.found(sent if allowed is None else allowed + sent, answer)
        if leaks:
            self.problems.append(f"{probe.label}: {r.status_code} holds A's {leaks}: "
                                 f"{r.text[:300]}")
        return r


async def test_tenant_b_learns_nothing_of_tenant_a_on_any_route(
        api_url: str, pool: asyncpg.Pool, settings: Settings, tenant: tuple[int, str],
        receiver: Receiver) -> None:
    await spread_identities(pool)
    operator = tenants.new_key()
    await tenants.add_key(pool, tenant[0], operator, name="ops", role="operator")
    async with client(api_url, operator) as ops:
        a_id, a_key = await make_tenant(ops, f"a-{RUN}-corp")
        _, b_key = await make_tenant(ops, f"b-{RUN}-corp")
    async with client(api_url, a_key) as a, client(api_url, b_key) as b:
        ids = await build_tenant_a(a, receiver, settings, pool)
        ids["tenant"] = a_id
        b_hook = await ok(b, "POST", "/v1/webhooks", 201, json={
            "url": receiver.url(f"/b-{RUN}"), "events": ["item.ready"]})
        b_memory = await ok(b, "POST", "/v1/memories", 201, json={
            "scope": {"user_id": f"b-{RUN}-user"}, "type": "fact",
            "content": f"{B_MARKER} B's own memory."})
        b_ids = {"webhook": b_hook["id"], "hook_url": receiver.url(f"/b-{RUN}"),
                 "memory": b_memory["memory"]["id"], "relation_kind": "related_to",
                 "user": f"b-{RUN}-user"}
        b_read = (await ok(b, "POST", "/v1/keys", 201, json={"role": "read"}))["key"]
        secrets = Secrets(MARKER, {f"a-{RUN}-corp", a_key, ids["extra_key"],
                                   ids["webhook_secret"]}, {a_id})
        await catalog_secrets(pool, a_id, secrets)
        assert b_hook["id"] not in secrets.strings
        doc = await ok(b, "GET", "/openapi.json")
        before = await settled_rows(pool, a_id)

        attacker = Attacker(b, secrets)
        reads, changes, own, writes = order(probes_of(doc, ids, b_ids))
        for probe in reads:
            await attacker.send(probe)
        async with client(api_url, b_read) as reader:
            read_only = Attacker(reader, secrets)
            for probe in order(probes_of(doc, ids, b_ids, role="read"))[0]:
                await read_only.send(probe)
        for probe in changes + own + writes:
            await attacker.send(probe)
        # B's listings after its writes: nothing of A's but what B itself sent.
        everything_sent = "\n".join(attacker.sent)
        for probe in reads:
            if "{" not in probe.template:
                await attacker.send(probe, allowed=everything_sent)
        problems = attacker.problems + [f"(read key) {p}" for p in read_only.problems]
        assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)
        assert await rows_of(pool, a_id) == before, "B's requests changed A's rows"
        probed = {p.operation for p in reads + changes + own + writes}
        assert len(probed) >= 60, sorted(probed)

        await a_succeeds_where_b_got_404(a, attacker, secrets, ids, b_ids, doc)


async def a_succeeds_where_b_got_404(a: httpx.AsyncClient, attacker: Attacker,
                                     secrets: Secrets, ids: dict[str, Any],
                                     b_ids: dict[str, Any], doc: dict[str, Any]) -> None:
    """The same path probes with A's key: A gets 2xx wherever B got 404, so B's 404s were
    about real objects. Reads go first and deletes last; an operation is sent once, with A's
    scope in the query where it takes one. A's answers hold A's data (which the leak check
    sees), and never B's."""
    refused = {p.operation for p, r in attacker.answers
               if r.status_code == 404 and "{" in p.template}
    chosen: dict[str, Probe] = {}
    for probe in probes_of(doc, ids, b_ids):
        if probe.operation in refused and "B's parent" not in probe.label:
            chosen[probe.operation] = probe  # the variant with ids in the query comes last
    rank = ("GET", "PATCH", "PUT", "POST", "DELETE")
    owner = Attacker(a, Secrets(B_MARKER))
    seen_by_a = 0
    # Deeper paths first: a memory's relations are removed before the memory.
    for probe in sorted(chosen.values(),
                        key=lambda p: (rank.index(p.method), -p.template.count("/"))):
        probe.expect = {200, 201, 202, 204}
        if probe.json is not None:  # what A writes is A's text
            probe.json = json.loads(json.dumps(probe.json).replace(B_MARKER, MARKER))
        r = await owner.send(probe)
        if secrets.found(owner.sent[-1], r.text):
            seen_by_a += 1
    assert not owner.problems, "A's own requests:\n" + "\n".join(owner.problems)
    assert len(chosen) >= 30, sorted(chosen)
    assert seen_by_a >= 10, "the leak check does not see A's data in A's own answers"


def test_every_operation_has_a_probe() -> None:
    """Without a database: every operation of the document can be probed (its path and query
    ids and its body are known), so a new route fails here first, with a message."""
    from api.main import create_app

    doc = create_app(Settings()).openapi()
    ids: dict[str, Any] = {k: f"x-{k}" for k in set(PATH_IDS.values()) | set(
        QUERY_IDS.values()) | set(BODY_IDS.values()) | {"queued_job", "memory_type"}}
    ids |= {"tenant": 7, "key": 8, "dead_letter": 9, "export": "", "memory_version": 1,
            "relation_kind": "related_to"}
    probes = probes_of(doc, ids, {"webhook": "w", "hook_url": "http://127.0.0.1:1/",
                                  "memory": "m", "relation_kind": "related_to", "user": "u"})
    operations = {p.operation for p in probes}
    assert set(BODIES) | set(WRITES) <= operations, (set(BODIES) | set(WRITES)) - operations
    for path, item in doc["paths"].items():  # the id fields of explicit bodies too
        for method, spec in item.items():
            json_body = spec.get("requestBody", {}).get("content", {}).get("application/json")
            if json_body and path.startswith("/v1/"):
                generic_body(f"{method.upper()} {path}", json_body["schema"], doc, ids)
    assert set(OWN_NAMESPACE) <= operations
    assert {"GET /v1/webhooks/{webhook_id}/deliveries/{delivery_id}"} <= operations
    with pytest.raises(Uncovered, match="a new route must be covered"):
        probes_of({"paths": {"/v1/things/{thing_id}": {"get": {"parameters": [
            {"name": "thing_id", "in": "path", "schema": {"type": "string"}}]}}}}, ids, {})


def test_the_leak_check_sees_a_leak_and_allows_an_echo() -> None:
    secrets = Secrets(MARKER, {"a-123-session-xyz"}, {3000000042})
    assert secrets.found("GET /v1/sessions/a-123-session-xyz",
                         '{"detail": "no session a-123-session-xyz"}') == []
    assert secrets.found("GET /v1/sessions", '{"data": [{"id": "a-123-session-xyz"}]}') == [
        "a-123-session-xyz"]
    assert secrets.found("GET /v1/x", f'{{"text": "{MARKER.upper()}"}}') == [f"marker {MARKER}"]
    assert secrets.found("GET /v1/keys/3000000042", '{"detail": "no key 3000000042"}') == []
    assert secrets.found("GET /v1/keys", '{"id": 3000000042}') == ["3000000042"]
    assert secrets.found("GET /v1/keys", '{"id": 130000000420, "at": "x3000000042"}') == [
        "3000000042"]
    assert secrets.found("GET /v1/keys", '{"id": 130000000420}') == []
