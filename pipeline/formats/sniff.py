"""What a file is, from its bytes first: names and Content-Type headers are often wrong.

Order of trust: the bytes (PDF and ZIP signatures, `filetype`'s magic numbers, an HTML
prologue), then the file extension, then the declared Content-Type. Bytes that only say
"some zip" or "some text" are refined by the name or the header within that family.
"""

from __future__ import annotations

import codecs
import io
import mimetypes
import zipfile
from pathlib import PurePosixPath

from pipeline.formats import optional
from pipeline.formats.model import (
    DOCX,
    HTML,
    MARKDOWN,
    OCTET,
    PDF,
    PLAIN,
    PPTX,
    TEXT_TYPES,
    XLSX,
    ZIP,
    canonical,
)

_BY_EXTENSION = {
    ".pdf": PDF,
    ".docx": DOCX,
    ".pptx": PPTX,
    ".xlsx": XLSX,
    ".zip": ZIP,
    ".txt": PLAIN,
    ".text": PLAIN,
    ".md": MARKDOWN,
    ".markdown": MARKDOWN,
    ".html": HTML,
    ".htm": HTML,
    ".xhtml": HTML,
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".png": "image/png",
    ".webp": "image/webp",
    ".tif": "image/tiff",
    ".tiff": "image/tiff",
    ".gif": "image/gif",
    ".bmp": "image/bmp",
    ".mp3": "audio/mpeg",
    ".m4a": "audio/mp4",
    ".ogg": "audio/ogg",
    ".oga": "audio/ogg",
    ".opus": "audio/ogg",
    ".flac": "audio/flac",
    ".wav": "audio/wav",
}
_ZIP_FAMILY = frozenset({DOCX, PPTX, XLSX, ZIP})
_TEXT_BOMS = (codecs.BOM_UTF8, codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE, codecs.BOM_UTF16_LE,
              codecs.BOM_UTF16_BE)
_IGNORED_DECLARED = frozenset({OCTET, "binary/octet-stream", "application/unknown"})
# Enough of a text file to judge it; a multi-byte character cut at the end is allowed for.
_TEXT_PROBE = 64 * 1024
_PDF_WINDOW = 1024


def sniff(data: bytes, filename: str | None = None, declared: str | None = None) -> str:
    """The media type from the bytes first, then the file extension, then the declared
    Content-Type; "application/octet-stream" for anything unknown."""
    by_name = _from_name(filename)
    by_header = canonical(declared)
    if by_header in _IGNORED_DECLARED:
        by_header = None
    if not data:  # nothing to look at; extract() refuses it with a clear message anyway
        return by_name or by_header or OCTET
    if found := _from_bytes(data):
        return found
    if _is_zip(data):  # a zip we cannot look into (damaged) or of no kind we know
        return _within(_ZIP_FAMILY, by_name, by_header) or ZIP
    if _is_text(data):
        return _within(TEXT_TYPES, by_name, by_header) or PLAIN
    return by_name or by_header or OCTET


def _from_bytes(data: bytes) -> str | None:
    if _is_pdf(data):
        return PDF
    if _is_zip(data):
        return _office_kind(data)
    if _is_html(data):
        return HTML
    guess = optional.load(optional.FILE_TYPES).guess(data[:8192])
    if guess is not None and guess.mime != OCTET:
        return canonical(guess.mime)
    return None


def _is_pdf(data: bytes) -> bool:
    """%PDF- at the start, or after junk that is not text (readers skip up to 1 KB of it): a
    note that merely mentions "%PDF-1.7" near its top stays text."""
    at = data.find(b"%PDF-", 0, _PDF_WINDOW)
    if at < 0:
        return False
    junk = data[:at]
    return not junk.strip() or not _is_text(junk)


def _is_zip(data: bytes) -> bool:
    return data[:4] in (b"PK\x03\x04", b"PK\x05\x06")


def _office_kind(data: bytes) -> str | None:
    """DOCX, PPTX and XLSX are all zips; their member names tell them apart."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError):
        return None
    if "[Content_Types].xml" not in names:
        return None
    for prefix, media_type in (("word/", DOCX), ("ppt/", PPTX), ("xl/", XLSX)):
        if any(name.startswith(prefix) for name in names):
            return media_type
    return None


def _is_html(data: bytes) -> bool:
    head = data[:512].removeprefix(codecs.BOM_UTF8).lstrip(b" \t\r\n\f").lower()
    return head.startswith((b"<!doctype html", b"<html"))


def _is_text(data: bytes) -> bool:
    """UTF-8 without NUL bytes, or anything that starts with a Unicode byte order mark."""
    if data.startswith(_TEXT_BOMS):
        return True
    probe = data[:_TEXT_PROBE]
    if b"\x00" in probe:
        return False
    try:
        probe.decode("utf-8")
    except UnicodeDecodeError as err:
        # Only a character cut by the probe's end is fine: it must be in the last 3 bytes.
        return len(data) > _TEXT_PROBE and err.start >= len(probe) - 3
    return True


def _from_name(filename: str | None) -> str | None:
    if not filename:
        return None
    suffix = PurePosixPath(filename.replace("\\", "/")).suffix.lower()
    if not suffix:
        return None
    if suffix in _BY_EXTENSION:
        return _BY_EXTENSION[suffix]
    guessed, _ = mimetypes.guess_type(f"x{suffix}", strict=False)
    return canonical(guessed)


def _within(family: frozenset[str], *candidates: str | None) -> str | None:
    """The first candidate in `family`: a name that fits what the bytes say wins."""
    return next((c for c in candidates if c in family), None)
