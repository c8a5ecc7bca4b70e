"""Plain text and Markdown: decode whatever the encoding, normalize, find a Markdown title."""

from __future__ import annotations

import codecs
import re

from pipeline.errors import PermanentError
from pipeline.formats import optional
from pipeline.formats.model import MARKDOWN, Extracted
from pipeline.formats.normalize import normalize_text

# Longest first: the UTF-32 LE mark starts with the UTF-16 LE one.
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
# How much worse than the top pick Windows-1252 may be rated and still win (see _guess_legacy):
# enough for French, German and Spanish samples, not enough to take Turkish (cp1254) text.
_COHERENCE_SLACK = 0.05
_CHAOS_SLACK = 0.1
_H1 = re.compile(r"^#[ \t]+(.+?)[ \t#]*$", re.MULTILINE)


def decode_text(data: bytes, declared_charset: str | None = None) -> str:
    """A byte order mark wins, then a charset the file declares itself (HTML meta), then
    strict UTF-8, then charset_normalizer's best guess for legacy encodings."""
    for bom, codec in _BOMS:
        if data.startswith(bom):
            return data[len(bom) :].decode(codec, errors="replace")
    if declared_charset:
        try:
            return data.decode(declared_charset, errors="replace")
        except LookupError:  # unknown, or not a text encoding ("base64")
            pass
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    return _guess_legacy(data)


def _guess_legacy(data: bytes) -> str:
    """charset_normalizer's pick, except that Windows-1252 wins when it is rated about as
    well: it is by far the most common legacy encoding, and on short Western European texts
    the detector often ranks a Baltic or Central European code page a hair higher
    ("crème" read as "crčme")."""
    charset_normalizer = optional.load(optional.ENCODINGS)  # UTF-8 text never needs it
    matches = list(charset_normalizer.from_bytes(data))
    if not matches:
        raise PermanentError(
            "the file is not readable text: no character encoding fits its bytes"
        )
    best = matches[0]
    western = next(
        (
            match
            for match in matches
            if "cp1252" in match.could_be_from_charset
            and match.coherence >= best.coherence - _COHERENCE_SLACK
            and match.chaos <= best.chaos + _CHAOS_SLACK
        ),
        None,
    )
    return str(western or best)


def markdown_title(text: str) -> str | None:
    """The first level-1 ATX heading (`# Title`), the usual title of a Markdown note."""
    match = _H1.search(text)
    return match.group(1).strip() if match else None


def extract_text(data: bytes, media_type: str) -> Extracted:
    text = normalize_text(decode_text(data))
    title = markdown_title(text) if media_type == MARKDOWN else None
    return Extracted(media_type=media_type, text=text, title=title, language=None, tags={})
