"""The types every extractor shares: limits in, `Extracted` out, and the media type names.

Kept apart from `__init__` so the per-format modules can import them without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

PDF = "application/pdf"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
ZIP = "application/zip"
PLAIN = "text/plain"
MARKDOWN = "text/markdown"
HTML = "text/html"
OCTET = "application/octet-stream"

TEXT_TYPES = frozenset({PLAIN, MARKDOWN, HTML})
IMAGE_TYPES = frozenset(
    {"image/jpeg", "image/png", "image/webp", "image/tiff", "image/gif", "image/bmp"}
)
AUDIO_TYPES = frozenset(
    {"audio/mpeg", "audio/mp4", "audio/ogg", "audio/flac", "audio/wav", "audio/x-wav"}
)
SUPPORTED: frozenset[str] = TEXT_TYPES | IMAGE_TYPES | AUDIO_TYPES | {PDF, DOCX, PPTX}

# Other spellings of the same types, seen in Content-Type headers and in `filetype`'s answers.
ALIASES = {
    "image/jpg": "image/jpeg",
    "image/pjpeg": "image/jpeg",
    "image/x-ms-bmp": "image/bmp",
    "image/x-bmp": "image/bmp",
    "audio/mp3": "audio/mpeg",
    "audio/x-mp3": "audio/mpeg",
    "audio/x-m4a": "audio/mp4",
    "audio/m4a": "audio/mp4",
    "audio/x-flac": "audio/flac",
    "audio/wave": "audio/wav",
    "audio/vnd.wave": "audio/wav",
    "application/ogg": "audio/ogg",
    "application/xhtml+xml": "text/html",
    "text/x-markdown": "text/markdown",
}


def canonical(media_type: str | None) -> str | None:
    """`Text/HTML; charset=utf-8` -> `text/html`; aliases to the one name we use; None if blank."""
    if not media_type:
        return None
    name = media_type.split(";", 1)[0].strip().lower()
    return ALIASES.get(name, name) or None


@dataclass(frozen=True)
class ExtractLimits:
    """Bounds that keep a hostile or huge file from exhausting memory or time."""

    max_pages: int = 1000  # PDF pages / PPTX slides beyond this: PermanentError
    max_image_pixels: int = 50_000_000  # decompression-bomb guard for images (and OCR later)
    # Zip-bomb guard for DOCX/PPTX: the sum of uncompressed sizes; a member over 1 MB that
    # compresses more than 100:1 is refused too.
    max_unzipped_bytes: int = 200_000_000

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"ExtractLimits.{field.name} must be a positive int, not {value!r}"
                )


@dataclass(frozen=True)
class Extracted:
    """What a file holds, in the shape the splitter and the search index expect."""

    media_type: str  # e.g. "application/pdf"
    text: str  # normalized text; may be "" for metadata-only items
    title: str | None
    language: str | None  # e.g. "en"
    tags: dict[str, str]  # metadata as strings under plain keys: "author", "pages", ...
    ocr_pages: tuple[int, ...] = ()  # 0-based pages without a text layer; (0,) for an image
    kind: str = "document"  # "document", "image" or "audio"
