"""Pairs of memories of one scope whose vectors are close: what merging and linking act on.

Exact, in blocks: a scope holds a user's or an agent's memories (thousands), where a matrix
product of a block of rows against the whole scope costs milliseconds and finds every pair,
which an approximate index over a million-memory tenant, filtered down to one scope, would
not. A scope larger than `MAX_SCOPE` is compared on its newest memories only, and says so."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

BLOCK = 1024
MAX_SCOPE = 50_000


@dataclass(frozen=True)
class Pair:
    """Row positions `a` < `b` in the scope's rows, and their cosine similarity."""

    a: int
    b: int
    similarity: float


def unit_rows(vectors: Sequence[Any]) -> np.ndarray:
    """Rows of unit length, from numpy arrays or pgvector's `Vector`s as asyncpg reads them."""
    matrix = np.stack([v.to_numpy() if hasattr(v, "to_numpy") else np.asarray(v)
                       for v in vectors]).astype(np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1, norms)


def scope_pairs(vectors: Sequence[Any], low: float, high: float = 1.01,
                per_row: int | None = None) -> list[Pair]:
    """`pairs` of a scope's vectors. Steps run it in a thread: a large scope takes seconds of
    CPU, which on the event loop would hold back the worker's other jobs and its leases."""
    return pairs(unit_rows(vectors), low, high, per_row)


def pairs(matrix: np.ndarray, low: float, high: float = 1.01,
          per_row: int | None = None) -> list[Pair]:
    """Every pair of rows with `low` <= cosine < `high`, best first. With `per_row`, each row
    keeps only its `per_row` most similar partners (a pair stays if either end keeps it), so
    a crowd of near neighbours cannot turn into a dense graph."""
    n = len(matrix)
    found: list[Pair] = []
    for start in range(0, n, BLOCK):
        block = matrix[start:start + BLOCK] @ matrix.T
        rows = np.arange(start, min(start + BLOCK, n))
        block[rows - start, rows] = -2.0  # a row is not its own pair
        if per_row is not None:
            keep = np.full(block.shape, False)
            allowed = np.where((block >= low) & (block < high), block, -2.0)
            k = min(per_row, n - 1)
            if k > 0:
                top = np.argpartition(-allowed, k - 1, axis=1)[:, :k]
                keep[np.arange(len(rows))[:, None], top] = True
            mask = keep & (allowed >= low)
        else:
            mask = (block >= low) & (block < high)
        for i, j in zip(*np.nonzero(mask), strict=True):
            a, b = int(rows[i]), int(j)
            found.append(Pair(min(a, b), max(a, b), float(block[i, j])))
    unique = {(p.a, p.b): p for p in found}
    return sorted(unique.values(), key=lambda p: (-p.similarity, p.a, p.b))


# Capitalised first words that do not name a subject.
_NOT_NAMES = frozenset({"a", "an", "the", "this", "that", "these", "those", "i", "we", "you",
    "they", "he", "she", "it", "my", "our", "your", "their", "his", "her", "its", "in", "on",
    "at", "for", "after", "before", "when", "while", "since", "during", "if", "as", "by", "with",
    "from", "to", "of", "and", "but", "or", "so", "then", "there", "here", "some", "any", "every",
    "each", "all", "no", "not", "one", "two", "session"})
_FIRST = re.compile(r"[^\W\d_][\w'-]*")


def subject(text: str) -> str | None:
    """The name a statement opens with ("Caroline went…", "Caroline: I went…"), lowercased;
    None when it opens otherwise (a pronoun, an article, a lowercase word)."""
    match = _FIRST.search(text)
    if match is None or match.start() > 2 or not match.group(0)[0].isupper():
        return None
    word = match.group(0).lower().removesuffix("'s")
    return None if word in _NOT_NAMES else word


def different_subjects(a: str, b: str) -> bool:
    """Two statements about two named people are two facts however alike their words: "Sam
    thanks Evan for his support" is not "Evan thanks Sam for his support", and one user's
    memory often holds what two people said (on LoCoMo such pairs were most of the wrong
    merges at the default similarity)."""
    first, second = subject(a), subject(b)
    return first is not None and second is not None and first != second
