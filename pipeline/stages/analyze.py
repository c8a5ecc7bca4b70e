"""Split text into parts that fit the embedding model's window, keeping paragraphs whole where
they fit and overlapping a little where one paragraph must be cut.

Structure comes from the conventions of `pipeline.formats`: Markdown heading lines and form
feeds between pages (slides are `## Slide N` headings). A part never spans two pages or two
sections, so each one can say where it came from: its page and its heading path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
PAGE_BREAK = "\f"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class PartDraft:
    position: int
    text: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Section:
    page: int | None
    headings: list[str]
    pieces: list[str] = field(default_factory=list)

    @property
    def meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {}
        if self.page is not None:
            meta["page"] = self.page
        if self.headings:
            meta["headings"] = list(self.headings)
        return meta


def _windows(words: list[str], max_words: int, overlap_words: int) -> list[str]:
    step = max(max_words - overlap_words, 1)
    out = []
    for start in range(0, len(words), step):
        out.append(" ".join(words[start : start + max_words]))
        if start + max_words >= len(words):
            break
    return out


def _pieces(paragraph: str, max_words: int, overlap_words: int) -> list[str]:
    """A paragraph that is too long is cut at sentence ends, and a sentence that is still too
    long is cut into overlapping word windows."""
    words = paragraph.split()
    if len(words) <= max_words:
        return [" ".join(words)]
    pieces: list[str] = []
    current: list[str] = []
    for sentence in _SENTENCE_END.split(paragraph):
        sentence_words = sentence.split()
        if len(sentence_words) > max_words:
            if current:
                pieces.append(" ".join(current))
                current = []
            pieces.extend(_windows(sentence_words, max_words, overlap_words))
            continue
        if len(current) + len(sentence_words) > max_words:
            pieces.append(" ".join(current))
            current = current[-overlap_words:] if overlap_words else []
            # Overlap must never make the next piece overflow on its own.
            while current and len(current) + len(sentence_words) > max_words:
                current = current[1:]
        current.extend(sentence_words)
    if current:
        pieces.append(" ".join(current))
    return pieces


def _sections(text: str, max_words: int, overlap_words: int) -> list[_Section]:
    """Cut the text at pages and headings; each section holds its paragraphs' pieces."""
    pages = text.split(PAGE_BREAK)
    paged = len(pages) > 1
    sections: list[_Section] = []
    headings: list[str] = []
    for page_index, page in enumerate(pages):
        section = _Section(page_index + 1 if paged else None, list(headings))
        sections.append(section)
        for paragraph in _PARAGRAPH_BREAK.split(page):
            lines = paragraph.strip().splitlines()
            while lines and (match := _HEADING.match(lines[0].strip())):
                level, title = len(match.group(1)), match.group(2)
                headings = [*headings[: level - 1], title]
                section = _Section(section.page, list(headings), [lines[0].strip()])
                sections.append(section)
                lines = lines[1:]
            body = "\n".join(lines).strip()
            if body:
                section.pieces.extend(_pieces(body, max_words, overlap_words))
    return [s for s in sections if s.pieces]


def _pack(pieces: list[str], max_words: int) -> list[str]:
    parts: list[str] = []
    current = ""
    for piece in pieces:
        if current and len(current.split()) + len(piece.split()) <= max_words:
            current = f"{current}\n\n{piece}"
        else:
            if current:
                parts.append(current)
            current = piece
    if current:
        parts.append(current)
    return parts


def split_text(text: str, *, max_words: int, overlap_words: int) -> list[PartDraft]:
    """Greedily pack paragraphs into parts of at most `max_words` words, section by section."""
    drafts: list[PartDraft] = []
    for section in _sections(text, max_words, overlap_words):
        for part in _pack(section.pieces, max_words):
            drafts.append(PartDraft(position=len(drafts), text=part, meta=section.meta))
    return drafts
