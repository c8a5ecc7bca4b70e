"""OCR for scanned PDFs and raster images, offline.

The engine is rapidocr-onnxruntime (PP-OCRv4 detection and recognition on onnxruntime). It is
pip-only and ships its ONNX models inside the wheel: nothing is downloaded at run time and
there is no apt dependency (unlike Tesseract), so `./dev setup` installs everything. PDF pages
are rendered with pypdfium2, and everything stays in memory: no temporary files.

These functions are synchronous and CPU-bound; callers run them in a worker thread. The
engine, Pillow and pypdfium2 are imported by the first OCR job, not when a worker starts: a
worker without them runs every other job, and its OCR jobs fail at once with a message that
names the missing package (`pipeline.formats.optional`). The model
is loaded once per process, lazily, and recognition runs one image at a time: onnxruntime
already uses every core for one image, and rapidocr keeps per-call state on its detector.
PDFium is not thread-safe at all, even across documents: every pdfium call here holds
pipeline.formats.PDFIUM_LOCK, the one lock the text-layer extraction holds too.

Guards, all raising PermanentError with a message a person can act on:
- an image's pixel count is read from its header (Pillow does not decode on open) and checked
  against our own limit, not Pillow's global Image.MAX_IMAGE_PIXELS, before anything is decoded;
- a PDF page's pixel count is computed from its size and the dpi before rendering; a page too
  big at that dpi is rendered at a lower one that fits (it stays readable), and only a page too
  big even at 72 dpi is refused;
- at most max_pages pages are OCR'd per call.
"""

from __future__ import annotations

import io
import math
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.errors import PermanentError
from pipeline.formats import PDFIUM_LOCK, optional
from pipeline.formats.pdf import open_pdf

if TYPE_CHECKING:
    import pypdfium2 as pdfium
    from PIL import Image

__all__ = ["OcrLimits", "ocr_image", "ocr_pdf_pages", "warm_up"]


@dataclass(frozen=True)
class OcrLimits:
    max_image_pixels: int = 50_000_000  # decompression-bomb guard, checked before decoding
    max_pages: int = 100  # at most this many PDF pages are OCR'd per call
    dpi: int = 200  # PDF rendering resolution (scale = dpi / 72)

    def __post_init__(self) -> None:
        for name in ("max_image_pixels", "max_pages", "dpi"):
            if getattr(self, name) < 1:
                raise ValueError(f"OcrLimits.{name} must be at least 1")


# What Pillow raises on bad input, besides UnidentifiedImageError (an OSError).
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error)
_HIGH_BIT_MODES = {"I", "F", "I;16", "I;16B", "I;16L", "I;16N"}

_engine: Any = None
_load_lock = threading.Lock()
_run_lock = threading.Lock()


def _get_engine() -> Any:
    global _engine
    if _engine is None:
        with _load_lock:
            if _engine is None:
                # Heavy (cv2, onnxruntime) and not needed by any other job: lazy.
                rapidocr = optional.load(optional.OCR)
                # No 180-degree line classifier: on long upright lines of Latin text it
                # flips about a third of them, which then read as noise and are dropped.
                # Upside-down scans are rare; phone photos are turned by their EXIF tag.
                _engine = rapidocr.RapidOCR(use_cls=False)
    return _engine


def warm_up() -> None:
    """Load the model now (a worker calls this at startup when OCR is enabled)."""
    _get_engine()


def ocr_image(data: bytes, limits: OcrLimits = OcrLimits()) -> str:
    """Text of a raster image (JPEG/PNG/TIFF/WebP/BMP/GIF first frame). Lines in reading order
    joined by "\\n"."""
    return _recognize(_decode_image(data, limits))


def ocr_pdf_pages(
    data: bytes, pages: Sequence[int], limits: OcrLimits = OcrLimits()
) -> dict[int, str]:
    """Text of the given 0-based pages of a PDF, each page rendered at limits.dpi (lower if the
    page would be over the pixel limit) and recognized; returns {page: text}."""
    wanted = list(dict.fromkeys(pages))
    if len(wanted) > limits.max_pages:
        raise PermanentError(
            f"OCR was asked for {len(wanted)} pages, over the limit of {limits.max_pages} "
            "(MEMMILL_OCR_MAX_PAGES)"
        )
    if not wanted:
        return {}
    with PDFIUM_LOCK:
        pdf = open_pdf(data)
    try:
        with PDFIUM_LOCK:
            count = len(pdf)
        for index in wanted:
            if not 0 <= index < count:
                raise PermanentError(
                    f"page {index} is out of range: the PDF has {count} pages "
                    "(numbered from 0)"
                )
        texts: dict[int, str] = {}
        for index in wanted:
            with PDFIUM_LOCK:
                image = _render_page(pdf, index, limits)
            texts[index] = _recognize(image)  # outside the lock: pdfium is free meanwhile
            del image  # one page in memory at a time
        return texts
    finally:
        with PDFIUM_LOCK:
            pdf.close()


# Images


def _decode_image(data: bytes, limits: OcrLimits) -> np.ndarray:
    """Check the header, then decode to a BGR array (what rapidocr expects of an array)."""
    optional.load(optional.IMAGES)
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data))  # reads the header only
    except UnidentifiedImageError:
        raise PermanentError(
            "the image is corrupt or not an image: its format is not recognized"
        ) from None
    except Image.DecompressionBombError as exc:
        # Pillow's own global guard fired inside Image.open: report it as ours, with the size.
        size = _header_size(data)
        if size is None:
            raise PermanentError(f"the image is too large: {exc}") from None
        _check_pixels(*size, limits)  # raises unless our limit is above Pillow's
        raise PermanentError(
            f"the image is {size[0]}x{size[1]} pixels, over Pillow's own limit: {exc}"
        ) from None
    except _DECODE_ERRORS as exc:
        raise PermanentError(f"the image is corrupt or not an image: {exc}") from None
    with img:
        _check_pixels(*img.size, limits)
        try:
            img.load()
            return _to_bgr(ImageOps.exif_transpose(img))
        except Image.DecompressionBombError as exc:
            raise PermanentError(f"the image is too large: {exc}") from None
        except _DECODE_ERRORS as exc:
            raise PermanentError(f"the image is corrupt or not an image: {exc}") from None


def _check_pixels(width: int, height: int, limits: OcrLimits) -> None:
    if width < 1 or height < 1:
        raise PermanentError(f"the image is corrupt or not an image: it is {width}x{height}")
    if width * height > limits.max_image_pixels:
        raise PermanentError(
            f"the image is {width}x{height} = {width * height} pixels, over the limit of "
            f"{limits.max_image_pixels} (MEMMILL_MAX_IMAGE_PIXELS)"
        )


def _header_size(data: bytes) -> tuple[int, int] | None:
    """The size in an image's header, read with the format plugins directly: Image.open would
    raise Pillow's DecompressionBombError before saying how big the image is."""
    from PIL import Image  # loaded by _decode_image already

    Image.init()
    for fmt in list(Image.ID):
        factory, accept = Image.OPEN[fmt]
        found = True if accept is None else accept(data[:16])
        if not found or isinstance(found, str):
            continue
        try:
            with factory(io.BytesIO(data), "") as img:
                return img.size
        except _DECODE_ERRORS:
            continue
    return None


def _to_bgr(img: Image.Image) -> np.ndarray:
    """RGB through Pillow for every mode (1-bit, grayscale, palette, CMYK, alpha over white,
    16-bit and float stretched to 8 bits), then channels reversed for rapidocr."""
    from PIL import Image  # loaded by _decode_image already

    if img.mode in _HIGH_BIT_MODES:
        values = np.nan_to_num(np.asarray(img, dtype=np.float64))
        low, high = float(values.min()), float(values.max())
        if high > low:
            gray = ((values - low) * (255.0 / (high - low))).astype(np.uint8)
        else:
            gray = np.full(values.shape, 255, dtype=np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if img.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in img.info:
        rgba = img.convert("RGBA")
        page = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        page.alpha_composite(rgba)
        rgb = page.convert("RGB")
    else:
        rgb = img.convert("RGB")
    return np.ascontiguousarray(np.asarray(rgb)[:, :, ::-1])


# PDFs (callers hold PDFIUM_LOCK)


def _render_page(pdf: pdfium.PdfDocument, index: int, limits: OcrLimits) -> np.ndarray:
    import pypdfium2 as pdfium  # loaded by open_pdf already

    try:
        page = pdf[index]
    except pdfium.PdfiumError as exc:
        raise PermanentError(f"page {index} of the PDF cannot be loaded: {exc}") from None
    try:
        width, height = page.get_size()
        scale = _page_scale(index, width, height, limits)
        bitmap = page.render(scale=scale)
        try:
            # BGR on white, as rapidocr wants it; a view of pdfium's buffer, so copied.
            return np.ascontiguousarray(bitmap.to_numpy()[:, :, :3])
        finally:
            bitmap.close()
    finally:
        page.close()


def _page_scale(index: int, width: float, height: float, limits: OcrLimits) -> float:
    """limits.dpi / 72, lowered until the rendered page fits the pixel limit."""

    def pixels(scale: float) -> int:  # as pypdfium2 sizes the bitmap
        return math.ceil(width * scale) * math.ceil(height * scale)

    if not (width > 0 and height > 0 and math.isfinite(width * height)):
        raise PermanentError(f"page {index} of the PDF has no usable size ({width}x{height} pt)")
    scale = limits.dpi / 72
    if pixels(scale) <= limits.max_image_pixels:
        return scale
    floor = min(1.0, scale)
    if pixels(floor) > limits.max_image_pixels:
        raise PermanentError(
            f"page {index} of the PDF is {width:.0f}x{height:.0f} pt: even at 72 dpi it would "
            f"be {pixels(floor)} pixels, over the limit of {limits.max_image_pixels} "
            "(MEMMILL_MAX_IMAGE_PIXELS)"
        )
    scale = math.sqrt(limits.max_image_pixels / (width * height))
    while scale > floor and pixels(scale) > limits.max_image_pixels:  # ceil() rounding
        scale = max(floor, scale * 0.995)
    return scale


# Recognition and reading order


def _recognize(image: np.ndarray) -> str:
    engine = _get_engine()
    with _run_lock:
        result, _elapse = engine(image)
    return _reading_order(result or [])


def _reading_order(result: Sequence[Sequence[Any]]) -> str:
    """Lines top to bottom, words left to right: boxes whose vertical centers are within half
    a line height of a line's center join that line."""
    boxes = []
    for box, text, *_score in result:
        text = str(text).strip()
        if not text:
            continue
        ys = [float(point[1]) for point in box]
        left = min(float(point[0]) for point in box)
        top, bottom = min(ys), max(ys)
        boxes.append(((top + bottom) / 2, max(bottom - top, 1.0), left, text))
    boxes.sort(key=lambda b: (b[0], b[2]))

    lines: list[list[tuple[float, float, float, str]]] = []
    for item in boxes:
        if lines:
            line = lines[-1]
            center = sum(b[0] for b in line) / len(line)
            height = sum(b[1] for b in line) / len(line)
            if abs(item[0] - center) <= height / 2:
                line.append(item)
                continue
        lines.append([item])
    return "\n".join(
        " ".join(b[3] for b in sorted(line, key=lambda b: b[2])) for line in lines
    )
