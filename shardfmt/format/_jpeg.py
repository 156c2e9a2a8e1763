"""JPEG marker parsing: size, components, coding process and EXIF orientation, without decoding.

Reads only the marker segments before the first scan, so it costs microseconds; the converter
uses it to decide what to pass through, and the writer to fill the image columns of the table.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["JpegInfo", "read_jpeg_info", "is_jpeg"]

_SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_PROGRESSIVE = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
_LOSSLESS_OR_HIERARCHICAL = frozenset({0xC3, 0xC5, 0xC6, 0xC7, 0xCB, 0xCD, 0xCE, 0xCF})
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})
_DHP = 0xDE
"""Define Hierarchical Progression: present only in hierarchical JPEGs, whose frames are several."""


@dataclass(frozen=True)
class JpegInfo:
    """What the headers of a JPEG say.

    Attributes:
        height, width: frame size in pixels.
        components: 1 (grayscale), 3 (YCbCr or RGB) or 4 (CMYK or YCCK).
        progressive: coded with the progressive process (decodes 2-3x slower).
        lossless: lossless or hierarchical process, which libjpeg-turbo's default build cannot decode.
        precision: bits per sample (8 for nearly every JPEG; 12 needs a special build).
        orientation: EXIF orientation 1..8; 1 when there is no EXIF or no orientation tag.
        adobe_transform: the APP14 Adobe transform byte, or None without an Adobe segment.
    """

    height: int
    width: int
    components: int
    progressive: bool
    lossless: bool
    precision: int
    orientation: int
    adobe_transform: int | None


def is_jpeg(data: bytes | memoryview) -> bool:
    """Return True if `data` starts with a JPEG SOI marker followed by another marker."""
    return bytes(data[:3]) == b"\xff\xd8\xff"


def read_jpeg_info(data: bytes | memoryview) -> JpegInfo:
    """Parse the marker segments of a JPEG up to its first scan.

    Args:
        data: the whole file, or at least everything before the first SOS marker.

    Returns:
        The frame's size, components and coding process, and the EXIF orientation.

    Raises:
        ValueError: not a JPEG, a segment runs past the end, no frame header or two frame headers
            before the first scan, or a zero size (a DNL-defined height is not supported). A
            hierarchical JPEG (a DHP segment) has several frames; it is reported as `lossless`
            (not decodable by libjpeg-turbo), whatever its first frame header says.
    """
    view = memoryview(data)
    if len(view) < 4 or view[0] != 0xFF or view[1] != 0xD8:
        raise ValueError("no JPEG start-of-image marker")
    frame: tuple[int, int, int, int, int] | None = None
    orientation = 1
    adobe: int | None = None
    hierarchical = False
    for marker, offset, segment in _segments(view):
        if marker in _SOF_MARKERS:
            if len(segment) < 6:
                raise ValueError(f"byte {offset}: frame header of {len(segment)} bytes is too short")
            if frame is not None:
                raise ValueError(f"byte {offset}: a second frame header (SOF) before the first scan")
            precision, height, width, components = struct.unpack(">BHHB", segment[:6])
            frame = (marker, precision, height, width, components)
        elif marker == _DHP:
            hierarchical = True
        elif marker == 0xE1 and bytes(segment[:6]) == b"Exif\x00\x00":
            orientation = _exif_orientation(segment[6:])
        elif marker == 0xEE and bytes(segment[:5]) == b"Adobe" and len(segment) >= 12:
            adobe = segment[11]
    if frame is None:
        raise ValueError("no frame header (SOF) before the first scan")
    marker, precision, height, width, components = frame
    if height == 0 or width == 0:
        raise ValueError(f"frame size {width}x{height} has a zero side")
    return JpegInfo(
        height=height,
        width=width,
        components=components,
        progressive=marker in _PROGRESSIVE,
        lossless=hierarchical or marker in _LOSSLESS_OR_HIERARCHICAL,
        precision=precision,
        orientation=orientation,
        adobe_transform=adobe,
    )


def _segments(view: memoryview) -> Iterator[tuple[int, int, memoryview]]:
    """Yield (marker, byte offset of the marker, segment body) for each marker segment after SOI,
    up to and including the first scan's (SOS); standalone markers have no segment and are
    skipped. Raise ValueError where the file ends or a segment runs past it."""
    size = len(view)
    pos = 2
    while True:
        if pos >= size:
            raise ValueError(f"file ends at byte {size} before the first scan")
        if view[pos] != 0xFF:
            raise ValueError(f"byte {pos}: expected a marker (0xFF), found 0x{view[pos]:02X}")
        while pos < size and view[pos] == 0xFF:
            pos += 1
        if pos >= size:
            raise ValueError(f"file ends at byte {size} inside a marker")
        marker = view[pos]
        pos += 1
        if marker in _STANDALONE:
            continue
        if marker == 0xD9:
            raise ValueError(f"byte {pos - 2}: end-of-image marker before any scan")
        if pos + 2 > size:
            raise ValueError(f"file ends at byte {size} inside the length of marker 0x{marker:02X}")
        length = (view[pos] << 8) | view[pos + 1]
        if length < 2 or pos + length > size:
            raise ValueError(
                f"byte {pos - 2}: marker 0x{marker:02X} segment of {length} bytes runs past the end ({size})"
            )
        yield marker, pos - 2, view[pos + 2 : pos + length]
        if marker == 0xDA:
            return
        pos += length


def _exif_orientation(tiff: memoryview) -> int:
    """Return the orientation tag (0x0112) of IFD0 of a TIFF-structured EXIF block, or 1."""
    if len(tiff) < 8:
        return 1
    order = bytes(tiff[:2])
    if order == b"II":
        endian = "<"
    elif order == b"MM":
        endian = ">"
    else:
        return 1
    (ifd,) = struct.unpack(endian + "I", tiff[4:8])
    if ifd + 2 > len(tiff):
        return 1
    (count,) = struct.unpack(endian + "H", tiff[ifd : ifd + 2])
    for i in range(count):
        entry = ifd + 2 + 12 * i
        if entry + 12 > len(tiff):
            return 1
        tag, type_ = struct.unpack(endian + "HH", tiff[entry : entry + 4])
        if tag == 0x0112 and type_ == 3:
            (value,) = struct.unpack(endian + "H", tiff[entry + 8 : entry + 10])
            return value if 1 <= value <= 8 else 1
    return 1
