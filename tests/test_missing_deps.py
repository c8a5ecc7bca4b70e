"""A missing optional package is not a crash: the jobs that need it fail permanently with a
message naming the package and the fix, and everything else works.

`sys.modules[name] = None` is what an uninstalled package looks like to `import` (it raises
ModuleNotFoundError); the database, the queue and the API are real, as everywhere."""

from __future__ import annotations

import io
import subprocess
import sys
import wave
from pathlib import Path

import asyncpg
import docx
import httpx
import pptx
import pytest
from PIL import Image, ImageDraw, ImageFont

from pipeline.errors import MissingDependency
from pipeline.formats import extract, optional, sniff
from pipeline.providers import ocr
from pipeline.settings import Settings
from tests.conftest import drain

REPO = Path(__file__).resolve().parent.parent


def scan_png(line: str) -> bytes:
    """A picture of a line of text: its words come only out of OCR."""
    image = Image.new("RGB", (1100, 200), "white")
    ImageDraw.Draw(image).text((50, 60), line, fill="black",
                               font=ImageFont.load_default(size=48))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def docx_bytes(text: str) -> bytes:
    document = docx.Document()
    document.add_paragraph(text)
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def pptx_bytes() -> bytes:
    buffer = io.BytesIO()
    pptx.Presentation().save(buffer)
    return buffer.getvalue()


def wav_bytes() -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(b"\0\0" * 8000)
    return buffer.getvalue()


async def _put_text(http: httpx.AsyncClient, item_id: str, content: str) -> None:
    r = await http.post("/v1/items", json={"id": item_id, "content": content})
    assert r.status_code == 202, r.text


async def _item(http: httpx.AsyncClient, item_id: str) -> dict:
    r = await http.get(f"/v1/items/{item_id}")
    assert r.status_code == 200, r.text
    return r.json()


async def _dead_letters(http: httpx.AsyncClient, kind: str) -> list[dict]:
    r = await http.get("/v1/dead-letters", params={"kind": kind})
    assert r.status_code == 200, r.text
    return r.json()["data"]


async def _text_still_works(http: httpx.AsyncClient, item_id: str, query: str) -> None:
    item = await _item(http, item_id)
    assert item["status"] == "ready", item
    r = await http.post("/v1/search", json={"query": query, "limit": 5})
    assert r.status_code == 200, r.text
    assert r.json()["warnings"] == []  # hybrid: the embedding model ran too
    assert r.json()["results"][0]["item"]["id"] == item_id


OCR_MESSAGE = ("OCR needs the package rapidocr-onnxruntime, which is not installed: "
               "run ./dev setup (or pip install rapidocr-onnxruntime)")


async def test_without_the_ocr_engine_a_scan_fails_for_good_and_text_still_works(
    http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)
    monkeypatch.setattr(ocr, "_engine", None)  # an engine another test loaded would hide it
    r = await http.post("/v1/items/upload",
                        files=[("file", ("scans/receipt.png", scan_png("Receipt 5150"),
                                         "image/png"))])
    assert r.status_code == 202, r.text
    await _put_text(http, "notes/tides", "Spring tides follow the new and the full moon.")
    await drain(settings, pool)

    (letter,) = await _dead_letters(http, "ocr")
    assert letter["item_id"] == "scans/receipt.png"
    assert letter["permanent"] is True and letter["attempts"] == 1
    assert OCR_MESSAGE in letter["reason"]
    scan = await _item(http, "scans/receipt.png")
    assert scan["status"] == "failed" and OCR_MESSAGE in scan["error"]
    # Extraction needed no OCR: the image is there, with its metadata, and nothing else died.
    assert scan["tags"]["_media_type"] == "image/png"
    assert {j["kind"]: j["status"] for j in scan["jobs"]}["regularize"] == "done"
    assert await _dead_letters(http, "regularize") == []
    await _text_still_works(http, "notes/tides", "when are spring tides")


async def test_without_python_docx_a_docx_fails_for_good_and_text_still_works(
    http: httpx.AsyncClient, settings: Settings, pool: asyncpg.Pool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = docx_bytes("The loom weaves flowers.")
    monkeypatch.setitem(sys.modules, "docx", None)
    r = await http.post("/v1/items/upload",
                        files=[("file", ("docs/loom.docx", data, "application/octet-stream"))])
    assert r.status_code == 202, r.text
    await _put_text(http, "notes/kettle", "Descale the kettle with citric acid.")
    await drain(settings, pool)

    message = ("DOCX extraction needs the package python-docx, which is not installed: "
               "run ./dev setup (or pip install python-docx)")
    (letter,) = await _dead_letters(http, "regularize")
    assert letter["permanent"] is True and message in letter["reason"]
    item = await _item(http, "docs/loom.docx")
    assert item["status"] == "failed" and message in item["error"]
    await _text_still_works(http, "notes/kettle", "descale kettle")


def _pdf() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (200, 100), "white").save(buffer, "PDF")
    return buffer.getvalue()


# Each place that imports an optional package, with the package blocked: (blocked module,
# the input, its media type, the package the message must name).
CASES = [
    ("pypdfium2", _pdf, "application/pdf", "PDF extraction", "pypdfium2"),
    ("docx", lambda: docx_bytes("x"),
     "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
     "DOCX extraction", "python-docx"),
    ("pptx", pptx_bytes,
     "application/vnd.openxmlformats-officedocument.presentationml.presentation",
     "PPTX extraction", "python-pptx"),
    ("PIL", lambda: scan_png("x"), "image/png", "image extraction", "pillow"),
    ("tinytag", wav_bytes, "audio/wav", "audio extraction", "tinytag"),
    ("trafilatura", lambda: b"<html><body><p>Hello</p></body></html>", "text/html",
     "HTML extraction", "trafilatura"),
    ("lxml_html_clean", lambda: b"<html><body><p>Hello</p></body></html>", "text/html",
     "HTML extraction", "lxml_html_clean"),
    ("charset_normalizer", lambda: "crème brûlée".encode("cp1252"), "text/plain",
     "encoding detection", "charset-normalizer"),
]


@pytest.mark.parametrize(("blocked", "make", "media_type", "what", "package"), CASES,
                         ids=[case[0] for case in CASES])
def test_each_format_names_its_missing_package(
    monkeypatch: pytest.MonkeyPatch, blocked: str, make, media_type: str, what: str,
    package: str,
) -> None:
    data = make()
    monkeypatch.setitem(sys.modules, blocked, None)
    with pytest.raises(MissingDependency) as caught:
        extract(data, media_type)
    assert str(caught.value) == (f"{what} needs the package {package}, which is not installed:"
                                 f" run ./dev setup (or pip install {package})")


def test_sniffing_and_ocr_name_their_missing_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    png = scan_png("x")
    monkeypatch.setitem(sys.modules, "filetype", None)
    with pytest.raises(MissingDependency, match=r"^file type detection needs the package "
                       r"filetype, which is not installed"):
        sniff(png, "x.png")
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)
    monkeypatch.setattr(ocr, "_engine", None)
    with pytest.raises(MissingDependency) as caught:
        ocr.ocr_image(png)
    assert str(caught.value) == OCR_MESSAGE


def test_a_package_that_is_there_but_cannot_load_says_so() -> None:
    broken = ModuleNotFoundError("No module named 'cv2'", name="cv2")
    assert optional.missing_message(optional.OCR, broken) == (
        "OCR needs the package rapidocr-onnxruntime, which is installed but cannot be imported "
        "(No module named 'cv2'): run ./dev setup to reinstall it")
    # A dependency that has a row of its own is named as the package to install.
    no_lxml = ModuleNotFoundError("No module named 'lxml'", name="lxml")
    assert optional.missing_message(optional.DOCX, no_lxml) == (
        "DOCX extraction needs the package lxml, which is not installed: "
        "run ./dev setup (or pip install lxml)")


def test_the_api_and_a_worker_start_without_any_optional_package() -> None:
    """Their start path imports none of them: a worker without the OCR engine (or without
    any format library) still runs every job that does not need one."""
    blocked = [entry.module for entry in optional.OPTIONAL] + ["cv2", "onnxruntime"]
    code = (f"import sys\nfor name in {blocked!r}: sys.modules[name] = None\n"
            "import api.main, workers.main\n"
            "from pipeline.settings import Settings\n"
            "workers.main.build_worker(Settings(redis_url='redis://127.0.0.1:1/0'))\n"
            "api.main.create_app(Settings())\n"
            "print('started')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "started"
