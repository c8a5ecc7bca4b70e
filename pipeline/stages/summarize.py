"""The local extractive summarizer: no network, no model, good enough to tell documents apart.

Sentences are scored by how many of the document's recurring content words they carry
(a centroid score; a word found in one sentence only says nothing about the whole), with a
small bonus for coming early; the best are kept in document order. A sentence that shares
nothing with the rest is never added just because it fits.
"""

from __future__ import annotations

import math
import re
from collections import Counter

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD = re.compile(r"[^\W\d_]{3,}", re.UNICODE)
_STOPWORDS = frozenset(
    [
        "the",
        "and",
        "for",
        "are",
        "but",
        "not",
        "you",
        "all",
        "any",
        "can",
        "had",
        "her",
        "was",
        "one",
        "our",
        "out",
        "has",
        "have",
        "been",
        "were",
        "they",
        "this",
        "that",
        "with",
        "from",
        "there",
        "their",
        "what",
        "when",
        "which",
        "while",
        "will",
        "would",
        "about",
        "into",
        "than",
        "then",
        "them",
        "these",
        "those",
        "also",
        "more",
        "most",
        "such",
        "some",
        "other",
        "only",
        "over",
        "very",
        "just",
        "each",
        "its",
        "it's",
        "does",
        "did",
        "may",
        "might",
        "must",
        "shall",
        "should",
        "could",
        "upon",
        "where",
        "who",
        "whom",
        "whose",
        "why",
        "how",
        "our",
        "ours",
        "your",
        "yours",
    ]
)


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if len(s.strip()) > 1]


def _content_words(sentence: str) -> list[str]:
    return [w for w in (m.lower() for m in _WORD.findall(sentence)) if w not in _STOPWORDS]


def summarize(text: str, *, max_chars: int) -> str:
    text = text.strip()
    if len(text) <= max_chars:
        return text
    sentences = _sentences(text)
    if not sentences:
        return text[:max_chars].rstrip() + "…"
    frequencies = Counter(w for s in sentences for w in set(_content_words(s)))
    scored = []
    for index, sentence in enumerate(sentences):
        words = _content_words(sentence)
        if not words:
            continue
        centrality = sum(frequencies[w] - 1 for w in set(words)) / math.sqrt(len(words))
        position_bonus = 1.0 + 0.5 / (1 + index)
        scored.append((centrality * position_bonus, index))
    if not any(score for score, _ in scored):
        # Nothing recurs (a list, a very short text): the opening is the best guess.
        scored = [(1.0 / (1 + index), index) for _, index in scored]
    chosen: list[int] = []
    length = 0
    for score, index in sorted(scored, reverse=True):
        if score <= 0:
            break
        size = len(sentences[index]) + 1
        if length + size > max_chars:
            continue
        chosen.append(index)
        length += size
    if not chosen:
        return sentences[0][: max_chars - 1].rstrip() + "…"
    return " ".join(sentences[i] for i in sorted(chosen))
