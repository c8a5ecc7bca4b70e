"""Checks that refuse hostile or oversized input before a parser spends memory on it, and
the translation of parser crashes into errors a person can act on."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager

from pipeline.errors import PermanentError
from pipeline.formats.model import ExtractLimits

# A member this large that compresses better than MAX_RATIO:1 is treated as a zip bomb; real
# Office XML compresses about 10:1, rarely 30:1.
RATIO_MIN_BYTES = 1_000_000
MAX_RATIO = 100
_MAX_DETAIL = 200


def check_count(what: str, unit: str, count: int, limit: int, setting: str) -> None:
    """E.g. "the PDF has 1,500 pages, over the limit of 1,000 (max_pages)"."""
    if count > limit:
        raise PermanentError(
            f"the {what} has {count:,} {unit}, over the limit of {limit:,} ({setting})"
        )


def check_pixels(width: int, height: int, limits: ExtractLimits) -> None:
    """Refuse from the header alone: decoding is what would take width*height*4 bytes."""
    pixels = width * height
    if pixels > limits.max_image_pixels:
        raise PermanentError(
            f"the image is {width}x{height} = {pixels:,} pixels, over the limit of "
            f"{limits.max_image_pixels:,} (max_image_pixels)"
        )


def check_zip(data: bytes, limits: ExtractLimits, what: str) -> None:
    """Refuse a zip bomb from the central directory, before python-docx/pptx inflate anything.

    The declared sizes are enough: zipfile never inflates a member past its declared
    file_size (its reader stops there and then fails the CRC check), so a lying header cannot
    make the later parse produce more than we allowed here.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as err:
        raise PermanentError(
            f"the {what} is corrupt or truncated: not a valid zip container ({detail(err)})"
        ) from err
    total = sum(member.file_size for member in members)
    if total > limits.max_unzipped_bytes:
        raise PermanentError(
            f"the {what} unpacks to {total:,} bytes, over the limit of "
            f"{limits.max_unzipped_bytes:,} (max_unzipped_bytes)"
        )
    for member in members:
        if member.file_size > RATIO_MIN_BYTES and (
            member.file_size > MAX_RATIO * max(member.compress_size, 1)
        ):
            raise PermanentError(
                f"the {what} looks like a zip bomb: {member.filename!r} compresses "
                f"{member.file_size:,} bytes into {member.compress_size:,} "
                f"(over {MAX_RATIO}:1)"
            )


def detail(err: BaseException) -> str:
    """A short, one-line reason from a library's exception."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 1] + "…"


@contextmanager
def corrupt_as_permanent(what: str) -> Iterator[None]:
    """Parsers of untrusted bytes fail with anything (KeyError, struct.error, lxml errors...);
    all of it means the same to the caller: this file cannot be read, retrying won't help.
    MemoryError is left alone: it is about the machine, not the file."""
    try:
        yield
    except (PermanentError, MemoryError):
        raise
    except Exception as err:
        raise PermanentError(f"the {what} is corrupt or truncated: {detail(err)}") from err
