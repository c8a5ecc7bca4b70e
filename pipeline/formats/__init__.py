"""Sniff a file's type and extract its text and metadata.

Pure, synchronous functions (the caller runs them in a thread): no database, no network.
Every failure a retry cannot fix is a PermanentError whose message says what is wrong with
the file, so a person can act on it.

Typical use::

    media_type = sniff(data, filename, declared_content_type)
    extracted = extract(data, media_type, ExtractLimits(max_pages=settings.max_pages, ...))
"""

from __future__ import annotations

from collections.abc import Callable

from pipeline.errors import PermanentError
from pipeline.formats.html import extract_html
from pipeline.formats.media import extract_audio, extract_image
from pipeline.formats.model import (
    AUDIO_TYPES,
    DOCX,
    HTML,
    IMAGE_TYPES,
    MARKDOWN,
    OCTET,
    PDF,
    PLAIN,
    PPTX,
    SUPPORTED,
    Extracted,
    ExtractLimits,
    canonical,
)
from pipeline.formats.office import extract_docx, extract_pptx
from pipeline.formats.pdf import PDFIUM_LOCK, extract_pdf
from pipeline.formats.sniff import sniff
from pipeline.formats.text import extract_text

__all__ = [
    "PDFIUM_LOCK",
    "SUPPORTED",
    "ExtractLimits",
    "Extracted",
    "extract",
    "sniff",
]

_Extractor = Callable[[bytes, str, ExtractLimits], Extracted]


def _without_limits(extractor: Callable[[bytes, str], Extracted]) -> _Extractor:
    """Text, HTML and audio have no limit of their own: the upload size bounds them."""
    return lambda data, media_type, _limits: extractor(data, media_type)


_EXTRACTORS: dict[str, _Extractor] = {
    PLAIN: _without_limits(extract_text),
    MARKDOWN: _without_limits(extract_text),
    HTML: _without_limits(extract_html),
    PDF: extract_pdf,
    DOCX: extract_docx,
    PPTX: extract_pptx,
    **dict.fromkeys(IMAGE_TYPES, extract_image),
    **dict.fromkeys(AUDIO_TYPES, _without_limits(extract_audio)),
}


def extract(data: bytes, media_type: str, limits: ExtractLimits = ExtractLimits()) -> Extracted:
    """Text and metadata of `data`, read as `media_type` (pass what sniff() returned).

    Raises PermanentError for an empty file, an unsupported type, a corrupt or truncated
    file (including one whose bytes are not the type it claims), an encrypted PDF, or a file
    over one of `limits`.
    """
    if not data:
        raise PermanentError("the file is empty (0 bytes)")
    kind = canonical(media_type)
    extractor = _EXTRACTORS.get(kind or "")
    if kind is None or extractor is None:
        raise PermanentError(_unsupported_message(media_type))
    return extractor(data, kind, limits)


def _unsupported_message(media_type: str | None) -> str:
    supported = ", ".join(sorted(SUPPORTED))
    if canonical(media_type) in (None, OCTET):
        return (
            f"the file type was not recognized ({media_type or 'none given'}); "
            f"supported types: {supported}"
        )
    return f"unsupported file type {media_type!r}; supported types: {supported}"
