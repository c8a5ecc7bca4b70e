"""Images and audio: no text of their own, so metadata makes them findable. Images are
handed to OCR later (ocr_pages=(0,)); audio gets a one-line description from its tags.
Pillow and tinytag are imported by the first job that reads such a file (see `optional`)."""

from __future__ import annotations

import io
import math
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pipeline.errors import PermanentError
from pipeline.formats import optional
from pipeline.formats.guards import check_pixels, corrupt_as_permanent, detail
from pipeline.formats.model import Extracted, ExtractLimits
from pipeline.formats.normalize import clean_tag, clean_tags

if TYPE_CHECKING:
    from PIL import Image
    from tinytag import TinyTag

# Only the decoders for the types we accept: Pillow can open dozens of exotic formats, and
# each one is attack surface. (The JPEG decoder also opens multi-picture "MPO" camera files.)
_PIL_FORMATS = ("JPEG", "PNG", "WEBP", "TIFF", "GIF", "BMP")
_MAKE, _MODEL, _DATETIME = 0x010F, 0x0110, 0x0132
_EXIF_IFD, _GPS_IFD = 0x8769, 0x8825
_DATETIME_ORIGINAL, _OFFSET_TIME_ORIGINAL = 0x9003, 0x9011
_GPS_LAT_REF, _GPS_LAT, _GPS_LON_REF, _GPS_LON = 1, 2, 3, 4
# Malformed EXIF is common (phone apps, editors); it costs the tags, never the image.
_EXIF_ERRORS = (ValueError, TypeError, KeyError, IndexError, ZeroDivisionError, OSError,
                SyntaxError)


def extract_image(data: bytes, media_type: str, limits: ExtractLimits) -> Extracted:
    image = _open_image(data, limits)
    with image:
        width, height = image.size  # from the header: nothing is decoded yet
        check_pixels(width, height, limits)
        tags = {"width": str(width), "height": str(height), "format": image.format or ""}
        tags.update(_exif_tags(image))
        with corrupt_as_permanent("image"):
            _decode(image)
    return Extracted(
        media_type=media_type,
        text="",
        title=None,
        language=None,
        tags=clean_tags(tags),
        ocr_pages=(0,),
        kind="image",
    )


def _open_image(data: bytes, limits: ExtractLimits) -> Image.Image:
    """Image.open reads the header only. Pillow's own global bomb guard may still fire first
    (above 2 x Image.MAX_IMAGE_PIXELS); that is reported as our limit."""
    optional.load(optional.IMAGES)
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(io.BytesIO(data), formats=_PIL_FORMATS)
    except Image.DecompressionBombError as err:
        raise PermanentError(
            f"the image has too many pixels, over the limit of {limits.max_image_pixels:,} "
            f"(max_image_pixels): {detail(err)}"
        ) from err
    except UnidentifiedImageError as err:
        raise PermanentError(
            "the image is corrupt or not in a supported format (JPEG, PNG, WebP, TIFF, GIF, BMP)"
        ) from err
    except (OSError, ValueError, SyntaxError) as err:
        raise PermanentError(f"the image is corrupt or truncated: {detail(err)}") from err


def _decode(image: Image.Image) -> None:
    """Decode once so a truncated or corrupt file fails here, not in OCR. A JPEG is decoded
    at 1/8 scale (draft mode): as good a check, a fraction of the memory and time."""
    if image.format in ("JPEG", "MPO"):
        image.draft("RGB", (max(1, image.width // 8), max(1, image.height // 8)))
    image.load()


def _exif_tags(image: Image.Image) -> dict[str, str]:
    try:
        exif = image.getexif()
        details = exif.get_ifd(_EXIF_IFD)
        gps = exif.get_ifd(_GPS_IFD)
    except _EXIF_ERRORS:
        return {}
    tags: dict[str, str] = {}
    if camera := _camera(exif.get(_MAKE), exif.get(_MODEL)):
        tags["camera"] = camera
    taken = details.get(_DATETIME_ORIGINAL) or exif.get(_DATETIME)
    if taken_at := _exif_datetime(taken, details.get(_OFFSET_TIME_ORIGINAL)):
        tags["taken_at"] = taken_at
    if position := _gps(gps):
        tags["gps"] = position
    return tags


def _camera(make: Any, model: Any) -> str | None:
    """"Canon" + "Canon EOS 5D" is "Canon EOS 5D", not "Canon Canon EOS 5D"."""
    make_text, model_text = clean_tag(make or ""), clean_tag(model or "")
    if make_text and model_text.lower().startswith(make_text.lower()):
        return model_text
    return " ".join(part for part in (make_text, model_text) if part) or None


def _exif_datetime(value: Any, offset: Any) -> str | None:
    """EXIF "2024:05:17 14:03:22" (+ OffsetTimeOriginal "+02:00") -> ISO 8601."""
    if not value:
        return None
    try:
        moment = datetime.strptime(clean_tag(value), "%Y:%m:%d %H:%M:%S")
    except ValueError:
        return None
    iso = moment.isoformat()
    offset_text = clean_tag(offset or "")
    if len(offset_text) == 6 and offset_text[0] in "+-" and offset_text[3] == ":":
        iso += offset_text
    return iso


def _gps(gps: Any) -> str | None:
    """Degrees/minutes/seconds rationals and N/S, E/W refs -> "lat,lon" in decimal degrees."""
    try:
        lat = _degrees(gps.get(_GPS_LAT), gps.get(_GPS_LAT_REF), "S")
        lon = _degrees(gps.get(_GPS_LON), gps.get(_GPS_LON_REF), "W")
    except _EXIF_ERRORS:
        return None
    if lat is None or lon is None or abs(lat) > 90 or abs(lon) > 180:
        return None
    return f"{lat:.6f},{lon:.6f}"


def _degrees(dms: Any, ref: Any, negative_ref: str) -> float | None:
    if not dms or len(dms) != 3:
        return None
    degrees, minutes, seconds = (float(part) for part in dms)
    value = degrees + minutes / 60 + seconds / 3600
    if not math.isfinite(value):
        return None
    return -value if clean_tag(ref or "").upper() == negative_ref else value


def extract_audio(data: bytes, media_type: str) -> Extracted:
    tag = _read_audio_tags(data, media_type)
    duration = tag.duration if tag.duration and math.isfinite(tag.duration) else None
    if not duration and not (tag.title or tag.artist):
        raise PermanentError("the audio file is corrupt or truncated: no audio stream found")
    tags = clean_tags(
        {
            "duration_s": f"{duration:.1f}" if duration is not None else None,
            "artist": tag.artist,
            "album": tag.album,
            "albumartist": tag.albumartist,
            "title": tag.title,
            "genre": tag.genre,
            "year": tag.year,
            "track": tag.track,
            "composer": tag.composer,
            "bitrate": f"{tag.bitrate:.0f}" if tag.bitrate else None,  # kbit/s
            "samplerate": tag.samplerate,
            "channels": tag.channels,
        }
    )
    return Extracted(
        media_type=media_type,
        text=_describe(tags, duration),
        title=tags.get("title"),
        language=None,
        tags=tags,
        kind="audio",
    )


def _read_audio_tags(data: bytes, media_type: str) -> TinyTag:
    optional.load(optional.AUDIO)
    from tinytag import TinyTag, UnsupportedFormatError

    with corrupt_as_permanent("audio file"):
        try:
            return TinyTag.get(file_obj=io.BytesIO(data))
        except UnsupportedFormatError as err:
            raise PermanentError(
                f"the audio file is corrupt or not really {media_type}: its bytes match no "
                "audio format memmill reads (MP3, M4A, Ogg, FLAC, WAV)"
            ) from err


def _describe(tags: dict[str, str], duration: float | None) -> str:
    """A one-line description, e.g. "Audio: Hey Jude by The Beatles (1968), 7:11", so the
    item can be found by a search on its tags."""
    text = f"Audio: {tags.get('title') or 'untitled'}"
    if artist := tags.get("artist"):
        text += f" by {artist}"
    if album := tags.get("album"):
        text += f" ({album})"
    if duration:
        text += f", {_clock(duration)}"
    return text


def _clock(seconds: float) -> str:
    """205.4 -> "3:25"; an hour or more -> "1:02:05"."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
