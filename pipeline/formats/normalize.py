"""One text convention for every format, because the splitter downstream relies on it.

Paragraphs are separated by one blank line, headings are Markdown `#` lines, PDF pages are
separated by one form feed each, and no control characters other than newline and form feed
survive.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_NEWLINES = re.compile(r"\r\n?|[\x0b\x85\u2028\u2029]")
# C0 and C1 controls except \t \n \f (handled apart), plus BOMs and non-characters.
_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f\ufeff\ufffe\uffff]")
_SPACES = re.compile(r"[ \t\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]+")
_BLANK_LINES = re.compile(r"\n{3,}")
MAX_TAG_CHARS = 500


def normalize_text(text: str) -> str:
    """Normalize each form-feed-separated page on its own, so the page count never changes."""
    return "\f".join(_normalize_page(page) for page in text.split("\f"))


def _normalize_page(text: str) -> str:
    text = _NEWLINES.sub("\n", text)
    text = _CONTROLS.sub("", text)
    text = _SPACES.sub(" ", text)
    text = "\n".join(line.strip() for line in text.split("\n"))
    return _BLANK_LINES.sub("\n\n", text).strip("\n")


def join_blocks(blocks: Iterable[str]) -> str:
    """Paragraph-like blocks -> one normalized text, one blank line between non-empty blocks."""
    kept = (normalize_text(block) for block in blocks)
    return "\n\n".join(block for block in kept if block)


def clean_tag(value: object) -> str:
    """A metadata value as one short line: metadata comes from the file and may hold anything."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = _SPACES.sub(" ", _CONTROLS.sub("", _NEWLINES.sub(" ", str(value)))).strip()
    return text.replace("\f", " ")[:MAX_TAG_CHARS]


def clean_tags(raw: Mapping[str, object]) -> dict[str, str]:
    """Cleaned tags without the empty ones (None, "", whitespace)."""
    tags = {key: clean_tag(value) for key, value in raw.items() if value is not None}
    return {key: value for key, value in tags.items() if value}
