"""pipeline.formats on real files built in code: sniffing, extraction, and hostile input.

Pure unit tests: no database or Redis fixtures, so conftest starts neither.
"""

from __future__ import annotations

import io
import struct
import wave
import zipfile
from datetime import datetime

import docx
import pptx
import pypdfium2 as pdfium
import pytest
from PIL import Image, ImageDraw, ImageFont

from pipeline.errors import PermanentError
from pipeline.formats import PDFIUM_LOCK, SUPPORTED, Extracted, ExtractLimits, extract, sniff

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
MB = 1_000_000

# ---------------------------------------------------------------------------------------------
# Builders: small, real files of each format.
# ---------------------------------------------------------------------------------------------


def make_pdf(pages: list[list[str]], info: dict[str, str] | None = None,
             trailer_extra: str = "") -> bytes:
    """A minimal valid PDF with a Helvetica text layer: one line per string, a correct xref."""
    font_number = 3 + 2 * len(pages)
    kids = " ".join(f"{3 + 2 * index} 0 R" for index in range(len(pages)))
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>",
    ]
    for index, lines in enumerate(pages):
        shows = " ".join(f"({line}) '" for line in lines)
        content = f"BT /F1 24 Tf 72 720 Td 28 TL {shows} ET"
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 {font_number} 0 R >> >> /Contents {4 + 2 * index} 0 R >>"
        )
        objects.append(f"<< /Length {len(content)} >>\nstream\n{content}\nendstream")
    objects.append("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    info_ref = ""
    if info:
        objects.append("<< " + " ".join(f"/{key} ({value})" for key, value in info.items()) + " >>")
        info_ref = f" /Info {len(objects)} 0 R"
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref_at = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += (
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R{info_ref}{trailer_extra} >>\n"
        f"startxref\n{xref_at}\n%%EOF\n"
    ).encode()
    return bytes(out)


def text_image(text: str, size: tuple[int, int] = (900, 300)) -> Image.Image:
    image = Image.new("RGB", size, "white")
    ImageDraw.Draw(image).text((30, 100), text, fill="black", font=ImageFont.load_default(size=48))
    return image


def scanned_pdf() -> bytes:
    """Pillow writes image-only PDFs: a page that looks like text but has no text layer."""
    buffer = io.BytesIO()
    text_image("Scanned words here").save(buffer, "PDF", resolution=100)
    return buffer.getvalue()


def mixed_pdf() -> bytes:
    """Page 0 with a text layer, page 1 scanned."""
    with PDFIUM_LOCK:
        merged = pdfium.PdfDocument.new()
        for part in (make_pdf([["Typed page"]]), scanned_pdf()):
            source = pdfium.PdfDocument(part)
            merged.import_pages(source)
            source.close()
        buffer = io.BytesIO()
        merged.save(buffer)
        merged.close()
    return buffer.getvalue()


def make_docx() -> bytes:
    document = docx.Document()
    document.core_properties.title = "Quarterly Report"
    document.core_properties.author = "Ada Lovelace"
    document.add_heading("Introduction", level=1)
    document.add_paragraph("The first paragraph explains the numbers.")
    document.add_heading("Details", level=2)
    document.add_paragraph("A second paragraph follows the table.")
    table = document.add_table(rows=2, cols=2)
    for row, values in zip(table.rows, (("a", "b"), ("c", "d")), strict=True):
        for cell, value in zip(row.cells, values, strict=True):
            cell.text = value
    document.add_paragraph("Closing words.")
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def make_pptx(slide_count: int = 2) -> bytes:
    presentation = pptx.Presentation()
    presentation.core_properties.title = "Roadmap Deck"
    presentation.core_properties.author = "Grace Hopper"
    layout = presentation.slide_layouts[1]  # "Title and Content"
    for number in range(1, slide_count + 1):
        slide = presentation.slides.add_slide(layout)
        slide.shapes.title.text = f"Topic {number}"
        slide.placeholders[1].text = f"Body text of slide {number}"
        if number == 1:
            slide.notes_slide.notes_text_frame.text = "Speaker notes for the first slide"
    buffer = io.BytesIO()
    presentation.save(buffer)
    return buffer.getvalue()


ARTICLE_HTML = b"""<!DOCTYPE html>
<html lang="en-GB"><head><meta charset="utf-8"><title>Otters of the River</title>
<style>.banner { color: red } stylewordzz</style>
<script>var scriptwordzz = "tracking";</script></head>
<body>
<nav><a href="/">Home</a> <a href="/about">navwordzz about us</a></nav>
<div class="cookie-banner" id="cookie-consent">We use cookies cookiewordzz. Accept all.</div>
<article>
<h1>Otters of the River</h1>
<p>River otters are semiaquatic mammals that live along the banks of rivers and lakes across
the northern hemisphere, where they build dens among the roots of old trees.</p>
<h2>Diet</h2>
<p>They eat mostly fish, but they also catch crayfish, frogs and the occasional bird when the
water is cold and the fish swim deep.</p>
<p>An adult otter can hold its breath for up to eight minutes while it hunts along the muddy
bottom of the river, feeling for prey with its whiskers.</p>
<p>Otters are playful animals, and young otters spend much of their day sliding down muddy
banks into the water while their mother watches.</p>
</article>
<footer>Copyright footerwordzz. All rights reserved.</footer>
</body></html>"""


def exif_jpeg(size: tuple[int, int] = (64, 48)) -> bytes:
    exif = Image.Exif()
    exif[0x010F] = "Canon"
    exif[0x0110] = "EOS 5D"
    exif.get_ifd(0x8769)[0x9003] = "2024:05:17 14:03:22"
    gps = exif.get_ifd(0x8825)
    gps[1], gps[2] = "N", (48.0, 51.0, 29.88)
    gps[3], gps[4] = "E", (2.0, 17.0, 40.2)
    buffer = io.BytesIO()
    Image.new("RGB", size, "green").save(buffer, "JPEG", exif=exif)
    return buffer.getvalue()


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def silent_wav(seconds: float = 1.0, rate: int = 8000) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(b"\x00\x00" * int(rate * seconds))
    return buffer.getvalue()


def tagged_mp3() -> bytes:
    """An ID3v2.4 tag (title, artist, album) followed by 40 silent MPEG-1 Layer III frames."""

    def frame(frame_id: str, text: str) -> bytes:
        body = b"\x03" + text.encode()  # encoding byte 3 = UTF-8
        return frame_id.encode() + struct.pack(">I", len(body)) + b"\x00\x00" + body

    frames = frame("TIT2", "Quiet Song") + frame("TPE1", "The Testers") + frame("TALB", "Demo")
    size = len(frames)
    syncsafe = bytes((size >> shift) & 0x7F for shift in (21, 14, 7, 0))
    audio = (b"\xff\xfb\x90\x64" + b"\x00" * 413) * 40  # 128 kbit/s, 44.1 kHz, 417-byte frames
    return b"ID3\x04\x00\x00" + syncsafe + frames + audio


def zip_of_zeros(member_bytes: int) -> bytes:
    """A DOCX-shaped zip whose document.xml is `member_bytes` of zeros, written in chunks."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        with archive.open("word/document.xml", "w") as member:
            chunk = b"\x00" * MB
            for _ in range(member_bytes // MB):
                member.write(chunk)
    return buffer.getvalue()


def permanent_message(data: bytes, media_type: str, limits: ExtractLimits | None = None) -> str:
    with pytest.raises(PermanentError) as caught:
        extract(data, media_type, limits or ExtractLimits())
    return str(caught.value)


# ---------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------


def test_pdf_text_layer_comes_out_page_by_page_with_one_form_feed_between() -> None:
    data = make_pdf([["Hello first page", "second line"], ["Page two words"]],
                    info={"Title": "Test Doc", "Author": "Ann Author"})
    result = extract(data, "application/pdf")
    assert result.text == "Hello first page\nsecond line\fPage two words"
    assert result.ocr_pages == ()
    assert result.tags == {"title": "Test Doc", "author": "Ann Author", "pages": "2"}
    assert result.title == "Test Doc"
    assert result.kind == "document"


def test_scanned_pdf_has_no_text_and_is_marked_for_ocr() -> None:
    result = extract(scanned_pdf(), "application/pdf")
    assert result.text == ""
    assert result.ocr_pages == (0,)
    assert result.tags["pages"] == "1"


def test_a_scanned_page_keeps_its_place_between_form_feeds() -> None:
    result = extract(mixed_pdf(), "application/pdf")
    assert result.text == "Typed page\f"
    assert result.ocr_pages == (1,)


def test_docx_headings_paragraphs_and_tables_in_document_order() -> None:
    result = extract(make_docx(), DOCX)
    assert result.text == (
        "# Introduction\n\nThe first paragraph explains the numbers.\n\n## Details\n\n"
        "A second paragraph follows the table.\n\na | b\nc | d\n\nClosing words."
    )
    assert result.tags["author"] == "Ada Lovelace"
    assert result.tags["title"] == result.title == "Quarterly Report"


def test_pptx_slides_start_with_a_heading_and_keep_notes() -> None:
    result = extract(make_pptx(), PPTX)
    slide_1, slide_2 = result.text.split("\n\n## Slide 2")
    assert slide_1 == (
        "## Slide 1: Topic 1\n\nBody text of slide 1\n\nNotes: Speaker notes for the first slide"
    )
    assert slide_2 == ": Topic 2\n\nBody text of slide 2"
    assert result.tags["slides"] == "2"
    assert result.tags["author"] == "Grace Hopper"
    assert result.title == "Roadmap Deck"


def test_html_keeps_the_article_and_drops_boilerplate() -> None:
    result = extract(ARTICLE_HTML, "text/html")
    assert "# Otters of the River" in result.text
    assert "## Diet" in result.text
    assert "hold its breath for up to eight minutes" in result.text
    for boilerplate in ("scriptwordzz", "stylewordzz", "navwordzz", "footerwordzz"):
        assert boilerplate not in result.text
    assert result.title == "Otters of the River"
    assert result.language == "en"


def test_html_navigation_is_dropped_even_on_a_short_page() -> None:
    page = (b"<html><head><title>Tiny</title><script>hidden()</script></head><body>"
            b"<nav>Menu</nav><h2>Status</h2><div>All systems normal</div>"
            b"<footer>Imprint</footer></body></html>")
    result = extract(page, "text/html")
    assert result.text == "## Status\n\nAll systems normal"
    assert result.title == "Tiny"
    assert result.language is None


def test_html_without_main_text_falls_back_to_the_visible_body() -> None:
    # trafilatura discards <aside> content as boilerplate and so finds no main text here.
    page = (b"<html lang='de'><head><title>Hours</title><style>.x{}</style></head><body>"
            b"<nav>Menu</nav><aside><h2>Opening\n  hours</h2><p>Monday to Friday,<br>nine "
            b"to five.</p><!-- a comment --></aside><footer>Imprint</footer>"
            b"<script>hidden()</script></body></html>")
    result = extract(page, "text/html")
    assert result.text == "## Opening hours\n\nMonday to Friday,\nnine to five."
    assert result.language == "de"


def test_jpeg_exif_becomes_tags() -> None:
    result = extract(exif_jpeg(), "image/jpeg")
    assert result.kind == "image"
    assert result.text == ""
    assert result.ocr_pages == (0,)
    assert result.title is None
    assert result.tags["width"] == "64"
    assert result.tags["height"] == "48"
    assert result.tags["format"] == "JPEG"
    assert result.tags["camera"] == "Canon EOS 5D"
    assert result.tags["taken_at"] == "2024-05-17T14:03:22"
    assert datetime.fromisoformat(result.tags["taken_at"])
    assert result.tags["gps"] == "48.858300,2.294500"


def test_wav_duration() -> None:
    result = extract(silent_wav(), "audio/x-wav")
    assert result.kind == "audio"
    assert result.tags["duration_s"] == "1.0"
    assert result.text == "Audio: untitled, 0:01"


def test_mp3_id3_tags_make_a_findable_description() -> None:
    result = extract(tagged_mp3(), "audio/mpeg")
    assert result.title == "Quiet Song"
    assert result.tags["artist"] == "The Testers"
    assert result.tags["album"] == "Demo"
    assert result.tags["duration_s"] == "1.0"
    assert result.text == "Audio: Quiet Song by The Testers (Demo), 0:01"


def test_plain_text_is_normalized() -> None:
    raw = "\ufeffFirst  line\twith\x00 junk\r\nsecond line\r\n\r\n\r\n\r\nNext   paragraph\x07\n"
    result = extract(raw.encode("utf-8"), "text/plain")
    assert result.text == "First line with junk\nsecond line\n\nNext paragraph"
    assert result.title is None


def test_markdown_title_is_the_first_h1() -> None:
    result = extract(b"Intro line\n\n# My Notes\n\n## Part\n\nBody\n", "text/markdown")
    assert result.title == "My Notes"
    assert "## Part" in result.text


def test_legacy_encodings_are_detected() -> None:
    for text, encoding in (
        ("Café crème brûlée à la française, déjà vu, naïve façade, garçon.", "cp1252"),
        ("El niño comió paella en la montaña con su señora, ¿verdad? Sí.", "cp1252"),
        ("Привет, как дела? Сегодня хорошая погода, и мы идём гулять в парк.", "cp1251"),
        ("Günaydın, nasılsınız? Bugün hava çok güzel, şehirde yürüyüş yapalım.", "cp1254"),
    ):
        assert extract(text.encode(encoding), "text/plain").text == text


def test_content_type_parameters_and_aliases_are_accepted() -> None:
    assert extract(b"hi", "Text/Plain; charset=utf-8").media_type == "text/plain"
    assert extract(exif_jpeg(), "image/jpg").media_type == "image/jpeg"


# ---------------------------------------------------------------------------------------------
# Sniffing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "filename", "expected"),
    [
        (lambda: make_pdf([["x"]]), "report.pdf", "application/pdf"),
        (lambda: make_pdf([["x"]]), "x.docx", "application/pdf"),  # the bytes win
        (make_docx, None, DOCX),
        (make_docx, "slides.pptx", DOCX),
        (make_pptx, "deck.bin", PPTX),
        (lambda: ARTICLE_HTML, None, "text/html"),
        (lambda: b"\xef\xbb\xbf  \n<html><body>hi</body></html>", None, "text/html"),
        (exif_jpeg, "photo.png", "image/jpeg"),
        (lambda: png_bytes(Image.new("RGB", (4, 4))), None, "image/png"),
        (silent_wav, None, "audio/x-wav"),
        (tagged_mp3, None, "audio/mpeg"),
        (lambda: b"\x00\x01junk" + make_pdf([["x"]]), None, "application/pdf"),
        (lambda: b"A PDF starts with %PDF-1.7, then objects.", None, "text/plain"),
        (lambda: b"just some notes\n", "notes.txt", "text/plain"),
        (lambda: b"# Title\n\ntext", "notes.md", "text/markdown"),
        (lambda: b"# Title\n\ntext", "notes.markdown", "text/markdown"),
        (lambda: b"# Title\n\ntext", None, "text/plain"),
        (lambda: b"<p>a fragment</p>", "page.html", "text/html"),
        (lambda: "déjà".encode("cp1252"), "old.txt", "text/plain"),
        (lambda: b"\x00\x01\x02\x03binary\xff\xfe", None, "application/octet-stream"),
        (lambda: b"\x00\x01\x02\x03binary\xff\xfe", "blob.pdf", "application/pdf"),
    ],
)
def test_sniff(build: object, filename: str | None, expected: str) -> None:
    assert callable(build)
    assert sniff(build(), filename) == expected


def test_sniff_falls_back_to_the_declared_type() -> None:
    unknown = b"\x00\x01\x02\x03binary\xff\xfe"
    assert sniff(unknown, None, "application/pdf; qs=1") == "application/pdf"
    assert sniff(unknown, None, "application/octet-stream") == "application/octet-stream"
    assert sniff(b"# Title\n", None, "text/markdown") == "text/markdown"
    assert sniff(b"plain words", None, "image/png") == "text/plain"  # the bytes say text


def test_sniffed_types_are_the_ones_extract_accepts() -> None:
    for data in (make_pdf([["x"]]), make_docx(), make_pptx(), ARTICLE_HTML, exif_jpeg(),
                 silent_wav(), tagged_mp3()):
        assert sniff(data) in SUPPORTED


# ---------------------------------------------------------------------------------------------
# Hostile, corrupt and oversized input
# ---------------------------------------------------------------------------------------------


def test_truncated_pdf_is_corrupt() -> None:
    data = make_pdf([["Hello first page"], ["Page two words"]])
    message = permanent_message(data[: len(data) // 2], "application/pdf")
    assert "the PDF is corrupt or truncated" in message


def test_encrypted_pdf_is_refused() -> None:
    # A Standard security handler whose user password is not empty: PDFium cannot open it.
    encrypt = (" /Encrypt << /Filter /Standard /V 1 /R 2 /Length 40 /P -44 "
               f"/O <{'11' * 32}> /U <{'22' * 32}> >> /ID [<{'ab' * 16}> <{'ab' * 16}>]")
    message = permanent_message(make_pdf([["secret"]], trailer_extra=encrypt), "application/pdf")
    assert "the PDF is encrypted" in message


def test_pdf_over_the_page_limit() -> None:
    data = make_pdf([["one"], ["two"], ["three"]])
    message = permanent_message(data, "application/pdf", ExtractLimits(max_pages=2))
    assert "3 pages" in message
    assert "max_pages" in message


def test_pptx_over_the_slide_limit() -> None:
    message = permanent_message(make_pptx(slide_count=3), PPTX, ExtractLimits(max_pages=2))
    assert "3 slides" in message
    assert "max_pages" in message


@pytest.mark.parametrize("media_type", ["text/plain", "application/pdf", DOCX, "image/png"])
def test_empty_file(media_type: str) -> None:
    assert "empty" in permanent_message(b"", media_type)


def test_zip_bomb_over_the_unzipped_limit() -> None:
    message = permanent_message(zip_of_zeros(20 * MB), DOCX,
                                ExtractLimits(max_unzipped_bytes=10 * MB))
    assert "unpacks to 20,000,008 bytes" in message  # the member plus [Content_Types].xml
    assert "max_unzipped_bytes" in message


def test_zip_bomb_by_compression_ratio() -> None:
    message = permanent_message(zip_of_zeros(20 * MB), DOCX)  # under 200 MB, but 1000:1
    assert "zip bomb" in message
    assert "word/document.xml" in message


def test_huge_image_is_refused_before_decoding() -> None:
    data = png_bytes(Image.new("1", (5000, 5000)))
    message = permanent_message(data, "image/png", ExtractLimits(max_image_pixels=1_000_000))
    assert "5000x5000" in message
    assert "max_image_pixels" in message


def test_truncated_image_is_corrupt() -> None:
    data = png_bytes(text_image("cut off"))
    assert "corrupt" in permanent_message(data[: len(data) // 2], "image/png")


@pytest.mark.parametrize(
    ("media_type", "words"),
    [
        ("application/pdf", "the PDF is corrupt"),
        (DOCX, "the DOCX file is corrupt"),
        (PPTX, "the PPTX file is corrupt"),
        ("image/jpeg", "the image is corrupt"),
        ("audio/mpeg", "the audio file is corrupt"),
    ],
)
def test_bytes_that_are_not_the_claimed_type_are_corrupt(media_type: str, words: str) -> None:
    assert words in permanent_message(b"this is plain text, not a binary file" * 3, media_type)


def test_a_docx_that_is_really_a_pptx_is_corrupt() -> None:
    assert "the DOCX file is corrupt" in permanent_message(make_pptx(), DOCX)


@pytest.mark.parametrize("media_type", ["application/zip", "video/mp4", "application/msword"])
def test_unsupported_type_names_it_and_lists_the_supported(media_type: str) -> None:
    message = permanent_message(b"PK\x03\x04 something", media_type)
    assert f"unsupported file type {media_type!r}" in message
    assert "application/pdf" in message
    assert "text/markdown" in message


def test_unrecognized_type_says_so() -> None:
    message = permanent_message(b"\x00\x01", "application/octet-stream")
    assert "not recognized" in message


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_pages"):
        ExtractLimits(max_pages=0)


def test_extracted_is_frozen() -> None:
    result = extract(b"hi", "text/plain")
    assert isinstance(result, Extracted)
    with pytest.raises(AttributeError):
        result.text = "changed"  # type: ignore[misc]
