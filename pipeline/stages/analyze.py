"""Split text into parts that fit the embedding model's window, keeping paragraphs whole where
they fit and overlapping a little where one paragraph must be cut."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class PartDraft:
    position: int
    text: str


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


def split_text(text: str, *, max_words: int, overlap_words: int) -> list[PartDraft]:
    """Greedily pack paragraphs into parts of at most `max_words` words."""
    pieces: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        if paragraph.strip():
            pieces.extend(_pieces(paragraph, max_words, overlap_words))
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
    return [PartDraft(position=i, text=t) for i, t in enumerate(parts)]
