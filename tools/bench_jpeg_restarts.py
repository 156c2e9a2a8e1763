"""What a lossless transcode of the stored JPEGs would save the loader's partial decode: restart
markers that let a decode start at the box's first MCU row, and Huffman tables optimised for
each image. Measured on the bench's photographs, per RandomResizedCrop box, on one core.

The loader's partial decode (`shardfmt.ops._jpegcrop.CropDecoder`) skips the inverse DCT and the
colour conversion outside the box, but it must entropy-decode every MCU row from the top of the
image to the box's last row: the Huffman-coded data of a row can only be found by decoding the
rows before it. A transcode that keeps the DCT coefficients (so the pixels, bit for bit: checked
here for every box) can change that:

- *restart markers* (``jpegtran -restart 1``): a marker at the start of every MCU row, where
  the decoder's DC predictions start again from zero, so a row's data can be found by searching
  for its marker. A decode then starts at the box's first MCU row: the headers with the image
  height less the rows skipped, then the entropy-coded data from that row's marker on (the
  "splice"; the decoder is told which marker number comes next);
- *optimised Huffman tables* (``jpegtran -optimize``): fewer bits to decode.

Each variant is decoded into the same reused buffer, box by box, in turn; a box's time is the
least of ``--repeats`` decodes, and the table gives their mean. libjpeg-turbo is the one the
loader calls (Pillow's); its compressor does the transcodes here.

    PYTHONPATH=.:tools python tools/bench_jpeg_restarts.py --work-dir /tmp/bench-augment --images 400
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cffi
import numpy as np
from bench_loader import generate_imagefolder, load_source

from shardfmt.ops import _jpegcrop
from shardfmt.ops._crop import RandomResizedCrop
from shardfmt.ops._jpegcrop import CropDecoder

# libjpeg 6.2 ABI, LP64, as the loader's decoder assumes (`_jpegcrop`); read from jpeglib.h with
# offsetof and sizeof
_COMPRESS_SIZE = 520  # sizeof(struct jpeg_compress_struct)
_OPTIMIZE_CODING = 264 // 4  # jpeg_compress_struct.optimize_coding, as an index of 4-byte words
_RESTART_IN_ROWS = 284 // 4  # jpeg_compress_struct.restart_in_rows
_MARKER_READER = 584  # jpeg_decompress_struct.marker, a pointer
_NEXT_RESTART_NUM = 32 // 4  # jpeg_marker_reader.next_restart_num, after three pointers and two booleans
_TRANSCODE_CDEF = """
void jpeg_CreateCompress(void *cinfo, int version, size_t structsize);
void jpeg_destroy_compress(void *cinfo);
void jpeg_mem_dest(void *cinfo, unsigned char **outbuffer, unsigned long *outsize);
void *jpeg_read_coefficients(void *cinfo);
void jpeg_copy_critical_parameters(void *src, void *dst);
void jpeg_write_coefficients(void *cinfo, void *coefficients);
void jpeg_finish_compress(void *cinfo);
int jpeg_finish_decompress(void *cinfo);
void free(void *pointer);
"""


class Transcoder:
    """Lossless transcodes with libjpeg's coefficient API (what jpegtran runs)."""

    def __init__(self, library: str) -> None:
        self.ffi = cffi.FFI()
        self.ffi.cdef(_jpegcrop._CDEF + _TRANSCODE_CDEF)
        self.lib = self.ffi.dlopen(library)
        self.libc = self.ffi.dlopen(None)

    def transcode(self, data: bytes, *, restart_rows: int, optimize: bool) -> bytes:
        ffi, lib = self.ffi, self.lib
        source_error, target_error = ffi.new("char[168]"), ffi.new("char[168]")
        source, target = ffi.new(f"char[{_jpegcrop._DECOMPRESS_SIZE}]"), ffi.new(f"char[{_COMPRESS_SIZE}]")
        ffi.cast("void **", source)[0] = lib.jpeg_std_error(source_error)
        ffi.cast("void **", target)[0] = lib.jpeg_std_error(target_error)
        lib.jpeg_CreateDecompress(source, _jpegcrop._ABI_VERSION, _jpegcrop._DECOMPRESS_SIZE)
        lib.jpeg_CreateCompress(target, _jpegcrop._ABI_VERSION, _COMPRESS_SIZE)
        output, size = ffi.new("unsigned char **"), ffi.new("unsigned long *")
        try:
            lib.jpeg_mem_src(source, ffi.from_buffer(data), len(data))
            lib.jpeg_read_header(source, 1)
            coefficients = lib.jpeg_read_coefficients(source)
            lib.jpeg_mem_dest(target, output, size)
            lib.jpeg_copy_critical_parameters(source, target)
            words = ffi.cast("int *", target)
            words[_RESTART_IN_ROWS], words[_OPTIMIZE_CODING] = restart_rows, int(optimize)
            lib.jpeg_write_coefficients(target, coefficients)
            lib.jpeg_finish_compress(target)
            lib.jpeg_finish_decompress(source)
            return bytes(ffi.buffer(output[0], size[0]))
        finally:
            if output[0] != ffi.NULL:
                self.libc.free(output[0])
            lib.jpeg_destroy_compress(target)
            lib.jpeg_destroy_decompress(source)


def scan_layout(data: bytes) -> tuple[int, int, int]:
    """(offset of the frame's height field, MCU row height, offset of the scan's first data byte)
    of a baseline JPEG, from its marker segments."""
    position, height_at, mcu_height = 2, -1, 8
    while position + 4 <= len(data):
        marker, length = data[position + 1], int.from_bytes(data[position + 2 : position + 4], "big")
        if marker in (0xC0, 0xC1):
            height_at = position + 5
            components = data[position + 9]
            mcu_height = 8 * max(data[position + 11 + 3 * i] & 15 for i in range(components))
        elif marker == 0xDA:
            if height_at < 0:
                raise ValueError("not a baseline JPEG: its scan comes before any baseline frame header")
            return height_at, mcu_height, position + 2 + length
        position += 2 + length
    raise ValueError("no start of scan")


def splice(data: bytes, layout: tuple[int, int, int], top: int) -> tuple[bytes, int]:
    """The JPEG from the MCU row holding row `top` on (restart markers every MCU row), and the
    number of MCU rows left out."""
    height_at, mcu_height, scan = layout
    rows = top // mcu_height
    if not rows:
        return data, 0
    position = scan
    for number in range(rows):  # the marker that ends MCU row `number`: RST(number mod 8)
        position = data.index(bytes((0xFF, 0xD0 + (number & 7))), position) + 2
    height = int.from_bytes(data[height_at : height_at + 2], "big") - rows * mcu_height
    return b"".join((data[:height_at], height.to_bytes(2, "big"), data[height_at + 2 : scan], data[position:])), rows


class SpliceDecoder(CropDecoder):
    """`CropDecoder.decode` of a spliced JPEG: the decoder is told the number of the marker that
    follows the rows left out, as if it had read them."""

    def decode_spliced(self, data: bytes, layout: tuple[int, int, int], *, top: int, left: int, box_height: int, box_width: int) -> int:
        spliced, rows = splice(data, layout, top)
        self.read_header(spliced)
        if rows:
            ffi = self._ffi
            ffi.cast("int *", ffi.cast("char **", self._cinfo + _MARKER_READER)[0])[_NEXT_RESTART_NUM] = rows & 7
        return self.decode_rows(top=top - rows * layout[1], left=left, box_height=box_height, box_width=box_width)


def least_times(variants: dict[str, Callable[[int], Any]], count: int, repeats: int) -> dict[str, float]:
    """Mean over the boxes of each variant's least time (seconds), the variants taken in turn box by box."""
    best = {name: np.full(count, np.inf) for name in variants}
    for _ in range(repeats):
        for index in range(count):
            for name, run in variants.items():
                start = time.perf_counter()
                run(index)
                best[name][index] = min(best[name][index], time.perf_counter() - start)
    return {name: float(times.mean()) for name, times in best.items()}


def frame_size(data: bytes) -> tuple[int, int]:
    """(height, width) from a JPEG's frame header."""
    height_at = scan_layout(data)[0]
    return int.from_bytes(data[height_at : height_at + 2], "big"), int.from_bytes(data[height_at + 2 : height_at + 4], "big")


class Bench:
    """The stored JPEGs, their transcodes, one RandomResizedCrop box each, and the decodes to time."""

    STORED, OPTIMISED, RESTARTS, BOTH = "stored JPEG", "optimised Huffman tables", "restart marker every MCU row", "both"

    def __init__(self, stored: list[bytes], library: str) -> None:
        transcoder = Transcoder(library)
        self.data = {self.STORED: stored}
        self.transcode_seconds: dict[str, float] = {}  # a transcode's mean CPU time, per JPEG
        for name, restart_rows, optimize in ((self.OPTIMISED, 0, True), (self.RESTARTS, 1, False), (self.BOTH, 1, True)):
            start = time.process_time()
            self.data[name] = [transcoder.transcode(d, restart_rows=restart_rows, optimize=optimize) for d in stored]
            self.transcode_seconds[name] = (time.process_time() - start) / len(stored)
        heights, widths = (np.array(side, np.int64) for side in zip(*map(frame_size, stored), strict=True))
        plan = RandomResizedCrop().plan(heights, widths, np.arange(len(stored), dtype=np.uint64))
        self.boxes = list(zip(*(getattr(plan, side).tolist() for side in ("top", "left", "height", "width")), strict=True))
        self.decoder = SpliceDecoder(max_height=int(heights.max()), max_width=int(widths.max()), pixel_bytes=4)
        self.variants: dict[str, tuple[str, Callable[[int], int]]] = {  # name: (bytes it reads, decode of box i)
            self.STORED: (self.STORED, self.plain(self.STORED)),
            self.OPTIMISED: (self.OPTIMISED, self.plain(self.OPTIMISED)),
            self.RESTARTS: (self.RESTARTS, self.plain(self.RESTARTS)),
            "  + decode from the box's MCU row": (self.RESTARTS, self.spliced(self.RESTARTS)),
            "optimised tables + restarts + from the box's row": (self.BOTH, self.spliced(self.BOTH)),
        }

    def plain(self, name: str) -> Callable[[int], int]:
        data, boxes, decoder = self.data[name], self.boxes, self.decoder
        return lambda i: decoder.decode(data[i], top=boxes[i][0], left=boxes[i][1], box_height=boxes[i][2], box_width=boxes[i][3])

    def spliced(self, name: str) -> Callable[[int], int]:
        """The splice's whole cost counts: the headers are read for every box, as a loader would."""
        data, boxes, decoder = self.data[name], self.boxes, self.decoder
        return lambda i: decoder.decode_spliced(
            data[i], scan_layout(data[i]), top=boxes[i][0], left=boxes[i][1], box_height=boxes[i][2], box_width=boxes[i][3]
        )

    def check_pixels(self, files: Sequence[Path]) -> None:
        """Every variant's box equals the stored JPEG's, bit for bit; else exit naming the box."""
        rows, stored = self.decoder.buffer.reshape(-1, self.decoder.row_stride), self.plain(self.STORED)
        for name, (_, run) in self.variants.items():
            for i, (_, _, box_h, box_w) in enumerate(self.boxes):
                start = stored(i)
                expected = rows[:box_h, start : start + 4 * box_w].copy()
                start = run(i)
                if not np.array_equal(rows[:box_h, start : start + 4 * box_w], expected):
                    raise SystemExit(f"{name}: box {self.boxes[i]} of {files[i]} decodes to other pixels")

    def report(self, root: Path, repeats: int) -> None:
        count, stored, restarts = len(self.boxes), self.data[self.STORED], self.data[self.RESTARTS]
        times = least_times({name: run for name, (_, run) in self.variants.items()}, count, repeats)
        extra = least_times(
            {
                "splice": lambda i: splice(restarts[i], scan_layout(restarts[i]), self.boxes[i][0]),
                "first": lambda i: self.decoder.decode(stored[i], top=0, left=0, box_height=2, box_width=64),
            },
            count,
            repeats,
        )
        sizes = {name: sum(map(len, data)) for name, data in self.data.items()}
        shapes = np.array([frame_size(d) for d in stored])
        mean_kb = sizes[self.STORED] / count / 1e3
        print(f"{count} JPEGs of {root}: {shapes[:, 1].mean():.0f}x{shapes[:, 0].mean():.0f} and {mean_kb:.1f} kB on average")
        tops, heights = np.mean([b[0] for b in self.boxes]), np.mean([b[2] for b in self.boxes])
        print(f"RandomResizedCrop(224) boxes: {heights:.0f} rows, {tops:.0f} rows above them, on average")
        print(f"the least of {repeats} decodes of each box, one core; every variant's pixels equal the stored JPEG's")
        print(f"{'variant':<50} {'bytes':>7} {'us a box':>9} {'against stored':>15}")
        for name, seconds in times.items():
            size = sizes[self.variants[name][0]] / sizes[self.STORED]
            print(f"{name:<50} {size:7.3f} {seconds * 1e6:9.1f} {seconds / times[self.STORED]:14.3f}x")
        spent = ", ".join(f"{name} {seconds * 1e3:.2f}" for name, seconds in self.transcode_seconds.items())
        print(f"transcoding, CPU ms a JPEG: {spent}")
        print(f"of the splices: reading the headers, finding the row's marker, copying from it: {extra['splice'] * 1e6:.1f} us")
        print(f"the first two rows of a box at the top of a stored JPEG (one MCU row decoded): {extra['first'] * 1e6:.1f} us")


def main(argv: Sequence[str] | None = None) -> int:
    """Transcode the bench's JPEGs, check every variant's pixels, print the decode times."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--images", type=int, default=400, help="JPEGs to measure (default 400)")
    parser.add_argument("--generate", type=int, default=2000, help="the bench's generated ImageFolder size (default 2000)")
    parser.add_argument("--src", type=Path, help="an existing ImageFolder instead of generated images")
    parser.add_argument("--work-dir", type=Path, help="keep the generated images here between runs")
    parser.add_argument("--repeats", type=int, default=9, help="decodes of each box per variant; the least counts (default 9)")
    args = parser.parse_args(argv)
    library = _jpegcrop._library_path()
    if library is None or not CropDecoder.available():
        raise SystemExit("libjpeg-turbo's partial decoding is not available here (Pillow's Linux wheel has it)")
    with tempfile.TemporaryDirectory(prefix="shardfmt-restarts-") as scratch:
        work = args.work_dir or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        root = args.src or generate_imagefolder(work, args.generate)
        files = load_source(root, work, None if args.src else args.generate).files[: args.images]
        stored = [path.read_bytes() for path in files]
    for path, data in zip(files, stored, strict=True):  # before libjpeg sees them: it ends the process on an error
        try:
            scan_layout(data)
        except (ValueError, IndexError) as error:
            raise SystemExit(f"{path}: {error}; the bench measures baseline JPEGs") from None
    bench = Bench(stored, library)
    bench.check_pixels(files)
    bench.report(root, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
