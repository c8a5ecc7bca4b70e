"""Documents end to end: uploads, batches, URLs, scans through OCR, versions, and the ingest
command, over the real HTTP API with real workers, Postgres and Redis."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import asyncpg
import docx
import httpx
import pytest
from PIL import Image, ImageDraw, ImageFont

from pipeline.settings import Settings
from tests.conftest import drain

REPO = Path(__file__).resolve().parent.parent


def docx_bytes() -> bytes:
    document = docx.Document()
    document.core_properties.author = "Ada Lovelace"
    document.core_properties.title = "Engine notes"
    document.add_heading("Analytical engine", level=1)
    document.add_paragraph("The engine weaves algebraic patterns as the loom weaves flowers.")
    table = document.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text = "mill"
    table.rows[0].cells[1].text = "store"
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def scanned_pdf_bytes(lines: list[str]) -> bytes:
    """A PDF of one page that is only a picture of text: no text layer, as a scanner makes."""
    image = Image.new("RGB", (1400, 200 + 90 * len(lines)), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=56)
    for n, line in enumerate(lines):
        draw.text((60, 80 + 90 * n), line, fill="black", font=font)
    buffer = io.BytesIO()
    image.save(buffer, "PDF", resolution=150)
    return buffer.getvalue()


async def _item(http: httpx.AsyncClient, item_id: str, **params: Any) -> dict[str, Any]:
    r = await http.get(f"/v1/items/{item_id}", params=params)
    assert r.status_code == 200, r.text
    return r.json()


async def _search(http: httpx.AsyncClient, query: str, mode: str = "fts") -> list[str]:
    r = await http.post("/v1/search", json={"query": query, "mode": mode, "limit": 10})
    assert r.status_code == 200, r.text
    return [hit["item"]["id"] for hit in r.json()["results"]]


async def test_uploaded_files_are_extracted_split_and_searchable(
    http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool
) -> None:
    files = [
        ("file", ("docs/engine.docx", docx_bytes(), "application/octet-stream")),
        ("file", ("docs/readme.md", b"# Kettle\n\nDescale the kettle with citric acid.\n",
                  "text/markdown")),
    ]
    r = await http.post("/v1/items/upload", files=files, data={"tags": '{"team": "lab"}'})
    assert r.status_code == 202, r.text
    answer = r.json()
    assert answer["refused"] == []
    assert sorted(a["id"] for a in answer["accepted"]) == ["docs/engine.docx", "docs/readme.md"]
    await drain(settings, pool)

    engine = await _item(http, "docs/engine.docx")
    assert engine["status"] == "ready", engine
    assert engine["kind"] == "document"
    assert engine["title"] == "Engine notes"
    assert engine["tags"]["team"] == "lab"
    assert engine["tags"]["_author"] == "Ada Lovelace"
    assert engine["tags"]["_media_type"].endswith("wordprocessingml.document")
    assert {j["kind"] for j in engine["jobs"]} == {"regularize", "analyze", "summarize", "embed"}
    part = await pool.fetchrow("SELECT text, meta FROM parts WHERE item_id = 'docs/engine.docx'"
                               " ORDER BY position LIMIT 1")
    assert "algebraic patterns" in part["text"]
    assert part["meta"]["headings"] == ["Analytical engine"]
    assert "docs/engine.docx" in await _search(http, "algebraic loom")
    assert "docs/readme.md" in await _search(http, "descale kettle")

    # The same files again change nothing and create no jobs.
    again = (await http.post("/v1/items/upload", files=files,
                             data={"tags": '{"team": "lab"}'})).json()
    assert {a["change"] for a in again["accepted"]} == {"unchanged"}
    assert all(a["jobs"] == [] for a in again["accepted"])


async def test_a_scan_is_searchable_by_metadata_at_once_then_by_its_ocr_text(
    http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool
) -> None:
    pdf = scanned_pdf_bytes(["Invoice number 4821", "Seven hundred euros due"])
    r = await http.post("/v1/items/upload",
                        files=[("file", ("scans/invoice.pdf", pdf, "application/pdf"))])
    assert r.status_code == 202, r.text
    await drain(settings, pool)

    item = await _item(http, "scans/invoice.pdf")
    assert item["status"] == "ready", item
    kinds = [j["kind"] for j in item["jobs"]]
    assert kinds.count("ocr") == 1 and kinds.count("analyze") == 2  # before and after OCR
    text = await pool.fetchval("SELECT string_agg(text, ' ') FROM parts"
                               " WHERE item_id = 'scans/invoice.pdf'")
    assert "4821" in text and "invoice" in text.lower()
    assert "pending OCR" not in text
    assert "scans/invoice.pdf" in await _search(http, "invoice 4821")
    assert await pool.fetchval("SELECT count(*) FROM parts WHERE embedding IS NULL") == 0


async def test_a_corrupt_file_fails_with_its_reason_and_writes_no_parts(
    http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool
) -> None:
    truncated = scanned_pdf_bytes(["whatever"])[:200]
    r = await http.post("/v1/items/upload",
                        files=[("file", ("bad.pdf", truncated, "application/pdf"))])
    assert r.status_code == 202, r.text
    await drain(settings, pool)
    item = await _item(http, "bad.pdf")
    assert item["status"] == "failed"
    assert "regularize" in item["error"] and "PDF" in item["error"]
    assert await pool.fetchval("SELECT count(*) FROM parts") == 0
    letter = (await http.get("/v1/dead-letters")).json()["data"][0]
    assert letter["kind"] == "regularize" and letter["permanent"] is True


async def test_batch_accepts_the_valid_entries_and_says_why_it_refused_the_others(
    http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool
) -> None:
    entries = [
        {"id": "b/ok", "content": "A valid note about tides and the moon."},
        {"id": "b/empty", "content": "   "},
        {"id": "b/both", "content": "text", "uri": "https://example.com/"},
        {"id": "b/ftp", "uri": "ftp://example.com/file"},
        {"content": "no id"},
        {"id": "b/typo", "contnet": "misspelled field"},
        "not an object",
        {"id": "b/ok", "content": "the same id again"},
        {"id": "b/ok2", "content": "Another valid note, about rivers.", "tags": {"k": "v"}},
    ]
    r = await http.post("/v1/items/batch", json={"items": entries})
    assert r.status_code == 202, r.text
    answer = r.json()
    assert [a["index"] for a in answer["accepted"]] == [0, 8]
    refused = {x["index"]: x["error"] for x in answer["refused"]}
    assert set(refused) == {1, 2, 3, 4, 5, 6, 7}
    assert "empty" in refused[1]
    assert "exactly one of" in refused[2]
    assert "http" in refused[3]
    assert "id" in refused[4]
    assert "contnet" in refused[5]
    assert "object" in refused[6]
    assert "more than once" in refused[7]
    ids = {r["id"] for r in await pool.fetch("SELECT id FROM items")}
    assert ids == {"b/ok", "b/ok2"}

    too_many = [{"id": f"n{i}", "content": "x"} for i in range(settings.max_batch_items + 1)]
    r = await http.post("/v1/items/batch", json={"items": too_many})
    assert r.status_code == 422 and "at most" in r.json()["detail"]
    assert await pool.fetchval("SELECT count(*) FROM items") == 2


async def test_versions_by_offset_list_revert_and_purge(
    http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool
) -> None:
    async def put(content: str, tags: dict[str, str]) -> dict[str, Any]:
        r = await http.post("/v1/items", json={"id": "v/doc", "content": content, "tags": tags})
        assert r.status_code == 202, r.text
        return r.json()

    await put("First text about glaciers.", {"t": "1"})
    await drain(settings, pool)
    await put("Second text about deserts.", {"t": "1"})
    await drain(settings, pool)
    tags_only = await put("Second text about deserts.", {"t": "2"})
    assert tags_only["change"] == "metadata" and tags_only["jobs"] == []

    listed = (await http.get("/v1/item-versions/v/doc")).json()
    assert [(v["offset"], v["version"], v["tags"]) for v in listed] == [
        (0, 3, {"t": "2"}), (1, 2, {"t": "1"}), (2, 1, {"t": "1"})]
    previous = await _item(http, "v/doc", version=2)
    assert previous["version"] == 1 and previous["status"] == "archived"
    r = await http.get("/v1/items/v/doc", params={"version": 3})
    assert r.status_code == 404 and "offset 3" in r.json()["detail"]
    r = await http.get("/v1/items/v/doc", params={"version": -1})
    assert r.status_code == 422

    # Reverting the tags-only version needs no work; reverting the content re-processes v1.
    r = (await http.delete("/v1/items/v/doc")).json()
    assert (r["outcome"], r["version"], r["jobs"]) == ("reverted", 2, [])
    r = (await http.delete("/v1/items/v/doc")).json()
    assert (r["outcome"], r["version"]) == ("reverted", 1)
    assert {j["kind"] for j in r["jobs"]} == {"analyze", "summarize", "embed"}
    await drain(settings, pool)
    assert await _search(http, "glaciers") == ["v/doc"]
    assert await _search(http, "deserts") == []

    r = (await http.delete("/v1/items/v/doc", params={"purge": "true"})).json()
    assert r["outcome"] == "deleted"
    assert (await http.get("/v1/items/v/doc")).status_code == 404
    for table in ("items", "item_versions", "sources", "parts"):
        assert await pool.fetchval(f"SELECT count(*) FROM {table}") == 0, table


class _Site(BaseHTTPRequestHandler):
    pages: ClassVar[dict[str, tuple[str, bytes]]] = {
        "/article": ("text/html; charset=utf-8",
                     b"<html lang='en'><head><title>Otters</title></head><body><nav>Home | About"
                     b"</nav><article><h1>Sea otters</h1><p>Sea otters hold hands while they"
                     b" sleep so that they do not drift apart. They use stones as tools to open"
                     b" shellfish, and keep a favourite stone in a pouch of skin.</p><p>Otters"
                     b" have the densest fur of any animal, with up to a million hairs per"
                     b" square inch.</p></article><footer>Copyright</footer></body></html>"),
    }

    def do_GET(self) -> None:
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/article")
            self.end_headers()
            return
        found = self.pages.get(self.path)
        if found is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", found[0])
        self.send_header("Content-Length", str(len(found[1])))
        self.end_headers()
        self.wfile.write(found[1])

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


async def test_urls_are_fetched_with_the_ssrf_guard(
    http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool, site: str
) -> None:
    for item_id in ("web/otters", "web/missing"):
        path = "/moved" if item_id == "web/otters" else "/nowhere"
        r = await http.post("/v1/items", json={"id": item_id, "uri": f"{site}{path}"})
        assert r.status_code == 202, r.text
    # The site is on loopback: refused by default, so both fail with the reason.
    await drain(settings, pool)
    refused = await _item(http, "web/otters")
    assert refused["status"] == "failed" and "loopback" in refused["error"], refused

    allowed = settings.model_copy(update={"fetch_allow": ["127.0.0.1"]})
    r = await http.post("/v1/dead-letters/replay", json={})
    assert r.json()["replayed"] == 2
    await drain(allowed, pool)
    otters = await _item(http, "web/otters")
    assert otters["status"] == "ready", otters
    assert otters["title"] == "Otters"
    assert otters["tags"]["_language"] == "en"
    text = await pool.fetchval("SELECT string_agg(text, ' ') FROM parts WHERE item_id = $1",
                               "web/otters")
    assert "densest fur" in text and "Home | About" not in text and "Copyright" not in text
    missing = await _item(http, "web/missing")
    assert missing["status"] == "failed" and "404" in missing["error"]


def _cli(settings: Settings, api_url: str, key: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMMILL_")}
    env.update(MEMMILL_URL=api_url, MEMMILL_API_KEY=key, MEMMILL_DATA_DIR=str(settings.data_dir),
               COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "memmill", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)


async def test_ingest_sends_only_what_changed_and_explains_failures(
    api_url: str, settings: Settings, pool: asyncpg.Pool, tenant: tuple[int, str],
    tmp_path: Path,
) -> None:
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("Alpine lakes freeze from the top down in winter.")
    (folder / "sub" / "b.md").write_text("# Bees\n\nBees dance to show where flowers are.")
    (folder / "sub" / "engine.docx").write_bytes(docx_bytes())
    (folder / ".env").write_text("SECRET=1")
    (folder / "id_rsa").write_text("-----BEGIN KEY-----")
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text("[core]")
    (folder / "broken.pdf").write_bytes(b"%PDF-1.7\n garbage")
    dump = tmp_path / "notes.jsonl"
    dump.write_text("\n".join(json.dumps(x) for x in [
        {"id": "j1", "text": "Jellyfish have no brain.", "tags": {"src": "dump"}},
        {"id": "j2", "text": "Jupiter has a great red spot."},
        {"id": "j3"},
    ]) + "\n")

    def run(*args: str) -> subprocess.CompletedProcess:
        return _cli(settings, api_url, tenant[1], "ingest", *args)

    worker = asyncio.create_task(_keep_draining(settings, pool))
    try:
        first = await asyncio.to_thread(run, str(folder), str(dump), "--wait", "--timeout", "240")
    finally:
        worker.cancel()
    out = first.stdout + first.stderr
    assert first.returncode == 1, out
    assert "broken.pdf" in out and "corrupt" in out.lower()
    assert 'neither "text" nor "uri"' in out
    ids = {r["id"] for r in await pool.fetch("SELECT id FROM items")}
    assert ids == {"a.txt", "sub/b.md", "sub/engine.docx", "broken.pdf", "j1", "j2"}
    statuses = dict(await pool.fetch("SELECT id, status FROM items"))
    assert statuses.pop("broken.pdf") == "failed"
    assert set(statuses.values()) == {"ready"}

    jobs_before = await pool.fetchval("SELECT count(*) FROM jobs")
    (folder / "a.txt").write_text("Alpine lakes freeze from the top down; the ice insulates.")
    second = await asyncio.to_thread(run, str(folder), str(dump))
    out = second.stdout + second.stderr
    assert second.returncode == 1, out  # broken.pdf is still failed, and says so
    summary = out[out.index("memmill ingest"):]
    assert "│ 7 " in summary or " 7 " in summary  # found: 5 files and 2 good JSONL lines
    new_jobs = await pool.fetch("SELECT DISTINCT item_id FROM jobs WHERE created_at >"
                                " (SELECT max(created_at) FROM jobs WHERE item_id = 'j2')")
    assert {r["item_id"] for r in new_jobs} == {"a.txt"}
    assert await pool.fetchval("SELECT count(*) FROM jobs") == jobs_before + 4  # a file: 4 jobs


async def _keep_draining(settings: Settings, pool: asyncpg.Pool) -> None:
    while True:
        await drain(settings, pool)
        await asyncio.sleep(0.2)


async def test_bad_uploads_and_lookups_are_4xx_and_write_nothing(
    http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool
) -> None:
    ok = ("file", ("ok.txt", b"Some text.", "text/plain"))
    cases: list[tuple[str, dict[str, Any], int, str]] = [
        ("not multipart", {"json": {"file": "x"}}, 422, "multipart/form-data"),
        ("no files", {"files": {"prefix": (None, "p/")}}, 422, "no files"),
        ("unknown field", {"files": [ok], "data": {"colour": "red"}}, 422, "unknown form fields"),
        ("tags not JSON", {"files": [ok], "data": {"tags": "{oops"}}, 422, "JSON object"),
        ("tags not strings", {"files": [ok], "data": {"tags": '{"n": 1}'}}, 422, "strings"),
    ]
    for name, request, status, words in cases:
        r = await http.post("/v1/items/upload", **request)
        assert r.status_code == status, (name, r.text)
        assert words in r.json()["detail"], (name, r.text)

    # A file over the per-file limit (but within the request limit) and an empty one are each
    # refused by index, and the request as a whole still answers.
    big = b"x" * (settings.max_upload_bytes + 1)
    r = await http.post("/v1/items/upload", files=[
        ("file", ("big.txt", big, "text/plain")), ("file", ("empty.txt", b"", "text/plain"))])
    assert r.status_code == 202, r.text
    assert r.json()["accepted"] == []
    refused = {x["id"]: (x["status"], x["error"]) for x in r.json()["refused"]}
    assert refused["big.txt"][0] == 413 and "MEMMILL_MAX_UPLOAD_BYTES" in refused["big.txt"][1]
    assert refused["empty.txt"][0] == 422 and "empty" in refused["empty.txt"][1]

    r = await http.post("/v1/items/lookup", json={"ids": [f"i{n}" for n in range(1001)]})
    assert r.status_code == 422
    r = await http.delete("/v1/items/nothing/here")
    assert r.status_code == 404 and "nothing/here" in r.json()["detail"]
    r = await http.get("/v1/item-versions/nothing/here")
    assert r.status_code == 404
    for table in ("items", "sources", "jobs"):
        assert await pool.fetchval(f"SELECT count(*) FROM {table}") == 0, table
