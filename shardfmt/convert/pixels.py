"""Turning one input image into what a multi-field record stores: JPEG bytes or raw pixels.

The converter's image kinds, each a way to store a source image:

- "jpeg": as the single-image converter does (`normalise.normalise_image`): kept byte for byte
  when possible, else re-encoded; a "jpeg" field.
- "raw": decoded, turned upright, RGB (gray replicated, palette expanded, alpha dropped): a
  3-channel "raw" field, for images that should load without a decode.
- "gray": 1 channel (L); "rgba": 4 channels (alpha 255 where the source has none).
- "mask": 1 channel of values, for segmentation masks: palette images keep their indices (not
  their colours), L its values, 1-bit 0 and 1, 16-bit values up to 255; a colour image is
  rejected ("unsupported"), since its colours are not class values. Masks are resized with
  nearest-neighbour, so no new values appear; everything else with Lanczos.

`Geometry` says how an image is reshaped, the same for every image of a record up to its scale:
shrunk to a longest side (``max_side``), or resized and center-cropped to a square ``patch``.
Sizes are read from the headers first (`upright_size`), so a record whose images do not fit
together is rejected before anything is decoded.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ..errors import RejectError
from ..format.jpeg import is_jpeg, read_jpeg_info
from .normalise import MAX_PIXELS, normalise_image

__all__ = ["IMAGE_KINDS", "Geometry", "StoredImage", "plan_geometry", "store_image", "upright_size"]

IMAGE_KINDS: Final = ("jpeg", "raw", "gray", "rgba", "mask")
_MODES: Final = {"raw": "RGB", "gray": "L", "rgba": "RGBA", "mask": "L"}
_GRAY_MODES: Final = frozenset({"1", "L", "LA", "La", "I", "F", "I;16", "I;16B", "I;16L", "I;16N"})
_TURNED: Final = frozenset({5, 6, 7, 8})
"""EXIF orientations that swap width and height."""


@dataclass(frozen=True)
class StoredImage:
    """A record's value for one image field: JPEG bytes or a uint8 array H x W (x C), and why it
    was re-encoded (None when kept byte for byte or stored as pixels)."""

    value: bytes | np.ndarray
    reencoded: str | None


@dataclass(frozen=True)
class Geometry:
    """Resize to `size` (width, height), then keep `crop` (left, top, right, bottom) if given."""

    size: tuple[int, int]
    crop: tuple[int, int, int, int] | None = None

    def scaled(self, factor: int) -> Geometry:
        """The same reshaping for an image `factor` times larger on each side."""
        crop = tuple(v * factor for v in self.crop) if self.crop is not None else None
        return Geometry((self.size[0] * factor, self.size[1] * factor), crop)  # type: ignore[arg-type]


def plan_geometry(width: int, height: int, *, max_side: int | None, patch: int | None) -> Geometry | None:
    """Return how to reshape a `width` x `height` image, or None to keep it as it is.

    `patch` N: resize so the shorter side is N (up or down, aspect kept), then take the centered
    N x N square. `max_side` M: shrink so the longer side is M, if it is longer.
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


def upright_size(data: bytes, *, max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """Return (width, height) of an image file as it will be stored (EXIF orientation applied),
    from its headers only.

    Raises:
        RejectError: "empty", "not-an-image", "corrupt" (broken headers) or "too-large".
    """
    if not data:
        raise RejectError("the file is empty", reason="empty")
    if is_jpeg(data):
        try:
            info = read_jpeg_info(data)
        except ValueError as err:
            raise RejectError(f"JPEG headers are broken: {err}", reason="corrupt") from err
        width, height, orientation = info.width, info.height, info.orientation
    else:
        with _opened(data) as image:
            width, height = image.size
            orientation = int(image.getexif().get(0x0112, 1) or 1)
    if width * height > max_pixels:
        raise RejectError(f"{width}x{height} is {width * height} pixels, over the limit of {max_pixels}", reason="too-large")
    return (height, width) if orientation in _TURNED else (width, height)


def store_image(data: bytes, *, kind: str, geometry: Geometry | None, quality: int, max_pixels: int = MAX_PIXELS) -> StoredImage:
    """Return the stored form of one image file for a field of `kind` (see the module docstring).

    Raises:
        RejectError: the codes of `normalise_image`, or "unsupported" for a mask that is not one
            channel of values up to 255.
    """
    if kind == "jpeg" and geometry is None:
        normalised = normalise_image(data, quality=quality, max_pixels=max_pixels)
        return StoredImage(normalised.data, normalised.reencoded)
    upright_size(data, max_pixels=max_pixels)  # the pixel limit, before decoding
    with _opened(data) as image:
        try:
            image.load()
            upright = ImageOps.exif_transpose(image)
            mode = ("L" if upright.mode in _GRAY_MODES else "RGB") if kind == "jpeg" else _MODES[kind]
            pixels = _in_mode(upright, mode, mask=kind == "mask")
            if geometry is not None:
                resample = Image.Resampling.NEAREST if kind == "mask" else Image.Resampling.LANCZOS
                pixels = pixels.resize(geometry.size, resample)
                if geometry.crop is not None:
                    pixels = pixels.crop(geometry.crop)
        except RejectError:
            raise
        except (Image.DecompressionBombWarning, Image.DecompressionBombError) as err:
            raise RejectError(str(err), reason="too-large") from err
        except Exception as err:  # Decoding untrusted bytes: any failure is this file's fault.
            raise RejectError(f"{type(err).__name__}: {err}", reason="corrupt") from err
    if kind == "jpeg":
        out = io.BytesIO()
        pixels.save(out, "JPEG", quality=quality)
        return StoredImage(out.getvalue(), "resized")
    array: np.ndarray[Any, Any] = np.asarray(pixels)
    if pixels.mode == "1":
        array = array.astype(np.uint8)
    return StoredImage(np.ascontiguousarray(array, dtype=np.uint8), None)


class _opened:
    """Image.open with decompression-bomb warnings as rejects and Pillow's other warnings quiet."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._warnings = warnings.catch_warnings()

    def __enter__(self) -> Image.Image:
        self._warnings.__enter__()
        warnings.simplefilter("ignore")
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            self.image = Image.open(io.BytesIO(self.data))
        except UnidentifiedImageError as err:
            self._warnings.__exit__(None, None, None)
            raise RejectError("no image format recognises the file", reason="not-an-image") from err
        except (Image.DecompressionBombWarning, Image.DecompressionBombError) as err:
            self._warnings.__exit__(None, None, None)
            raise RejectError(str(err), reason="too-large") from err
        except Exception as err:  # Pillow's plugins raise many types on malformed headers.
            self._warnings.__exit__(None, None, None)
            raise RejectError(f"{type(err).__name__}: {err}", reason="corrupt") from err
        return self.image

    def __exit__(self, *exc: object) -> None:
        self.image.close()
        self._warnings.__exit__(None, None, None)


def _in_mode(image: Image.Image, mode: str, *, mask: bool) -> Image.Image:
    """Return `image` as 8-bit `mode` ("RGB", "L", "RGBA"); a mask keeps its values."""
    source = image.mode
    if source.startswith("I;16") or source == "I":
        values: np.ndarray[Any, Any] = np.asarray(image)
        if mask:
            if int(values.max(initial=0)) > 255 or int(values.min(initial=0)) < 0:
                raise RejectError(f"a {source} mask holds values up to {int(values.max())}; a raw mask holds 0 to 255", reason="unsupported")
        elif source != "I" or int(values.max(initial=0)) > 255:
            values = np.clip(values, 0, 65535) >> 8  # 16-bit samples: keep the 8 high bits
        image = Image.fromarray(values.astype(np.uint8), "L")
        source = "L"
    if mask:
        if source in ("L", "P", "1"):
            return image  # palette indices, gray values, or 0/1
        raise RejectError(f"a {source} image is not a mask: store one channel of class values (L, P or 1)", reason="unsupported")
    if source == mode:
        return image
    if source == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    return image.convert(mode)
