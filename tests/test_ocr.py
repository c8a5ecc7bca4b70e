"""OCR of images and scanned PDFs, built here with Pillow, and the guards around it.

The model is loaded once for the module (it is one per process anyway), with the network cut
off: rapidocr must use the models in its wheel and fetch nothing.
"""

from __future__ import annotations

import io
import socket
import struct
import time
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFile, ImageFont

from pipeline.errors import PermanentError
from pipeline.providers import ocr
from pipeline.providers.ocr import OcrLimits, ocr_image, ocr_pdf_pages

INVOICE = ["Invoice number 4821", "Total due seven hundred euros"]
DELIVERY = ["Delivery note 7730", "Three boxes of green apples"]


@pytest.fixture(scope="module", autouse=True)
def engine() -> Iterator[None]:
    """One loaded engine for every test here, and no network for any of them."""

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"OCR tried to use the network: {args}")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", no_network)
        mp.setattr(socket, "getaddrinfo", no_network)
        started = time.perf_counter()
        ocr.warm_up()
        assert time.perf_counter() - started < 30
        yield


def scan(
    lines: list[str], size: tuple[int, int] = (1100, 300), font_size: int = 48, step: int = 90
) -> Image.Image:
    """Black text on white, one line every `step` pixels."""
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=font_size)
    for i, line in enumerate(lines):
        draw.text((50, 40 + step * i), line, fill="black", font=font)
    return img


def encode(img: Image.Image, fmt: str, **params: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **params)
    return buf.getvalue()


def words(text: str) -> str:
    return " ".join(text.lower().split())


@pytest.fixture(scope="module")
def invoice() -> Image.Image:
    return scan(INVOICE)


@pytest.fixture(scope="module")
def scanned_pdf() -> bytes:
    first, second = scan(INVOICE, (1240, 400)), scan(DELIVERY, (1240, 400))
    return encode(first, "PDF", save_all=True, append_images=[second], resolution=150)


def test_png_comes_out_as_lines_in_reading_order(invoice: Image.Image) -> None:
    text = ocr_image(encode(invoice, "PNG"))
    lines = text.lower().splitlines()
    assert len(lines) == 2
    assert "invoice" in lines[0] and "4821" in lines[0]
    assert "seven" in lines[1] and "euros" in lines[1]


@pytest.mark.parametrize(
    ("fmt", "mode", "params"),
    [
        ("JPEG", "RGB", {"quality": 70}),
        ("GIF", "P", {}),
        ("TIFF", "1", {"compression": "group4"}),
        ("WEBP", "L", {"quality": 80}),
        ("BMP", "RGB", {}),
        ("PNG", "I;16", {}),
    ],
)
def test_formats_and_modes(invoice: Image.Image, fmt: str, mode: str, params: dict) -> None:
    img = invoice.convert("L").convert(mode) if mode == "I;16" else invoice.convert(mode)
    text = words(ocr_image(encode(img, fmt, **params)))
    assert "invoice" in text
    assert "4821" in text


def test_transparent_background_reads_as_white_paper(invoice: Image.Image) -> None:
    # Black text on a fully transparent background: flattening it naively gives black on black.
    rgba = Image.new("RGBA", invoice.size, (0, 0, 0, 0))
    rgba.putalpha(Image.eval(invoice.convert("L"), lambda v: 255 - v))
    text = words(ocr_image(encode(rgba, "PNG")))
    assert "invoice" in text
    assert "4821" in text


def test_every_long_line_is_kept() -> None:
    # rapidocr's 180-degree line classifier flipped 4 of these 10 upright lines (then dropped).
    line = "The quick brown fox jumps over the lazy dog near invoice 4821 today"
    img = scan([f"{i:02d} {line}" for i in range(10)], (1654, 620), font_size=28, step=54)
    lines = ocr_image(encode(img, "PNG")).lower().splitlines()
    assert len(lines) == 10
    assert all("quick" in text and "4821" in text for text in lines)
    assert [text[:2] for text in lines] == [f"{i:02d}" for i in range(10)]


def test_scanned_pdf_pages_keep_their_own_words(scanned_pdf: bytes) -> None:
    texts = ocr_pdf_pages(scanned_pdf, [0, 1])
    assert set(texts) == {0, 1}
    first, second = words(texts[0]), words(texts[1])
    assert "invoice" in first and "4821" in first and "apples" not in first
    assert "apples" in second and "7730" in second and "invoice" not in second
    assert ocr_pdf_pages(scanned_pdf, [1]).keys() == {1}
    assert ocr_pdf_pages(scanned_pdf, []) == {}


def test_a_page_too_big_at_the_dpi_is_rendered_smaller(scanned_pdf: bytes) -> None:
    # At 600 dpi this page is 4960x1600 = 7.9 Mpx; the limit forces about 178 dpi instead.
    limits = OcrLimits(dpi=600, max_image_pixels=700_000)
    text = words(ocr_pdf_pages(scanned_pdf, [0], limits)[0])
    assert "invoice" in text


def test_page_scale_fits_the_pixel_limit() -> None:
    a4 = (595.0, 842.0)
    assert ocr._page_scale(0, *a4, OcrLimits(dpi=144)) == 2.0
    scale = ocr._page_scale(0, *a4, OcrLimits(dpi=600, max_image_pixels=2_000_000))
    assert 1.0 < scale < 600 / 72
    assert np.ceil(a4[0] * scale) * np.ceil(a4[1] * scale) <= 2_000_000
    with pytest.raises(PermanentError, match="even at 72 dpi"):
        ocr._page_scale(3, 20_000.0, 20_000.0, OcrLimits())


def test_lines_are_grouped_by_vertical_center_then_ordered_left_to_right() -> None:
    def box(left: float, top: float, width: float = 80, height: float = 30) -> list:
        right, bottom = left + width, top + height
        return [[left, top], [right, top], [right, bottom], [left, bottom]]

    result = [
        [box(300, 104), "due", 0.9],
        [box(10, 12), "Invoice", 0.9],
        [box(10, 100), "Total", 0.9],
        [box(200, 8), "4821", 0.9],
        [box(100, 10), "number", 0.9],
        [box(10, 200, height=60), "Big", 0.9],
        [box(200, 215), "  ", 0.9],
    ]
    assert ocr._reading_order(result) == "Invoice number 4821\nTotal due\nBig"
    assert ocr._reading_order([]) == ""


# Guards


def png_header_only(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0"))


def test_an_image_over_the_pixel_limit_fails_before_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_decoding(self: ImageFile.ImageFile) -> None:
        raise AssertionError("the image was decoded")

    data = encode(Image.new("L", (3000, 3000), 255), "PNG")
    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    with pytest.raises(PermanentError, match=r"3000x3000 = 9000000 pixels, over the limit of "
                       r"1000000 \(MEMMILL_MAX_IMAGE_PIXELS\)"):
        ocr_image(data, OcrLimits(max_image_pixels=1_000_000))


def test_a_decompression_bomb_names_its_size_not_pillows_error() -> None:
    # Pillow's own guard fires inside Image.open for this one; the message is still ours.
    with pytest.raises(PermanentError) as caught:
        ocr_image(png_header_only(100_000, 100_000))
    assert str(caught.value) == (
        "the image is 100000x100000 = 10000000000 pixels, over the limit of 50000000 "
        "(MEMMILL_MAX_IMAGE_PIXELS)")


def test_pillows_global_limit_becomes_a_permanent_error(
    monkeypatch: pytest.MonkeyPatch, invoice: Image.Image
) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(PermanentError, match="over Pillow's own limit"):
        ocr_image(encode(invoice, "PNG"))


@pytest.mark.parametrize("data", [b"", b"not an image at all", b"\x89PNG\r\n\x1a\n" + b"\0" * 40])
def test_corrupt_bytes_are_a_permanent_error(data: bytes) -> None:
    with pytest.raises(PermanentError, match="the image is corrupt or not an image"):
        ocr_image(data)


def test_a_truncated_image_is_a_permanent_error(invoice: Image.Image) -> None:
    data = encode(invoice, "PNG")
    with pytest.raises(PermanentError, match="the image is corrupt or not an image"):
        ocr_image(data[: len(data) // 2])


@pytest.mark.parametrize("cut", [0.5, 0.99])
def test_a_truncated_pdf_is_a_permanent_error(scanned_pdf: bytes, cut: float) -> None:
    with pytest.raises(PermanentError, match="the PDF is corrupt"):
        ocr_pdf_pages(scanned_pdf[: int(len(scanned_pdf) * cut)], [0])


def test_an_encrypted_pdf_says_so(scanned_pdf: bytes) -> None:
    # A Standard security handler whose user password is not empty: PDFium cannot open it.
    encrypt = (" /Encrypt << /Filter /Standard /V 1 /R 2 /Length 40 /P -44 "
               f"/O <{'11' * 32}> /U <{'22' * 32}> >> /ID [<{'ab' * 16}> <{'ab' * 16}>] /Root")
    assert scanned_pdf.count(b"/Root") == 1
    with pytest.raises(PermanentError, match="the PDF is encrypted with a password"):
        ocr_pdf_pages(scanned_pdf.replace(b"/Root", encrypt.encode()), [0])


def test_too_many_pages_name_the_count_and_the_limit(scanned_pdf: bytes) -> None:
    with pytest.raises(PermanentError, match=r"2 pages, over the limit of 1 "
                       r"\(MEMMILL_OCR_MAX_PAGES\)"):
        ocr_pdf_pages(scanned_pdf, [0, 1], OcrLimits(max_pages=1))


@pytest.mark.parametrize("page", [2, -1])
def test_a_page_out_of_range_is_a_permanent_error(scanned_pdf: bytes, page: int) -> None:
    with pytest.raises(PermanentError, match=f"page {page} is out of range: the PDF has 2 pages"):
        ocr_pdf_pages(scanned_pdf, [0, page])
