"""PDF: the text layer page by page with pypdfium2; pages without one are marked for OCR.

PDFium is not thread-safe, not even across different documents, and the caller runs
extraction in threads: every PDFium call in the process must hold PDFIUM_LOCK (the OCR stage
that renders pages must take it too). Objects are closed explicitly inside the lock, so no
garbage-collector finalizer calls into PDFium from another thread later.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from pipeline.errors import PermanentError
from pipeline.formats import optional
from pipeline.formats.guards import check_count, corrupt_as_permanent, detail
from pipeline.formats.model import Extracted, ExtractLimits
from pipeline.formats.normalize import clean_tags, normalize_text

if TYPE_CHECKING:
    import pypdfium2 as pdfium

PDFIUM_LOCK = threading.RLock()
_METADATA = {"title": "Title", "author": "Author", "subject": "Subject", "keywords": "Keywords"}


def extract_pdf(data: bytes, media_type: str, limits: ExtractLimits) -> Extracted:
    with PDFIUM_LOCK:
        pdf = open_pdf(data)
        try:
            with corrupt_as_permanent("PDF"):
                page_count = len(pdf)
                if page_count == 0:
                    raise PermanentError("the PDF has no pages")
                check_count("PDF", "pages", page_count, limits.max_pages, "max_pages")
                metadata = pdf.get_metadata_dict()
                pages = [_page_text(pdf, index) for index in range(page_count)]
        finally:
            pdf.close()
    tags = clean_tags({key: metadata.get(name) for key, name in _METADATA.items()})
    tags["pages"] = str(page_count)
    return Extracted(
        media_type=media_type,
        text="\f".join(pages),
        title=tags.get("title"),
        language=None,
        tags=tags,
        ocr_pages=tuple(index for index, text in enumerate(pages) if not text),
    )


def open_pdf(data: bytes) -> pdfium.PdfDocument:
    """Open a PDF (holding PDFIUM_LOCK), or say in words why it cannot be read."""
    pdfium = optional.load(optional.PDF)  # imported by the first PDF job, not at start-up
    raw = optional.load(optional.PDF, "pypdfium2.raw")
    try:
        return pdfium.PdfDocument(data)
    except pdfium.PdfiumError as err:
        if err.err_code in (raw.FPDF_ERR_PASSWORD, raw.FPDF_ERR_SECURITY):
            raise PermanentError(
                "the PDF is encrypted with a password; remove the password and upload it again"
            ) from err
        raise PermanentError(f"the PDF is corrupt or truncated: {detail(err)}") from err


def _page_text(pdf: pdfium.PdfDocument, index: int) -> str:
    """The page's normalized text; "" when it has no text layer (a scan, a photo)."""
    page = pdf[index]
    try:
        textpage = page.get_textpage()
        try:
            return normalize_text(textpage.get_text_range().replace("\f", "\n"))
        finally:
            textpage.close()
    finally:
        page.close()
