"""Hosting many tenants, over HTTP against the real app: tenants and keys made and managed
through the API and the CLI, roles refused before the body is read, keys bound to a user or an
agent, rotation with a grace period, suspension, erasure with its recount, and the audit log."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest
import redis.asyncio as aioredis

from pipeline import tenants
from pipeline.settings import Settings
from tests.conftest import drain
from tests.test_jobs_api import _cli


@pytest.fixture
async def operator_key(pool: asyncpg.Pool, tenant: tuple[int, str]) -> str:
    key = tenants.new_key()
    await tenants.add_key(pool, tenant[0], key, name="ops", role="operator")
    return key


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _tenant(http: httpx.AsyncClient, operator_key: str, name: str) -> tuple[int, str]:
    made = await http.post("/v1/tenants", json={"name": name}, headers=_as(operator_key))
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["key_info"]["role"] == "admin" and body["tenant"]["status"] == "active"
    return body["tenant"]["id"], body["key"]


async def _key(http: httpx.AsyncClient, admin_key: str, **spec: Any) -> tuple[int, str]:
    made = await http.post("/v1/keys", json=spec, headers=_as(admin_key))
    assert made.status_code == 201, made.text
    return made.json()["key_info"]["id"], made.json()["key"]


async def test_operator_makes_tenants_whose_admins_make_keys(
    http: httpx.AsyncClient, pool: asyncpg.Pool, operator_key: str,
) -> None:
    acme, admin = await _tenant(http, operator_key, "acme")
    # The admin key works for its tenant alone, and is stored hashed only.
    assert (await http.get("/v1/jobs", headers=_as(admin))).status_code == 200
    stored = await pool.fetchval("SELECT count(*) FROM api_keys WHERE prefix = $1", admin[:11])
    assert stored == 1
    assert await pool.fetchval("SELECT count(*) FROM api_keys WHERE key_hash::text LIKE $1",
                               f"%{admin}%") == 0
    again = await http.post("/v1/tenants", json={"name": "acme"}, headers=_as(operator_key))
    assert again.status_code == 409 and "exists" in again.json()["detail"]
    for bad in ({"name": ""}, {"name": " acme"}, {"name": "a\x00b"}, {"name": 3},
                {"name": "x", "extra": 1}):
        refused = await http.post("/v1/tenants", json=bad, headers=_as(operator_key))
        assert refused.status_code == 422, (bad, refused.text)
    assert await pool.fetchval("SELECT count(*) FROM tenants") == 2  # default and acme
    listed = (await http.get("/v1/tenants", headers=_as(operator_key))).json()["data"]
    assert [(t["name"], t["active_keys"]) for t in listed] == [("default", 2), ("acme", 1)]
    by_name = await http.get("/v1/tenants", params={"name": "acme"}, headers=_as(operator_key))
    assert by_name.json()["data"][0]["id"] == acme
    # A tenant's admin manages its own keys, not tenants, and never makes an operator key.
    refused = await http.get("/v1/tenants", headers=_as(admin))
    assert refused.status_code == 403 and "'operator'" in refused.json()["detail"]
    op = await http.post("/v1/keys", json={"role": "operator"}, headers=_as(admin))
    assert op.status_code == 403
    bound_admin = await http.post("/v1/keys", json={"role": "admin", "agent_id": "a"},
                                  headers=_as(admin))
    assert bound_admin.status_code == 422 and "cannot be bound" in bound_admin.json()["detail"]
    key_id, _ = await _key(http, admin, name="ingest", role="write")
    keys = (await http.get("/v1/keys", headers=_as(admin))).json()["data"]
    assert [(k["name"], k["role"]) for k in keys] == [("ingest", "write"), ("admin", "admin")]
    assert all("key" not in k for k in keys)
    # Another tenant's admin (the default tenant's key) never sees acme's keys.
    assert (await http.get(f"/v1/keys/{key_id}")).status_code == 404
    assert (await http.get("/v1/keys", params={"tenant_id": acme})).status_code == 404
    # An operator names any tenant.
    theirs = await http.get("/v1/keys", params={"tenant_id": acme}, headers=_as(operator_key))
    assert len(theirs.json()["data"]) == 2


async def test_roles_are_refused_before_the_body_is_read(
    http: httpx.AsyncClient, operator_key: str,
) -> None:
    _, admin = await _tenant(http, operator_key, "roles")
    _, reader = await _key(http, admin, role="read")
    _, writer = await _key(http, admin, role="write")
    huge = b"{" + b" " * 5_000_000  # never parsed: a 403 comes from the headers alone
    for key, method, path in ((reader, "POST", "/v1/items"), (writer, "POST", "/v1/keys"),
                              (writer, "POST", "/v1/tenants"), (reader, "GET", "/v1/audit"),
                              (writer, "GET", "/v1/keys")):
        refused = await http.request(method, path, content=huge if method == "POST" else None,
                                     headers={**_as(key), "Content-Type": "application/json"})
        assert refused.status_code == 403, (method, path, refused.text)
    assert (await http.post("/v1/search", json={"query": "x"}, headers=_as(reader))).status_code \
        == 200
    put = await http.post("/v1/items", json={"id": "w", "content": "Written."},
                          headers=_as(writer))
    assert put.status_code == 202, put.text
    assert (await http.get("/v1/items/w", headers=_as(reader))).status_code == 200


async def test_a_key_bound_to_an_agent_never_reads_another_agents_private_memories(
    http: httpx.AsyncClient, operator_key: str,
) -> None:
    _, admin = await _tenant(http, operator_key, "agents")
    _, agent_a = await _key(http, admin, name="a", agent_id="agent-a")
    secret = await http.post("/v1/memories", headers=_as(admin), json={
        "scope": {"agent_id": "agent-b"}, "type": "fact", "content": "B's private plan."})
    assert secret.status_code == 201 and secret.json()["memory"]["visibility"] == "private"
    secret_id = secret.json()["memory"]["id"]
    shared = await http.post("/v1/memories", headers=_as(admin), json={
        "scope": {}, "visibility": "tenant", "type": "fact", "content": "Shared plan."})
    assert shared.status_code == 201
    # Naming agent B is refused; naming nobody acts as agent A.
    for method, path, kwargs in (
        ("GET", "/v1/memories", {"params": {"agent_id": "agent-b"}}),
        ("GET", f"/v1/memories/{secret_id}", {"params": {"agent_id": "agent-b"}}),
        ("POST", "/v1/memories/search", {"json": {"query": "plan",
                                                  "scope": {"agent_id": "agent-b"}}}),
        ("POST", "/v1/context", {"json": {"query": "plan", "scope": {"agent_id": "agent-b"}}}),
        ("POST", "/v1/memories", {"json": {"scope": {"agent_id": "agent-b"}, "type": "fact",
                                           "content": "Pretending to be B."}}),
        ("DELETE", f"/v1/memories/{secret_id}", {"params": {"agent_id": "agent-b"}}),
        ("POST", "/v1/memories/delete", {"json": {"scope": {"agent_id": "agent-b"}}}),
    ):
        refused = await http.request(method, path, headers=_as(agent_a), **kwargs)
        assert refused.status_code == 403, (method, path, refused.text)
        assert "bound to agent 'agent-a'" in refused.json()["detail"]
        assert "B's private plan" not in refused.text
    assert (await http.get(f"/v1/memories/{secret_id}", headers=_as(agent_a))).status_code \
        == 404
    found = await http.post("/v1/memories/search", headers=_as(agent_a),
                            json={"query": "plan", "scope": {}})
    assert found.status_code == 200
    assert "Shared plan." in found.text and "B's private plan" not in found.text
    mine = await http.post("/v1/memories", headers=_as(agent_a), json={
        "scope": {}, "type": "fact", "content": "A's own note."})
    assert mine.status_code == 201
    assert mine.json()["memory"]["agent_id"] == "agent-a"
    assert mine.json()["memory"]["visibility"] == "private"
    listed = await http.get("/v1/memories", headers=_as(agent_a))
    assert {m["content"] for m in listed.json()["data"]} == {"A's own note.", "Shared plan."}


async def test_rotation_keeps_the_old_key_for_its_grace_then_refuses_it(
    http: httpx.AsyncClient, operator_key: str,
) -> None:
    _, admin = await _tenant(http, operator_key, "rotating")
    key_id, old = await _key(http, admin, name="svc", role="write", user_id="u1")
    assert (await http.get("/v1/jobs", headers=_as(old))).status_code == 200  # now cached
    rotated = await http.post(f"/v1/keys/{key_id}/rotate", json={"grace_s": 2},
                              headers=_as(admin))
    assert rotated.status_code == 201, rotated.text
    body = rotated.json()
    new = body["key"]
    assert body["key_info"]["role"] == "write" and body["key_info"]["user_id"] == "u1"
    assert body["old"]["rotated_to"] == body["key_info"]["id"]
    assert (await http.get("/v1/jobs", headers=_as(old))).status_code == 200
    assert (await http.get("/v1/jobs", headers=_as(new))).status_code == 200
    await asyncio.sleep(2.2)
    refused = await http.get("/v1/jobs", headers=_as(old))
    assert refused.status_code == 401
    assert (await http.get("/v1/jobs", headers=_as(new))).status_code == 200
    again = await http.post(f"/v1/keys/{key_id}/rotate", json={"grace_s": 0},
                            headers=_as(admin))
    assert again.status_code == 409
    for bad in ({"grace_s": -1}, {"grace_s": 10**9}, {"grace_s": "5"}):
        assert (await http.post(f"/v1/keys/{body['key_info']['id']}/rotate", json=bad,
                                headers=_as(admin))).status_code == 422
    # Grace 0: the old key is refused at once, though the API had it cached.
    now_id = body["key_info"]["id"]
    at_once = await http.post(f"/v1/keys/{now_id}/rotate", json={"grace_s": 0},
                              headers=_as(admin))
    assert (await http.get("/v1/jobs", headers=_as(new))).status_code == 401
    assert (await http.get("/v1/jobs", headers=_as(at_once.json()["key"]))).status_code == 200


async def test_revoked_keys_and_suspended_tenants_are_refused_at_once(
    http: httpx.AsyncClient, operator_key: str, tenant: tuple[int, str],
) -> None:
    tenant_id, admin = await _tenant(http, operator_key, "suspendable")
    key_id, writer = await _key(http, admin, role="write")
    assert (await http.get("/v1/jobs", headers=_as(writer))).status_code == 200
    revoked = await http.delete(f"/v1/keys/{key_id}", headers=_as(admin))
    assert revoked.status_code == 200 and revoked.json()["active"] is False
    assert (await http.get("/v1/jobs", headers=_as(writer))).status_code == 401
    suspended = await http.post(f"/v1/tenants/{tenant_id}/suspend", headers=_as(operator_key))
    assert suspended.json()["status"] == "suspended"
    refused = await http.get("/v1/jobs", headers=_as(admin))
    assert refused.status_code == 401
    resumed = await http.post(f"/v1/tenants/{tenant_id}/resume", headers=_as(operator_key))
    assert resumed.json()["status"] == "active"
    assert (await http.get("/v1/jobs", headers=_as(admin))).status_code == 200
    own = await http.post(f"/v1/tenants/{tenant[0]}/suspend", headers=_as(operator_key))
    assert own.status_code == 409 and "own" in own.json()["detail"]
    assert (await http.post("/v1/tenants/999999/suspend",
                            headers=_as(operator_key))).status_code == 404


async def test_keys_in_the_wrong_place_are_refused(
    http: httpx.AsyncClient, tenant: tuple[int, str],
) -> None:
    key = tenant[1]
    bare = {"Authorization": ""}
    for headers in ({"Authorization": f"Basic {key}"}, {"Authorization": key},
                    {"Api-Key": key}, {"Authorization": f"Bearer {key[:-1]}"},
                    {"Authorization": f"Bearer {key}x"}, {"Cookie": f"key={key}"}):
        refused = await http.get("/v1/jobs", headers={**bare, **headers})
        assert refused.status_code == 401, headers
    refused = await http.get("/v1/jobs", params={"api_key": key}, headers=bare)
    assert refused.status_code == 401


async def test_deleting_a_tenant_erases_every_row_and_redis_key(
    http: httpx.AsyncClient, operator_key: str, settings: Settings, pool: asyncpg.Pool,
    tenant: tuple[int, str],
) -> None:
    doomed, admin = await _tenant(http, operator_key, "doomed")
    await _key(http, admin, role="read", agent_id="agent-x")
    for i in range(3):
        put = await http.post("/v1/items", headers=_as(admin), json={
            "id": f"doc-{i}", "content": f"Document {i} about erasure.", "tags": {"n": str(i)}})
        assert put.status_code == 202
    await http.post("/v1/memories", headers=_as(admin), json={
        "scope": {"user_id": "u"}, "type": "fact", "content": "Remember me."})
    events = await http.post("/v1/sessions/s1/events", headers=_as(admin), json={
        "scope": {"user_id": "u"},
        "events": [{"event_id": "e1", "role": "user", "content": "Hello there."}]})
    assert events.status_code in (200, 201, 202), events.text
    await http.post("/v1/items", json={"id": "kept", "content": "The default tenant's."})
    await drain(settings, pool)
    queued = await http.post("/v1/items", headers=_as(admin),
                             json={"id": "late", "content": "Queued, never run."})
    assert queued.status_code == 202
    redis = aioredis.from_url(settings.redis_url or "")
    await redis.set(f"{settings.queue_name}:fair:{doomed}", "1")
    await redis.set(f"{settings.queue_name}:rate:{doomed}:minute", "1")
    await redis.set(f"{settings.queue_name}:rate:{doomed}1:minute", "1")  # another tenant's
    tables = [r["table_name"] for r in await pool.fetch(
        "SELECT table_name FROM information_schema.columns WHERE column_name = 'tenant_id' "
        "AND table_schema = current_schema()")]
    before = {t: await pool.fetchval(f'SELECT count(*) FROM "{t}" WHERE tenant_id = $1',
                                     doomed) for t in tables}
    assert before["items"] == 4 and before["memories"] == 1 and before["events"] >= 1
    kept = {t: await pool.fetchval(f'SELECT count(*) FROM "{t}" WHERE tenant_id = $1',
                                   tenant[0]) for t in tables}

    started = await http.delete(f"/v1/tenants/{doomed}", headers=_as(operator_key))
    assert started.status_code == 202, started.text
    assert started.json()["tenant"]["status"] == "deleting"
    assert (await http.get("/v1/jobs", headers=_as(admin))).status_code == 401
    await drain(settings, pool)
    shown = (await http.get(f"/v1/tenants/{doomed}", headers=_as(operator_key))).json()
    assert shown["status"] == "deleted", shown
    report = shown["erasure"]
    assert report["verified"] and report["rows_left"] == 0 and report["redis_keys_left"] == 0
    assert report["removed"]["items"] == 4 and report["removed"]["memories"] == 1
    assert report["rows_removed"] == sum(report["removed"].values())
    assert report["redis_keys_removed"] >= 2
    for table in tables:
        left = await pool.fetchval(f'SELECT count(*) FROM "{table}" WHERE tenant_id = $1',
                                   doomed)
        assert left == 0, table
    assert await redis.exists(f"{settings.queue_name}:fair:{doomed}") == 0
    assert await redis.exists(f"{settings.queue_name}:rate:{doomed}1:minute") == 1
    await redis.aclose()
    # Nothing of the other tenant went (its audit log grew by the erasure's records only).
    for table, count in kept.items():
        now = await pool.fetchval(f'SELECT count(*) FROM "{table}" WHERE tenant_id = $1',
                                  tenant[0])
        assert now >= count, table
    assert (await http.get("/v1/items/kept")).status_code == 200
    # The name may be used again; the tombstone stays.
    reborn, _ = await _tenant(http, operator_key, "doomed")
    assert reborn != doomed
    again = await http.delete(f"/v1/tenants/{doomed}", headers=_as(operator_key))
    assert again.status_code == 404


async def test_the_audit_log_records_admin_actions_per_tenant(
    http: httpx.AsyncClient, operator_key: str, pool: asyncpg.Pool,
) -> None:
    acme, admin = await _tenant(http, operator_key, "audited")
    other, other_admin = await _tenant(http, operator_key, "bystander")
    key_id, _ = await _key(http, admin, name="svc")
    await http.post(f"/v1/keys/{key_id}/rotate", json={"grace_s": 0}, headers=_as(admin))
    await http.delete(f"/v1/keys/{key_id}", headers=_as(admin))
    await http.post("/v1/memories/delete", headers=_as(admin), json={"scope": {"user_id": "u"}})
    log = (await http.get("/v1/audit", headers=_as(admin))).json()["data"]
    actions = [entry["action"] for entry in log]
    assert actions[:3] == ["key.revoke", "key.rotate", "key.create"], actions
    assert all(entry["tenant_id"] == acme for entry in log)
    assert log[0]["result"] == "ok" and log[0]["key_name"] == "admin"
    only_keys = (await http.get("/v1/audit", params={"action": "key."},
                                headers=_as(admin))).json()["data"]
    assert {e["action"] for e in only_keys} == {"key.create", "key.rotate", "key.revoke"}
    theirs = (await http.get("/v1/audit", headers=_as(other_admin))).json()["data"]
    assert all(entry["tenant_id"] == other for entry in theirs)
    assert (await http.get("/v1/audit", params={"tenant_id": acme},
                           headers=_as(other_admin))).status_code == 404
    everything = (await http.get("/v1/audit", headers=_as(operator_key))).json()["data"]
    assert {"tenant.create", "key.create"} <= {e["action"] for e in everything}
    page = await http.get("/v1/audit", params={"limit": 1}, headers=_as(admin))
    nxt = await http.get("/v1/audit", params={"limit": 1, "cursor": page.json()["next_cursor"]},
                         headers=_as(admin))
    assert nxt.json()["data"][0]["id"] < page.json()["data"][0]["id"]
    assert (await http.get("/v1/audit", params={"cursor": "x1"},
                           headers=_as(admin))).status_code == 422


async def test_cli_manages_tenants_and_keys(
    api_url: str, http: httpx.AsyncClient, operator_key: str,
) -> None:
    code, out = await _cli(api_url, operator_key, "tenants", "create", "cli-co")
    assert code == 0, out
    admin = out.strip().splitlines()[-1]
    assert admin.startswith("mm_")
    code, out = await _cli(api_url, operator_key, "tenants", "list")
    assert code == 0 and "cli-co" in out and "active" in out
    code, out = await _cli(api_url, admin, "keys", "create", "--name", "bot", "--role", "read",
                           "--agent-id", "bot-1")
    assert code == 0, out
    reader = out.strip().splitlines()[-1]
    assert (await http.post("/v1/items", json={"id": "x", "content": "y"},
                            headers=_as(reader))).status_code == 403
    code, out = await _cli(api_url, admin, "keys", "list")
    assert code == 0 and "bot" in out and "agent bot-1" in out and "read" in out
    key_id = (await http.get("/v1/keys", headers=_as(admin))).json()["data"][0]["id"]
    code, out = await _cli(api_url, admin, "keys", "rotate", str(key_id), "--grace", "0")
    assert code == 0 and "rotated" in out
    assert (await http.get("/v1/jobs", headers=_as(reader))).status_code == 401
    code, out = await _cli(api_url, admin, "keys", "revoke", str(key_id + 1))
    assert code == 0 and "revoked" in out, out
    code, out = await _cli(api_url, admin, "tenants", "list")
    assert code == 1 and "operator" in out
    code, out = await _cli(api_url, operator_key, "tenants", "limits", "cli-co", "--items", "5",
                           "--requests-per-minute", "600")
    assert code == 0, out
    limited = await http.post("/v1/items/batch", headers=_as(admin), json={
        "items": [{"id": f"i{n}", "content": "x"} for n in range(6)]})
    assert limited.status_code == 429 and limited.json()["limit"] == "items"
    code, out = await _cli(api_url, operator_key, "tenants", "limits", "cli-co", "--default",
                           "items")
    assert code == 0 and "600" in out
    assert (await http.get("/v1/usage", headers=_as(admin))).json()["items"]["limit"] is None
    code, out = await _cli(api_url, operator_key, "tenants", "suspend", "cli-co")
    assert code == 0 and "suspended" in out
    code, out = await _cli(api_url, operator_key, "tenants", "show", "cli-co")
    assert code == 0 and "suspended" in out
