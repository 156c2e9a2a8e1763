"""Turning one input image file into what a record stores: JPEG bytes, or uint8 pixels, or a reject.

Two entry points share every rule below: `normalise_image` (one image, as JPEG) and
`store_image` (an image field of a record, in one of `IMAGE_KINDS`), with `read_header` (its
`ImageHeader.upright` size) and `plan_geometry` to fit a record's images together before any is
decoded.

The rules, each applied in one place:

- **Headers first.** Sizes and the EXIF orientation come from the headers, never from decoding:
  a JPEG's marker segments (`format.jpeg.read_jpeg_info`), other formats' as Pillow reads them on
  opening (and a PNG's eXIf chunk wherever it lies). An image over `max_pixels`, or a 12-bit or
  lossless JPEG, is rejected from there, before anything is decoded.
- **Every JPEG is checked strictly.** A strict libjpeg-turbo decode at 1/8 scale reads every
  entropy-coded byte, so a truncated or damaged JPEG is rejected ("corrupt"), whether it would be
  kept, re-encoded or stored as pixels (Pillow alone would decode damaged data without a word).
- **Kept when possible.** A baseline 8-bit JPEG with 1 or 3 components, EXIF orientation 1 and
  no reshaping is stored byte for byte. Anything else stored as JPEG is re-encoded (baseline,
  at `quality`) and counted under the first matching reason of `REENCODE_REASONS`: "not-jpeg",
  "cmyk" (4 components), "exif-rotated", "progressive", "resized". A progressive JPEG that needs
  nothing else keeps its quantisation tables and subsampling (Pillow's ``quality="keep"``).
- **Upright.** Decoded pixels are turned by the orientation the headers gave.
- **Eight bits.** 16-bit samples keep their 8 high bits; a 32-bit integer image ("I") keeps its
  values when none is over 255 (negative ones become 0), else is read as 16-bit; alpha is
  dropped unless the kind keeps it (as torchvision's ``convert("RGB")`` does); a palette with
  transparency goes through RGBA.
- **Gray or colour.** As JPEG, a source with one colour channel (1-bit, L, LA, 16-bit, I, F)
  stays grayscale (L), anything else becomes RGB. The other kinds say their mode: "raw" RGB
  (gray replicated, palette expanded), "gray" L, "rgba" RGBA (alpha 255 where the source has
  none), "mask" one channel of values: palette images keep their indices (not their colours), L
  its values, 1-bit 0 and 1, 16-bit values up to 255; a colour image is rejected ("unsupported").
- **Reshaped by a `Geometry`.** Shrunk to a longest side (``max_side``), or resized and
  center-cropped to a square ``patch``, planned from the upright size (`plan_geometry`); the
  same for every image of a record up to its scale. Masks are resized nearest-neighbour, so no
  new values appear; everything else with Lanczos. An image re-encoded as JPEG is first decoded
  by libjpeg at the largest reduction (1/2, 1/4 or 1/8) that keeps it at least the new size.
- **JPEG's size.** libjpeg neither decodes nor encodes a side over `JPEG_MAX_SIDE`: a JPEG input
  with a larger side is rejected from its header (even one that would pass through), and a JPEG
  to write may have no larger side, checked on the size it will have, before decoding; raw pixels
  of another format have no such bound.

Rejects raise `RejectError` with the reason "empty", "corrupt", "not-an-image", "too-large" or
(a mask only) "unsupported".
"""

from __future__ import annotations

import io
import struct
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from .._errors import RejectError
from ..format._jpeg import JpegInfo, is_jpeg, read_jpeg_info

__all__ = [
    "DEFAULT_QUALITY",
    "IMAGE_KINDS",
    "JPEG_MAX_SIDE",
    "MAX_PIXELS",
    "REENCODE_REASONS",
    "Geometry",
    "ImageHeader",
    "NormalisedImage",
    "StoredImage",
    "normalise_image",
    "plan_geometry",
    "read_header",
    "store_image",
]

MAX_PIXELS: Final = 89_478_485
"""Largest image accepted, in pixels (256 MiB as 24-bit RGB; Pillow's own decompression-bomb
threshold). Larger images are rejected as "too-large" from their header, before decoding."""
JPEG_MAX_SIDE: Final = 65_500
"""libjpeg's JPEG_MAX_DIMENSION: it encodes no JPEG with a longer side (the frame header could
hold 65,535)."""
DEFAULT_QUALITY: Final = 90
REENCODE_REASONS: Final = ("not-jpeg", "cmyk", "exif-rotated", "progressive", "resized")
"""Why an image was re-encoded, in the order the first matching one is chosen."""
IMAGE_KINDS: Final = ("jpeg", "raw", "gray", "rgba", "mask")
"""How an image field can be stored: JPEG bytes, or pixels in the mode of `_MODES`."""

_MODES: Final = {"raw": "RGB", "gray": "L", "rgba": "RGBA", "mask": "L"}
_GRAY_MODES: Final = frozenset({"1", "L", "LA", "La", "F"})
"""Pillow modes with one colour channel, once integer images are 8-bit L (`_to_8bit`)."""
_ORIENTATION_TAG: Final = 0x0112
_TRANSPOSE: Final = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
"""What each EXIF orientation asks to be done to the stored image to make it upright."""
_TURNED: Final = frozenset({5, 6, 7, 8})
"""EXIF orientations that swap width and height."""
_BOMB: Final = (Image.DecompressionBombWarning, Image.DecompressionBombError)


@dataclass(frozen=True)
class NormalisedImage:
    """A JPEG ready to store.

    Attributes:
        data: the JPEG bytes: the input itself when `reencoded` is None.
        reencoded: None for a byte-for-byte pass-through, else one of `REENCODE_REASONS`.
        info: the headers of `data` when it is the input passed through (read once here, so
            the writer need not parse them again; see `format.fieldtypes.HeadedJpeg`).
    """

    data: bytes
    reencoded: str | None
    info: JpegInfo | None = None


@dataclass(frozen=True)
class StoredImage:
    """A record's value for one image field: JPEG bytes or a uint8 array H x W (x C), why it
    was re-encoded (None when kept byte for byte or stored as pixels), and the headers of JPEG
    bytes that are the input passed through (as a `NormalisedImage` holds them)."""

    value: bytes | np.ndarray
    reencoded: str | None
    info: JpegInfo | None = None


@dataclass(frozen=True)
class Geometry:
    """Resize to `size` (width, height), then keep `crop` (left, top, right, bottom) if given."""

    size: tuple[int, int]
    crop: tuple[int, int, int, int] | None = None

    def scaled(self, factor: int) -> Geometry:
        """The same reshaping for an image `factor` times larger on each side."""
        crop = self.crop
        if crop is not None:
            crop = (crop[0] * factor, crop[1] * factor, crop[2] * factor, crop[3] * factor)
        return Geometry((self.size[0] * factor, self.size[1] * factor), crop)

    @property
    def final_size(self) -> tuple[int, int]:
        """(width, height) of the reshaped image."""
        if self.crop is None:
            return self.size
        left, top, right, bottom = self.crop
        return right - left, bottom - top


@dataclass(frozen=True)
class ImageHeader:
    """What an image file's headers say (`read_header`): its size as stored, its orientation, and
    for a JPEG the rest."""

    width: int
    height: int
    orientation: int
    jpeg: JpegInfo | None

    @property
    def upright(self) -> tuple[int, int]:
        """(width, height) once turned by the orientation."""
        return (self.height, self.width) if self.orientation in _TURNED else (self.width, self.height)


def plan_geometry(width: int, height: int, *, max_side: int | None, patch: int | None) -> Geometry | None:
    """Return how to reshape a `width` x `height` image, or None to keep it as it is.

    Args:
        width, height: the upright size (`ImageHeader.upright`).
        max_side: M shrinks the image so that its longer side is M, if it is longer (aspect kept).
        patch: N resizes so that the shorter side is N (up or down, aspect kept), then keeps the
            centered N x N square; it takes precedence over `max_side`.

    Returns:
        The reshaping, or None when the image already has the size asked for.
    """
    if patch is not None:
        if width <= height:
            size = (patch, max(patch, round(height * patch / width)))
        else:
            size = (max(patch, round(width * patch / height)), patch)
        left, top = (size[0] - patch) // 2, (size[1] - patch) // 2
        if size == (width, height) == (patch, patch):
            return None
        return Geometry(size, (left, top, left + patch, top + patch))
    if max_side is not None and max(width, height) > max_side:
        factor = max_side / max(width, height)
        return Geometry((max(1, round(width * factor)), max(1, round(height * factor))))
    return None


def normalise_image(
    data: bytes,
    *,
    max_side: int | None = None,
    quality: int = DEFAULT_QUALITY,
    max_pixels: int = MAX_PIXELS,
) -> NormalisedImage:
    """Return JPEG bytes for one input file, passed through when possible, else re-encoded.

    Args:
        data: the whole file.
        max_side: shrink images whose longer side exceeds this many pixels (aspect kept);
            None keeps every size.
        quality: JPEG quality (1 to 100) of re-encoded images.
        max_pixels: reject images with more pixels than this, from the header.

    Returns:
        The JPEG bytes and why they were re-encoded (None if they are the input's bytes).

    Raises:
        RejectError: reason "empty" (no bytes), "corrupt" (a decoder failed), "not-an-image"
            (no known format) or "too-large" (over `max_pixels`, or a side over `JPEG_MAX_SIDE`
            once shrunk to `max_side`).
    """
    header = read_header(data, max_pixels=max_pixels)
    geometry = plan_geometry(*header.upright, max_side=max_side, patch=None)
    return _to_jpeg(data, header, geometry=geometry, quality=quality)


def store_image(
    data: bytes, *, kind: str, geometry: Geometry | None, quality: int, max_pixels: int = MAX_PIXELS, header: ImageHeader | None = None
) -> StoredImage:
    """Return the stored form of one image file for a field of `kind` (see the module docstring).

    Args:
        data: the whole file.
        kind: one of `IMAGE_KINDS`.
        geometry: how to reshape the upright image (`plan_geometry`, scaled per field), or None.
        quality: JPEG quality (1 to 100) of a re-encoded "jpeg" image.
        max_pixels: reject images with more pixels than this, from the header.
        header: `data`'s headers when already read (`read_header`, with `max_pixels`).

    Returns:
        JPEG bytes and why they were re-encoded, or a uint8 array H x W ("gray", "mask") or
        H x W x C (C 3 for "raw", 4 for "rgba").

    Raises:
        RejectError: the reasons of `normalise_image`, or "unsupported" for a mask that is not
            one channel of values up to 255.
    """
    if header is None:
        header = read_header(data, max_pixels=max_pixels)
    if kind == "jpeg":
        normalised = _to_jpeg(data, header, geometry=geometry, quality=quality)
        return StoredImage(normalised.data, normalised.reencoded, normalised.info)
    if header.jpeg is not None:
        _check_decodes(data)
    with _opened(data) as image:
        pixels = _shape(image, header, mode=_MODES[kind], mask=kind == "mask", geometry=geometry, draft=False)
        array: np.ndarray[Any, Any] = np.asarray(pixels)
    return StoredImage(np.ascontiguousarray(array, dtype=np.uint8), None)


def read_header(data: bytes, *, max_pixels: int = MAX_PIXELS) -> ImageHeader:
    """Return what an image file's headers say, rejecting what must not be decoded.

    Raises:
        RejectError: "empty", "not-an-image", "corrupt" (broken headers, a 12-bit or lossless
            JPEG) or "too-large" (over `max_pixels`, or a JPEG side over `JPEG_MAX_SIDE`).
    """
    if not data:
        raise RejectError("the file is empty", reason="empty")
    info: JpegInfo | None = None
    if is_jpeg(data):
        try:
            info = read_jpeg_info(data)
        except ValueError as err:
            raise RejectError(f"JPEG headers are broken: {err}", reason="corrupt") from err
        width, height, orientation = info.width, info.height, info.orientation
        _check_pixels(width, height, max_pixels)
        if info.precision != 8 or info.lossless:
            raise RejectError(
                f"{info.precision}-bit{' lossless' if info.lossless else ''} JPEG: only 8-bit lossy JPEGs can be decoded",
                reason="corrupt",
            )
        if max(width, height) > JPEG_MAX_SIDE:  # libjpeg decodes no larger side, even to check it
            raise RejectError(f"{width}x{height} has a side over libjpeg's limit of {JPEG_MAX_SIDE}", reason="too-large")
    else:
        with _opened(data) as image:
            width, height = image.size
            _check_pixels(width, height, max_pixels)
            orientation = _exif_orientation(image, data)
    return ImageHeader(width, height, orientation, info)


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise RejectError(f"{width}x{height} is {width * height} pixels, over the limit of {max_pixels}", reason="too-large")


def _exif_orientation(image: Image.Image, data: bytes) -> int:
    """The orientation tag as the headers give it, 1 when absent or malformed (as for a JPEG)."""
    try:
        # The base class's reader: PNG's own decodes the whole image to reach an eXIf chunk
        # stored after the pixel data, which `_png_late_exif` finds by walking the chunks.
        exif = Image.Image.getexif(image)
        if _ORIENTATION_TAG not in exif and image.format == "PNG" and (late := _png_late_exif(data)) is not None:
            exif = Image.Exif()
            exif.load(late)
        value = exif.get(_ORIENTATION_TAG, 1)
    except Exception:  # noqa: BLE001  (Pillow's EXIF parser raises many types on malformed blocks)
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _png_late_exif(data: bytes) -> bytes | None:
    """The payload of a PNG's eXIf chunk, found without decoding (it may follow the pixel data)."""
    pos = 8  # after the signature; each chunk is length (u32 BE), type, data, CRC
    while pos + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind == b"eXIf":
            return data[pos + 8 : pos + 8 + length]
        if kind == b"IEND":
            return None
        pos += 12 + length
    return None


def _check_decodes(data: bytes) -> None:
    """Reject a JPEG that a strict decode refuses (truncated, damaged entropy data)."""
    try:
        # Grayscale at 1/8 scale: every entropy-coded byte is still decoded (so truncation and
        # damage are caught) but colour conversion is skipped: 3% less CPU than RGB.
        simplejpeg.decode_jpeg(data, colorspace="GRAY", min_height=1, min_width=1, min_factor=8, strict=True)
    except ValueError as err:
        raise RejectError(f"JPEG does not decode: {err}", reason="corrupt") from err


def _reencode_reason(header: ImageHeader, *, reshaped: bool) -> str | None:
    """The first of `REENCODE_REASONS` that applies, or None to keep the file as it is."""
    if header.jpeg is None:
        return "not-jpeg"
    if header.jpeg.components not in (1, 3):
        return "cmyk"
    if header.orientation != 1:
        return "exif-rotated"
    if header.jpeg.progressive:
        return "progressive"
    if reshaped:
        return "resized"
    return None


def _to_jpeg(data: bytes, header: ImageHeader, *, geometry: Geometry | None, quality: int) -> NormalisedImage:
    """The file itself when it can be kept, else the upright image reshaped by `geometry` and re-encoded."""
    reason = _reencode_reason(header, reshaped=geometry is not None)
    if header.jpeg is not None:
        _check_decodes(data)
    if reason is None:
        return NormalisedImage(data, None, header.jpeg)
    width, height = geometry.final_size if geometry is not None else header.upright
    if max(width, height) > JPEG_MAX_SIDE:
        raise RejectError(f"{width}x{height} has a side over libjpeg's limit of {JPEG_MAX_SIDE}", reason="too-large")
    out = io.BytesIO()
    with _opened(data) as image:
        if reason == "progressive" and geometry is None:
            image.load()
            try:
                image.save(out, "JPEG", quality="keep", subsampling="keep")
                return NormalisedImage(out.getvalue(), reason)
            except ValueError:  # Tables Pillow cannot reuse: fall back to the stated quality.
                out = io.BytesIO()
        pixels = _shape(image, header, mode=None, mask=False, geometry=geometry, draft=True)
        pixels.save(out, "JPEG", quality=quality)
    return NormalisedImage(out.getvalue(), reason)


@contextmanager
def _opened(data: bytes) -> Iterator[Image.Image]:
    """Image.open; Pillow's failures, on opening or while decoding in the block, become rejects,
    its decompression-bomb warning "too-large", and its other warnings are kept off stderr."""
    with warnings.catch_warnings():
        # Pillow's other warnings (palette transparency, odd EXIF) change nothing about the result.
        warnings.simplefilter("ignore")
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
        except UnidentifiedImageError as err:
            raise RejectError("no image format recognises the file", reason="not-an-image") from err
        except _BOMB as err:
            raise RejectError(str(err), reason="too-large") from err
        except Exception as err:  # Pillow's plugins raise many types on malformed headers.
            raise RejectError(f"{type(err).__name__}: {err}", reason="corrupt") from err
        try:
            yield image
        except RejectError:
            raise
        except _BOMB as err:
            raise RejectError(str(err), reason="too-large") from err
        except Exception as err:  # Decoding untrusted bytes: any failure is this file's fault.
            raise RejectError(f"{type(err).__name__}: {err}", reason="corrupt") from err
        finally:
            image.close()


def _shape(
    image: Image.Image, header: ImageHeader, *, mode: str | None, mask: bool, geometry: Geometry | None, draft: bool
) -> Image.Image:
    """Decode `image`, turn it upright, bring it to 8-bit `mode` (None: L for a gray source, else
    RGB) and reshape it by `geometry`; `draft` lets libjpeg decode at a reduced scale first."""
    if draft and geometry is not None:
        width, height = geometry.size
        image.draft(None, (height, width) if header.orientation in _TURNED else (width, height))
    image.load()
    method = _TRANSPOSE.get(header.orientation)
    pixels = _in_mode(image if method is None else image.transpose(method), mode, mask=mask)
    if geometry is not None:
        pixels = pixels.resize(geometry.size, Image.Resampling.NEAREST if mask else Image.Resampling.LANCZOS)
        if geometry.crop is not None:
            pixels = pixels.crop(geometry.crop)
    return pixels


def _in_mode(image: Image.Image, mode: str | None, *, mask: bool) -> Image.Image:
    """Return `image` as 8-bit `mode` (None: L for a gray source, else RGB); a mask keeps its values."""
    image = _to_8bit(image, mask=mask)
    source = image.mode
    if mask:
        if source in ("L", "P", "1"):
            return image  # gray values, palette indices, or 0/1
        raise RejectError(f"a {source} image is not a mask: store one channel of class values (L, P or 1)", reason="unsupported")
    if mode is None:
        mode = "L" if source in _GRAY_MODES else "RGB"
    if source == mode:
        return image
    if source == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    return image.convert(mode)


def _to_8bit(image: Image.Image, *, mask: bool) -> Image.Image:
    """Return an integer image ("I", "I;16...") as 8-bit L, any other unchanged. A mask keeps its
    values or is rejected; else 16-bit samples keep their 8 high bits."""
    source = image.mode
    if not (source == "I" or source.startswith("I;16")):
        return image
    values: np.ndarray[Any, Any] = np.asarray(image)
    if mask:
        low, high = int(values.min(initial=0)), int(values.max(initial=0))
        if low < 0 or high > 255:
            raise RejectError(f"a {source} mask holds values from {low} to {high}; a raw mask holds 0 to 255", reason="unsupported")
    elif source != "I" or int(values.max(initial=0)) > 255:
        values = np.clip(values, 0, 65535) >> 8  # 16-bit samples: keep the 8 high bits
    return Image.fromarray(np.clip(values, 0, 255).astype(np.uint8), "L")
