"""DOCX and PPTX: text in reading order with headings, tables and slide notes.

Both are zip containers, so the zip-bomb guard runs on the central directory first.
python-docx and python-pptx are imported by the first job that reads such a file (see
`optional`): a worker without them still starts and handles every other type.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pipeline.formats import optional
from pipeline.formats.guards import check_count, check_zip, corrupt_as_permanent
from pipeline.formats.model import Extracted, ExtractLimits
from pipeline.formats.normalize import clean_tag, clean_tags, join_blocks

if TYPE_CHECKING:
    from docx.table import Table as DocxTable
    from docx.text.paragraph import Paragraph

_HEADING_STYLE = re.compile(r"^heading (\d)$", re.IGNORECASE)
# PowerPoint stamps this on every new deck; it is never the real title.
_PLACEHOLDER_TITLES = frozenset({"PowerPoint Presentation"})


def extract_docx(data: bytes, media_type: str, limits: ExtractLimits) -> Extracted:
    check_zip(data, limits, "DOCX file")
    docx = optional.load(optional.DOCX)
    with corrupt_as_permanent("DOCX file"):
        document = docx.Document(io.BytesIO(data))
        blocks = [_docx_block(item) for item in document.iter_inner_content()]
        tags = clean_tags(_core_tags(document.core_properties))
    text = join_blocks(blocks)
    return Extracted(
        media_type=media_type,
        text=text,
        title=tags.get("title") or _first_heading(text),
        language=None,
        tags=tags,
    )


def _docx_block(item: Paragraph | DocxTable) -> str:
    from docx.table import Table as DocxTable  # loaded by extract_docx already

    if isinstance(item, DocxTable):
        return _table_text(row.cells for row in item.rows)
    return _paragraph_text(item)


def _paragraph_text(paragraph: Paragraph) -> str:
    """Heading 1..3 (and Title) styles become `#`..`###`; deeper headings stay at `###`."""
    text = paragraph.text.replace("\n", " ").strip()
    if not text:
        return ""
    style = (paragraph.style.name if paragraph.style is not None else None) or ""
    if style == "Title":
        return f"# {text}"
    if match := _HEADING_STYLE.match(style):
        return "#" * min(max(int(match.group(1)), 1), 3) + " " + text
    if style.startswith("List"):
        return f"- {text}"
    return text


def _table_text(rows: Iterable[Iterable[Any]]) -> str:
    """One row per line, cells joined by " | ". A cell spanning several columns is the same
    object repeated in python-docx's row, so it is written once."""
    lines = []
    for row in rows:
        cells: list[Any] = []
        for cell in row:
            if not cells or cell is not cells[-1]:
                cells.append(cell)
        texts = [" ".join(cell.text.split()) for cell in cells]
        if any(texts):
            lines.append(" | ".join(texts))
    return "\n".join(lines)


def _first_heading(text: str) -> str | None:
    for line in text.split("\n"):
        if line.startswith("# "):
            return line[2:].strip() or None
    return None


def extract_pptx(data: bytes, media_type: str, limits: ExtractLimits) -> Extracted:
    check_zip(data, limits, "PPTX file")
    pptx = optional.load(optional.PPTX)
    with corrupt_as_permanent("PPTX file"):
        presentation = pptx.Presentation(io.BytesIO(data))
        slides = list(presentation.slides)
        check_count("presentation", "slides", len(slides), limits.max_pages, "max_pages")
        slide_texts = [_slide_text(number, slide) for number, slide in enumerate(slides, 1)]
        tags = clean_tags(_core_tags(presentation.core_properties))
    if tags.get("title") in _PLACEHOLDER_TITLES:
        del tags["title"]
    tags["slides"] = str(len(slides))
    return Extracted(
        media_type=media_type,
        text="\n\n".join(text for text, _ in slide_texts),
        title=tags.get("title") or next((title for _, title in slide_texts if title), None),
        language=None,
        tags=tags,
    )


def _slide_text(number: int, slide: Any) -> tuple[str, str | None]:
    """`## Slide N: <title>`, then text boxes and tables in reading order, then notes."""
    title_shape = slide.shapes.title
    title = clean_tag(title_shape.text_frame.text) if title_shape is not None else ""
    title_id = title_shape.shape_id if title_shape is not None else None
    heading = f"## Slide {number}: {title}" if title else f"## Slide {number}"
    shapes = [shape for shape in slide.shapes if shape.shape_id != title_id]
    blocks = [block for shape in _reading_order(shapes) for block in _shape_blocks(shape)]
    if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
        notes = slide.notes_slide.notes_text_frame.text.strip()
        if notes:
            blocks.append(f"Notes: {notes}")
    return join_blocks([heading, *blocks]), title or None


def _reading_order(shapes: Iterable[Any]) -> list[Any]:
    """Top to bottom, then left to right: the shape tree is in z-order, not reading order."""
    return sorted(shapes, key=lambda shape: (shape.top or 0, shape.left or 0))


def _shape_blocks(shape: Any) -> Iterator[str]:
    from pptx.enum.shapes import MSO_SHAPE_TYPE  # loaded by extract_pptx already

    if shape.shape_type == MSO_SHAPE_TYPE.GROUP:
        for child in _reading_order(shape.shapes):
            yield from _shape_blocks(child)
    elif shape.has_text_frame:
        yield shape.text_frame.text
    elif shape.has_table:
        yield _table_text(
            [cell for cell in row.cells if not cell.is_spanned] for row in shape.table.rows
        )


def _core_tags(properties: Any) -> dict[str, object]:
    """The Office core properties both formats share (docProps/core.xml)."""
    return {
        "title": properties.title,
        "author": properties.author,
        "subject": properties.subject,
        "keywords": properties.keywords,
        "created": _iso(properties.created),
        "modified": _iso(properties.modified),
    }


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None
