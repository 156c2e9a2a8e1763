"""Decode only the part of a JPEG that a crop box needs, with libjpeg-turbo's partial decoding.

simplejpeg decodes whole images. libjpeg-turbo can do less: ``jpeg_skip_scanlines`` passes over
the rows above the box without the inverse DCT, colour conversion or upsampling,
``jpeg_crop_scanline`` limits that work to the box's columns (widened to iMCU boundaries), and
the decode stops after the box's last row, so the entropy-coded data below it is never read. For
RandomResizedCrop boxes of 416x362 photographs that is about a fifth less decoding work; with
the cost of calling in from Python (libjpeg returns two rows a call, about 0.7 us a call) a box
costs about 745 us as 3-byte pixels and 710 as 4-byte ones, where simplejpeg's whole fast
decode costs 820 (400 crops, one core here). The pixels are those
of simplejpeg's fast decode (fast integer IDCT, merged upsampling), bit for bit (tested).

The library is the libjpeg-turbo that Pillow's Linux wheels ship (``pillow.libs/libjpeg-*.so.62*``,
the libjpeg 6.2 ABI, whose structure sizes below are fixed by that ABI), called through cffi in
ABI mode: no compiler, and about 0.7 us a call, where ctypes takes about 1.2 us and its
overhead ate the whole gain. The declarations (`_CDEF`) come already parsed, in cffi's
out-of-line form (`_jpeglib_abi.py`, written by ``tools/make_jpeglib_abi.py``): parsing them
with pycparser took about 60 ms in every worker process, loading the module takes 3. Where that
library is missing (other platforms, other wheels) `CropDecoder.available()` is False and the
loader decodes whole images with simplejpeg.

Safety. libjpeg reports a fatal error by calling ``exit()`` (it cannot raise into Python), so a
`CropDecoder` is only used in loader worker processes, and only on a record whose bytes the loader
has already decoded with simplejpeg (which raises on corrupt data) and whose checksum it has
checked, or whose checksum has just matched in a dataset whose manifest says the converter
strictly decoded every JPEG (``strict_jpeg``): such bytes decode without error. A worker that still
exits inside a partial decode is replaced by the loader, which warns once naming the shard and
record and decodes that record whole from then on (`loader.pool`). The decoder's error handler
prints libjpeg's message and ends the process with ``os._exit(1)`` rather than libjpeg's
``exit(1)``: ``exit`` runs the exit handlers of every library loaded, and in a worker forked from a
process that had imported Ray they never returned, so the worker hung instead of dying. Set ``SHARDFMT_PARTIAL_DECODE=0`` to turn it off.
"""

from __future__ import annotations

import glob
import os
import platform
import struct
import sys
from typing import Any

import numpy as np

__all__ = ["CropDecoder"]

_DECOMPRESS_SIZE = 632  # sizeof(struct jpeg_decompress_struct), libjpeg 6.2 ABI, LP64
_ERROR_MGR_SIZE = 168  # sizeof(struct jpeg_error_mgr)
_FORMAT_MESSAGE = 24 // 8  # jpeg_error_mgr.format_message, as an index of 8-byte pointers (error_exit is 0)
_MESSAGE_LENGTH = 200  # JMSG_LENGTH_MAX
_ABI_VERSION = 62
# int-sized fields of jpeg_decompress_struct, as indexes of 4-byte words (byte offset / 4)
_OUT_COLOR_SPACE, _DCT_METHOD, _FANCY_UPSAMPLING, _OUTPUT_WIDTH = 64 // 4, 96 // 4, 100 // 4, 136 // 4
_JCS_RGB, _JCS_EXT_RGBX, _JDCT_IFAST = 2, 7, 1  # J_COLOR_SPACE (libjpeg-turbo's extended spaces) and J_DCT_METHOD
_COLOR_SPACES = {3: _JCS_RGB, 4: _JCS_EXT_RGBX}
_ROW_PADDING = 32  # crop_scanline widens the box to iMCU columns: at most 31 pixels more

_CDEF = """
void *jpeg_std_error(void *err);
void jpeg_CreateDecompress(void *cinfo, int version, size_t structsize);
void jpeg_destroy_decompress(void *cinfo);
void jpeg_mem_src(void *cinfo, const unsigned char *buffer, unsigned long size);
int jpeg_read_header(void *cinfo, int require_image);
int jpeg_start_decompress(void *cinfo);
void jpeg_crop_scanline(void *cinfo, unsigned int *xoffset, unsigned int *width);
unsigned int jpeg_skip_scanlines(void *cinfo, unsigned int num_lines);
unsigned int jpeg_read_scanlines(void *cinfo, unsigned char **scanlines, unsigned int max_lines);
void jpeg_abort_decompress(void *cinfo);
"""

_loaded: tuple[Any, Any] | None = None  # (ffi, lib), None when unavailable or not looked for yet
_looked = False  # whether _load has looked for the library


def _library_path() -> str | None:
    if os.environ.get("SHARDFMT_PARTIAL_DECODE", "1") == "0":
        return None
    if not sys.platform.startswith("linux") or struct.calcsize("P") != 8 or platform.machine() not in ("x86_64", "aarch64"):
        return None
    try:
        import PIL
    except ImportError:
        return None
    site = os.path.dirname(os.path.dirname(os.path.abspath(PIL.__file__)))
    candidates = sorted(glob.glob(os.path.join(site, "pillow.libs", "libjpeg-*.so.62*")))
    return candidates[0] if candidates else None


def _load() -> tuple[Any, Any] | None:
    global _loaded, _looked
    if not _looked:
        _looked = True
        path = _library_path()
        if path is not None:
            try:
                from ._jpeglib_abi import ffi

                lib = ffi.dlopen(path)
                for name in ("jpeg_crop_scanline", "jpeg_skip_scanlines", "jpeg_mem_src"):
                    getattr(lib, name)
                _loaded = (ffi, lib)
            except (ImportError, OSError, AttributeError):
                _loaded = None
    return _loaded


def _fatal_error_handler(ffi: Any) -> Any:
    """A jpeg_error_mgr.error_exit that prints libjpeg's message and ends the process at once
    (see the module docstring); None where cffi cannot make a callback here."""

    def fatal_error(cinfo: Any) -> None:
        try:
            message = ffi.new(f"char[{_MESSAGE_LENGTH}]")
            error_mgr = ffi.cast("void ***", cinfo)[0]
            ffi.cast("void (*)(void *, char *)", error_mgr[_FORMAT_MESSAGE])(cinfo, message)
            os.write(2, ffi.string(message) + b"\n")
        finally:
            os._exit(1)

    try:
        return ffi.callback("void(void *)", fatal_error)
    except (MemoryError, RuntimeError, OSError):  # no executable memory for the callback: libjpeg's exit() stays
        return None


class CropDecoder:
    """Decode the box of a JPEG into a reused buffer, as RGB, with the fast IDCT and upsampling.

    Args:
        max_height, max_width: the largest image it will see (from the record table).
        pixel_bytes: 3 (RGB) or 4 (RGBX: the same RGB values, each pixel followed by a byte of
            255). libjpeg-turbo writes 4-byte pixels faster (about 710 us a RandomResizedCrop
            box of the bench's 416x362 photographs, where RGB takes 745), and torch's resize
            reads them without first widening 3-byte pixels to 4 (about 10 us less a box).
    """

    @staticmethod
    def available() -> bool:
        """Whether libjpeg-turbo's partial decoding can be called here."""
        return _load() is not None

    def __init__(self, *, max_height: int, max_width: int, pixel_bytes: int = 3) -> None:
        if pixel_bytes not in _COLOR_SPACES:
            raise ValueError(f"pixel_bytes must be 3 or 4, got {pixel_bytes}")
        loaded = _load()
        if loaded is None:
            raise RuntimeError("libjpeg-turbo's partial decoding is not available here (see CropDecoder.available)")
        self._ffi, self._lib = ffi, lib = loaded
        self._error = ffi.new(f"char[{_ERROR_MGR_SIZE}]")
        self._cinfo = ffi.new(f"char[{_DECOMPRESS_SIZE}]")
        ffi.cast("void **", self._cinfo)[0] = lib.jpeg_std_error(self._error)
        self._on_fatal_error = _fatal_error_handler(ffi)  # referenced here for as long as the decoder lives
        if self._on_fatal_error is not None:
            ffi.cast("void **", self._error)[0] = self._on_fatal_error
        lib.jpeg_CreateDecompress(self._cinfo, _ABI_VERSION, _DECOMPRESS_SIZE)
        self._words = ffi.cast("unsigned int *", self._cinfo)
        self.pixel_bytes = pixel_bytes
        self.row_stride = (max_width + _ROW_PADDING) * pixel_bytes
        self.buffer = np.empty(max(1, max_height) * self.row_stride, np.uint8)
        base = ffi.cast("unsigned char *", self.buffer.ctypes.data)
        self._rows = ffi.new("unsigned char *[]", max(1, max_height))
        for i in range(max(1, max_height)):
            self._rows[i] = base + i * self.row_stride
        # &rows[i] for every i, made once: the read loop runs once per two rows
        self._row_pointers = [self._rows + i for i in range(max(1, max_height))]
        self._offset = ffi.new("unsigned int *")
        self._width = ffi.new("unsigned int *")

    def decode(self, data: Any, *, top: int, left: int, box_height: int, box_width: int) -> int:
        """Decode rows [top, top + box_height) of columns covering [left, left + box_width) into
        `buffer`, row r at ``r * row_stride``; return the byte offset of the box's first pixel
        (its left edge in row 0). The box must lie inside the image (the caller checked it
        against the record table, which `read_header` agrees with for bytes decoded before)."""
        self.read_header(data)
        return self.decode_rows(top=top, left=left, box_height=box_height, box_width=box_width)

    def read_header(self, data: Any) -> None:
        """`decode`'s first step: take `data` and read its headers."""
        self._lib.jpeg_mem_src(self._cinfo, self._ffi.from_buffer(data), len(data))
        self._lib.jpeg_read_header(self._cinfo, 1)

    def decode_rows(self, *, top: int, left: int, box_height: int, box_width: int) -> int:
        """`decode`'s second step, once `read_header` has taken the data."""
        lib, cinfo, words = self._lib, self._cinfo, self._words
        words[_OUT_COLOR_SPACE] = _COLOR_SPACES[self.pixel_bytes]
        words[_DCT_METHOD] = _JDCT_IFAST
        words[_FANCY_UPSAMPLING] = 0
        lib.jpeg_start_decompress(cinfo)
        self._offset[0], self._width[0] = left, box_width
        lib.jpeg_crop_scanline(cinfo, self._offset, self._width)
        if top:
            lib.jpeg_skip_scanlines(cinfo, top)
        pointers, read, done = self._row_pointers, lib.jpeg_read_scanlines, 0
        while done < box_height:
            got = read(cinfo, pointers[done], box_height - done)
            if not got:  # cannot happen for bytes decoded before; never loop forever
                break
            done += got
        lib.jpeg_abort_decompress(cinfo)
        if done < box_height:
            raise ValueError(f"libjpeg-turbo delivered {done} of {box_height} rows")
        return (left - int(self._offset[0])) * self.pixel_bytes

    def close(self) -> None:
        if self._cinfo is not None:
            self._lib.jpeg_destroy_decompress(self._cinfo)
            self._cinfo = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
