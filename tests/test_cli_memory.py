"""`memmill memory …`, `memmill sessions …` and `memmill context` run in this process against
the real API, Postgres and queue: what each prints on stdout and on stderr, its exit code,
and that the refusals the CLI makes itself are made before anything is sent."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from typer.testing import CliRunner, Result

from memmill import memory_cli
from memmill.cli import app
from pipeline.settings import Settings
from tests.conftest import drain, free_port
from tests.test_cli import instance_dir

runner = CliRunner()
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


async def cli(api_url: str, key: str, *args: str, stdin: str | None = None) -> Result:
    """The CLI in a thread (the API answers from this test's event loop), told the instance
    by MEMMILL_URL and MEMMILL_API_KEY."""
    env = {"MEMMILL_URL": api_url, "MEMMILL_API_KEY": key, "MEMMILL_DATA_DIR": None,
           "COLUMNS": "200"}
    return await asyncio.to_thread(runner.invoke, app, list(args), env=env, input=stdin)


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def http(api_url: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=api_url, headers={"Authorization": f"Bearer {key}"},
                             timeout=30)


async def keep_draining(settings: Settings, pool: asyncpg.Pool) -> None:
    while True:
        await drain(settings, pool)
        await asyncio.sleep(0.1)


async def with_worker(settings: Settings, pool: asyncpg.Pool, call: Any) -> Result:
    worker = asyncio.create_task(keep_draining(settings, pool))
    try:
        return await call
    finally:
        worker.cancel()


async def test_add_search_get_invalidate_history_and_delete_by_scope(
    api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool
) -> None:
    key = tenant[1]
    added = ok(await cli(api_url, key, "memory", "add", "Ana prefers green tea",
                         "--type", "preference", "--user", "u1", "--agent", "a1",
                         "--confidence", "0.9"))
    memory_id, version, kind, visibility = added.stdout.split()
    assert UUID.match(memory_id) and (version, kind, visibility) == ("v1", "preference", "user")
    ok(await cli(api_url, key, "memory", "add", "-", "--type", "fact", "--user", "u1",
                 "--pinned", "--observed-at", "2024-03-01T10:00:00+02:00", stdin="Ana lives "
                 "in Lisbon\n"))
    other = ok(await cli(api_url, key, "memory", "add", "Bo drinks green tea too",
                         "--type", "fact", "--user", "u2")).stdout.split()[0]
    await drain(settings, pool)

    found = ok(await cli(api_url, key, "memory", "search", "green tea", "--user", "u1"))
    lines = found.stdout.splitlines()
    assert memory_id in lines[0], found.stdout  # then Lisbon, found by meaning only
    assert re.match(r"^\d\.\d{3}  memory  \d{4}-\d\d-\d\d \d\d:\d\d  ", lines[0])
    assert lines[0].endswith("Ana prefers green tea")
    typed = ok(await cli(api_url, key, "memory", "search", "Ana", "--user", "u1",
                         "--type", "fact"))
    assert "Lisbon" in typed.stdout and "tea" not in typed.stdout
    assert "2024-03-01 08:00" in typed.stdout  # observed_at, in UTC

    shown = ok(await cli(api_url, key, "memory", "get", memory_id, "--user", "u1"))
    assert "Ana prefers green tea" in shown.stdout and "user u1, agent a1" in shown.stdout
    raw = json.loads(ok(await cli(api_url, key, "memory", "get", memory_id, "--user", "u1",
                                  "--json")).stdout)
    assert (raw["id"], raw["embedded"]) == (memory_id, True)
    assert raw["confidence"] == pytest.approx(0.9)

    stale = await cli(api_url, key, "memory", "invalidate", memory_id, "--reason", "x",
                      "--user", "u1", "--version", "7")
    assert stale.exit_code == 1 and "version 7 is stale" in stale.stderr, stale.output
    gone = ok(await cli(api_url, key, "memory", "invalidate", memory_id, "--user", "u1",
                        "--reason", "she switched to coffee", "--version", "1"))
    assert gone.stdout.startswith(memory_id) and "she switched to coffee" in gone.stdout
    valid = ok(await cli(api_url, key, "memory", "search", "green tea", "--user", "u1"))
    assert memory_id not in valid.stdout and "Lisbon" in valid.stdout
    empty = ok(await cli(api_url, key, "memory", "search", "tea", "--user", "u1", "--type",
                         "preference"))
    assert empty.stdout == "" and "no results" in empty.stderr
    kept = ok(await cli(api_url, key, "memory", "search", "green tea", "--user", "u1", "--all"))
    assert memory_id in kept.stdout and "valid until" in kept.stdout

    history = ok(await cli(api_url, key, "memory", "history", memory_id, "--user", "u1"))
    assert re.search(r"1 +│ add", history.stdout) and "invalidate" in history.stdout
    assert "she switched to coffee" in history.stdout
    entries = json.loads(ok(await cli(api_url, key, "memory", "history", memory_id,
                                      "--user", "u1", "--json")).stdout)["history"]
    assert [h["operation"] for h in entries] == ["add", "invalidate"]

    deleted = ok(await with_worker(settings, pool, cli(
        api_url, key, "memory", "delete", "--user", "u1", "--yes")))
    assert deleted.stdout.strip() == "deleted 2 memories of user u1 in 1 batch(es); 0 remaining"
    for query in ("green tea", "Lisbon"):
        after = ok(await cli(api_url, key, "memory", "search", query, "--user", "u1", "--all"))
        assert after.stdout == ""
    assert other in ok(await cli(api_url, key, "memory", "search", "tea", "--user", "u2")).stdout

    ok(await cli(api_url, key, "memory", "delete", other, "--user", "u2", "--version", "1"))
    missing = await cli(api_url, key, "memory", "get", other, "--user", "u2")
    assert missing.exit_code == 1 and f"no memory {other}" in missing.stderr


async def test_delete_by_scope_no_wait_json_and_the_prompt(
    api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = tenant[1]
    for text in ("Cy likes chess", "Cy likes go"):
        ok(await cli(api_url, key, "memory", "add", text, "--type", "fact", "--agent", "cy"))
    # Embedded first: the delete skips a row that an embedding holds locked (and reports it
    # as remaining), so a race with it would make this test flaky.
    await drain(settings, pool)
    started = ok(await cli(api_url, key, "memory", "delete", "--agent", "cy", "--yes",
                           "--no-wait"))
    op_id = started.stdout.strip()
    assert UUID.match(op_id)
    assert await pool.fetchval("SELECT kind FROM operations WHERE id = $1::uuid", op_id) == \
        "forget"
    await drain(settings, pool)
    assert await pool.fetchval("SELECT count(*) FROM memories") == 0

    monkeypatch.setattr(memory_cli, "_interactive", lambda: True)
    ok(await cli(api_url, key, "memory", "add", "Di likes tea", "--type", "fact",
                 "--user", "di"))
    await drain(settings, pool)
    declined = await cli(api_url, key, "memory", "delete", "--user", "di", stdin="n\n")
    assert declined.exit_code == 1 and "Delete every memory of user di?" in declined.stderr
    assert "nothing deleted" in declined.stderr
    assert await pool.fetchval("SELECT count(*) FROM operations WHERE kind = 'forget'") == 1
    confirmed = ok(await with_worker(settings, pool, cli(
        api_url, key, "memory", "delete", "--user", "di", "--json", stdin="y\n")))
    answer, _, printed = confirmed.stdout.partition("\n")  # CliRunner echoes the input
    assert answer.strip() == "y"
    op = json.loads(printed)
    assert op["status"] == "done" and op["result"]["deleted"] == 1 and op["result"]["verified"]


async def test_refusals_and_server_errors(
    api_url: str, tenant: tuple[int, str], pool: asyncpg.Pool
) -> None:
    key = tenant[1]
    unknown = await cli(api_url, key, "memory", "add", "x", "--type", "nonsense", "--user", "u")
    assert unknown.exit_code == 1 and unknown.stdout == ""
    assert unknown.stderr.startswith("error: type: unknown memory type 'nonsense'")
    bad_id = await cli(api_url, key, "memory", "get", "not-a-uuid")
    assert bad_id.exit_code == 1 and "memory_id" in bad_id.stderr

    # Refused by the CLI itself: nothing listens at `nowhere`, so a call would be exit 1.
    nowhere = f"http://127.0.0.1:{free_port()}"
    no_scope = await cli(nowhere, key, "memory", "delete", "--yes")
    assert no_scope.exit_code == 2 and "an empty scope would be every memory" in no_scope.stderr
    no_tty = await cli(nowhere, key, "memory", "delete", "--user", "u")
    assert no_tty.exit_code == 2, no_tty.output
    assert "refusing to delete every memory of user u without --yes" in no_tty.stderr
    both = await cli(nowhere, key, "memory", "delete", "abc", "--session", "s", "--yes")
    assert both.exit_code == 2 and "not both" in both.stderr
    assert await pool.fetchval("SELECT count(*) FROM operations") == 0
    unreachable = await cli(nowhere, key, "memory", "search", "x")
    assert unreachable.exit_code == 1 and "cannot reach" in unreachable.stderr


def turns(n: int, *, day: int = 8) -> list[dict[str, Any]]:
    speakers = ("Caroline", "Melanie")
    return [{"event_id": f"e{i}", "role": ("user", "assistant")[i % 2],
             "sender_name": speakers[i % 2], "created_at": f"2023-05-{day:02d}T13:{i:02d}:00Z",
             "content": f"Turn {i}: we talked about adoption agencies and hiking {i}."}
            for i in range(n)]


async def test_sessions_list_show_and_events_page_through(
    api_url: str, tenant: tuple[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tenant[1]
    async with http(api_url, key) as c:
        for session, n in (("s1", 5), ("s2", 1)):
            r = await c.post(f"/v1/sessions/{session}/events",
                             json={"scope": {"user_id": "u1"}, "events": turns(n)})
            assert r.status_code == 202, r.text

    listed = ok(await cli(api_url, key, "sessions", "list", "--user", "u1"))
    assert "s1" in listed.stdout and "s2" in listed.stdout
    assert ok(await cli(api_url, key, "sessions", "list", "--user", "u2")).stdout.count("s1") == 0
    page = json.loads(ok(await cli(api_url, key, "sessions", "list", "--user", "u1", "--limit",
                                   "1", "--json")).stdout)
    assert len(page["data"]) == 1 and page["next_cursor"]

    shown = ok(await cli(api_url, key, "sessions", "show", "s1", "--user", "u1"))
    assert re.search(r"events +5", shown.stdout), shown.stdout
    missing = await cli(api_url, key, "sessions", "show", "s1", "--user", "u2")
    assert missing.exit_code == 1 and "no session 's1'" in missing.stderr

    monkeypatch.setattr(memory_cli, "EVENTS_PAGE", 2)  # 5 events: three pages
    events = ok(await cli(api_url, key, "sessions", "events", "s1", "--user", "u1"))
    lines = events.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["[e0]", "[e1]", "[e2]", "[e3]", "[e4]"]
    assert lines[1] == ("[e1] 2023-05-08 13:01:00  assistant Melanie: Turn 1: we talked about "
                        "adoption agencies and hiking 1.")
    since = ok(await cli(api_url, key, "sessions", "events", "s1", "--user", "u1",
                         "--since", "2023-05-08T13:03:00Z"))
    assert [line.split()[0] for line in since.stdout.splitlines()] == ["[e3]", "[e4]"]
    limited = ok(await cli(api_url, key, "sessions", "events", "s1", "--user", "u1",
                           "--limit", "3"))
    assert len(limited.stdout.splitlines()) == 3 and "there are more" in limited.stderr
    raw = json.loads(ok(await cli(api_url, key, "sessions", "events", "s1", "--user", "u1",
                                  "--json")).stdout)
    assert [e["seq"] for e in raw["data"]] == sorted(e["seq"] for e in raw["data"])
    assert len(raw["data"]) == 5 and raw["next_cursor"] is None


async def test_search_finds_turns_with_events(
    api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool
) -> None:
    key = tenant[1]
    async with http(api_url, key) as c:
        r = await c.post("/v1/sessions/s1/events",
                         json={"scope": {"user_id": "u1"}, "events": turns(2)})
        assert r.status_code == 202, r.text
    await drain(settings, pool)
    found = ok(await cli(api_url, key, "memory", "search", "adoption agencies", "--user", "u1",
                         "--events", "--session", "s1"))
    assert "  event   2023-05-08 13:01  s1/e1  Melanie: Turn 1:" in found.stdout, found.stdout


async def test_context_prints_text_on_stdout_and_sections_on_stderr(
    api_url: str, tenant: tuple[int, str], settings: Settings, pool: asyncpg.Pool
) -> None:
    key = tenant[1]
    ok(await cli(api_url, key, "memory", "add", "Caroline is researching adoption agencies",
                 "--type", "fact", "--user", "u1", "--pinned"))
    async with http(api_url, key) as c:
        r = await c.post("/v1/sessions/s1/events",
                         json={"scope": {"user_id": "u1"}, "events": turns(4)})
        assert r.status_code == 202, r.text
        await drain(settings, pool)
        ask = {"scope": {"user_id": "u1"}, "session_id": "s1", "query": "adoption",
               "max_tokens": 300}
        expected = (await c.post("/v1/context", json=ask)).json()

    shown = ok(await cli(api_url, key, "context", "--user", "u1", "--session", "s1",
                         "--query", "adoption", "--max-tokens", "300"))
    assert shown.stdout == expected["context"] + "\n"
    assert "Caroline is researching adoption agencies" in shown.stdout
    for section in expected["sections"]:
        assert re.search(rf"{section['name']} +{section['tokens']} tokens", shown.stderr)
    assert f"{expected['tokens']} of 300 tokens" in shown.stderr
    assert "tokens" not in shown.stdout.replace(expected["context"], "")
    raw = json.loads(ok(await cli(api_url, key, "context", "--user", "u1", "--session", "s1",
                                  "--query", "adoption", "--max-tokens", "300",
                                  "--json")).stdout)
    assert raw["context"] == expected["context"]
    too_small = await cli(api_url, key, "context", "--user", "u1", "--max-tokens", "3")
    assert too_small.exit_code == 1 and "max_tokens" in too_small.stderr


async def test_the_groups_find_the_instance_of_a_data_directory(
    api_url: str, tenant: tuple[int, str], tmp_path: Path
) -> None:
    data = str(instance_dir(tmp_path / "instance", api_url, tenant[1]))
    env = {"MEMMILL_URL": None, "MEMMILL_API_KEY": None, "MEMMILL_DATA_DIR": None}
    for args in (("memory", "--data-dir", data, "add", "Eve likes figs", "--type", "fact",
                  "--user", "eve"),
                 ("memory", "search", "figs", "--user", "eve", "--data-dir", data),
                 ("sessions", "--data-dir", data, "list"),
                 ("context", "--user", "eve", "--query", "figs", "--data-dir", data)):
        result = await asyncio.to_thread(runner.invoke, app, list(args), env=env)
        assert result.exit_code == 0, (args, result.output)
    assert "Eve likes figs" in result.stdout
