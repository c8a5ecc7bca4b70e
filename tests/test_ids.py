"""Item ids that look like URL syntax (`%`, `/`, `?`, `#`, dot segments, a `/versions`
suffix), unicode and long ids reach exactly their own item: over raw HTTP with explicitly
encoded URLs, and through the CLI against the real API."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import httpx
from typer.testing import CliRunner, Result

from memmill.cli import app, split_version
from memmill.client import calls

LONG = "é" * 256  # 256 characters, 512 bytes of UTF-8
# Each nasty id with its path segment written out by hand, so the tests do not trust the
# client's encoder to check the server (and check the encoder against them).
NASTY = {
    "a%41b": "a%2541b",
    "a/b": "a%2Fb",
    "q?x=1#f": "q%3Fx%3D1%23f",
    "..": "%2E%2E",
    ".": "%2E",
    "../../etc/passwd": "..%2F..%2Fetc%2Fpasswd",
    "doc/versions": "doc%2Fversions",
    "naïve/😀 日本": "na%C3%AFve%2F%F0%9F%98%80%20%E6%97%A5%E6%9C%AC",
    LONG: "%C3%A9" * 256,
    "100% + [b]bold[/b]": "100%25%20%2B%20%5Bb%5Dbold%5B%2Fb%5D",
    "lookup": "lookup",
    "trailing/": "trailing%2F",
}
# Items a wrong decoding would hit instead: `a%41b` read as `aAb`, `doc/versions` as the
# versions of `doc`, `..` resolved to a parent path.
DECOYS = ("aAb", "doc", "a", "etc/passwd")


def test_the_client_encodes_each_id_as_one_segment() -> None:
    assert {item_id: calls.segment(item_id) for item_id in NASTY} == NASTY


async def test_nasty_ids_round_trip_over_http(
    api_url: str, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    async with httpx.AsyncClient(base_url=api_url,
                                 headers={"Authorization": f"Bearer {tenant[1]}"}) as http:
        for decoy in DECOYS:
            assert (await http.post("/v1/items", json={"id": decoy, "content": "decoy"})
                    ).status_code == 202
        for item_id in NASTY:
            for text in ("First words.", "Second words."):
                r = await http.post("/v1/items", json={"id": item_id, "content": text})
                assert r.status_code == 202, (item_id, r.text)
        stored = {r["id"] for r in await pool.fetch("SELECT id FROM items")}
        assert stored == set(NASTY) | set(DECOYS)
        for item_id, segment in NASTY.items():
            await _round_trip_http(http, item_id, segment)
        # Unencoded, the slash is still part of the id: no route reads a `/versions` suffix.
        r = await http.get("/v1/items/doc/versions")
        assert r.status_code == 404 and "doc/versions" in r.json()["detail"]
        assert [v["offset"] for v in (await http.get("/v1/item-versions/doc")).json()] == [0]
        r = await http.post("/v1/items", json={"id": "x" * 513, "content": "too long"})
        assert r.status_code == 422 and "512" in r.json()["detail"]
    left = {r["id"]: r["version"] for r in await pool.fetch("SELECT id, version FROM items")}
    assert left == dict.fromkeys(DECOYS, 1)


async def _round_trip_http(http: httpx.AsyncClient, item_id: str, segment: str) -> None:
    """Read, list, revert and delete one item by its encoded segment."""
    item = await _ok(http.get(f"/v1/items/{segment}"), item_id)
    assert (item["id"], item["version"]) == (item_id, 2)
    previous = await _ok(http.get(f"/v1/items/{segment}?version=1"), item_id)
    assert (previous["id"], previous["version"], previous["status"]) == (item_id, 1, "archived")
    listed = await _ok(http.get(f"/v1/item-versions/{segment}"), item_id)
    assert [(v["offset"], v["version"]) for v in listed] == [(0, 2), (1, 1)], item_id
    reverted = await _ok(http.delete(f"/v1/items/{segment}"), item_id)
    assert (reverted["id"], reverted["outcome"], reverted["version"]) == (item_id, "reverted", 1)
    deleted = await _ok(http.delete(f"/v1/items/{segment}?purge=true"), item_id)
    assert (deleted["id"], deleted["outcome"]) == (item_id, "deleted")
    r = await http.get(f"/v1/items/{segment}")
    assert r.status_code == 404, (item_id, r.text)


async def _ok(request: Any, item_id: str) -> Any:
    r = await request
    assert r.status_code == 200, (item_id, r.status_code, r.text)
    return r.json()


async def test_openapi_names_one_path_per_resource(api_url: str) -> None:
    async with httpx.AsyncClient(base_url=api_url) as http:
        paths = (await http.get("/openapi.json")).json()["paths"]
    assert set(paths["/v1/items/{item_id}"]) == {"get", "delete"}
    assert set(paths["/v1/item-versions/{item_id}"]) == {"get"}
    assert not [p for p in paths if p.endswith("/versions")]


runner = CliRunner()


async def memmill(api_url: str, key: str, *args: str) -> Result:
    """The CLI in this process, in a thread: the API answers from this test's event loop."""
    env = {"MEMMILL_URL": None, "MEMMILL_API_KEY": None, "MEMMILL_DATA_DIR": None,
           "COLUMNS": "200"}
    return await asyncio.to_thread(
        runner.invoke, app, [*args, "--url", api_url, "--key", key], env=env)


async def test_nasty_ids_round_trip_through_the_cli(
    api_url: str, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    async def cli(*args: str, code: int = 0) -> str:
        result = await memmill(api_url, tenant[1], *args)
        assert result.exit_code == code, (args, result.output, result.exception)
        return result.output

    for decoy in DECOYS:
        await cli("put", "A decoy that must survive.", "--id", decoy)
    for item_id in NASTY:
        assert f"{item_id}  v1  pending  (created)" in await cli(
            "put", "First words of the nasty one.", "--id", item_id)
        await cli("put", "Second words of the nasty one.", "--id", item_id)
    stored = {r["id"] for r in await pool.fetch("SELECT id FROM items")}
    assert stored == set(NASTY) | set(DECOYS)
    for item_id in NASTY:
        current = json.loads(await cli("get", item_id))
        assert (current["id"], current["version"]) == (item_id, 2)
        previous = json.loads(await cli("get", f"{item_id}@V1"))
        assert (previous["id"], previous["version"]) == (item_id, 1)
        table = await cli("versions", item_id)
        assert "@V0" in table and "@V1" in table and "@V2" not in table
        assert f"{item_id}  reverted to v1" in await cli("delete", item_id)
        assert f"{item_id}  deleted" in await cli("delete", item_id, "--purge")
        assert "no item" in await cli("get", item_id, code=1)
    left = {r["id"]: r["version"] for r in await pool.fetch("SELECT id, version FROM items")}
    assert left == dict.fromkeys(DECOYS, 1)


async def test_an_id_that_ends_in_a_version_suffix(
    api_url: str, pool: asyncpg.Pool, tenant: tuple[int, str]
) -> None:
    """`get` reads only the last `@V<n>`: `x@V1@V0` (or `--version`) reaches the item `x@V1`,
    while `x@V1` is the previous version of `x`. The other commands take ids as they are."""
    async def cli(*args: str) -> dict[str, Any]:
        result = await memmill(api_url, tenant[1], *args)
        assert result.exit_code == 0, (args, result.output, result.exception)
        return json.loads(result.output) if args[0] == "get" else {}

    for item_id in ("x", "x@V1"):
        for text in ("One text.", "Another text."):
            await cli("put", text, "--id", item_id)
    assert split_version("x@V1@V0") == ("x@V1", 0)
    got = await cli("get", "x@V1")
    assert (got["id"], got["version"]) == ("x", 1)
    got = await cli("get", "x@V1@V0")
    assert (got["id"], got["version"]) == ("x@V1", 2)
    got = await cli("get", "x@V1@V1")
    assert (got["id"], got["version"]) == ("x@V1", 1)
    got = await cli("get", "x@V1", "--version", "1")
    assert (got["id"], got["version"]) == ("x@V1", 1)
    got = await cli("get", "x@V1", "--version", "0")
    assert (got["id"], got["version"]) == ("x@V1", 2)
    await cli("delete", "x@V1", "--purge")
    assert {r["id"] for r in await pool.fetch("SELECT id FROM items")} == {"x"}
