"""Partial JPEG decoding (shardfmt.ops._jpegcrop): the box's pixels equal a full fast decode's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from conftest import make_image

from shardfmt import ImageTransform, Loader, WorkerError, Workers, open_dataset
from shardfmt.ops._decode import ImageDecoder, as_target
from shardfmt.ops._jpegcrop import CropDecoder

pytestmark = pytest.mark.skipif(not CropDecoder.available(), reason="libjpeg-turbo's partial decoding is not available here")


@pytest.mark.parametrize("pixel_bytes", [3, 4])
@pytest.mark.parametrize("subsampling", ["444", "422", "420", "440", "411", "Gray"])
def test_boxes_equal_the_full_fast_decode(subsampling: str, pixel_bytes: int) -> None:
    rng = np.random.default_rng(5)
    decoder = CropDecoder(max_height=300, max_width=300, pixel_bytes=pixel_bytes)
    for trial in range(40):
        height, width = int(rng.integers(1, 300)), int(rng.integers(1, 300))
        image = make_image(height, width, seed=trial)
        if subsampling == "Gray":
            data = simplejpeg.encode_jpeg(image[:, :, :1].copy(), quality=int(rng.integers(50, 100)), colorspace="GRAY")
        else:
            data = simplejpeg.encode_jpeg(image, quality=int(rng.integers(50, 100)), colorsubsampling=subsampling)
        full = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, fastupsample=True)
        box_height, box_width = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        top, left = int(rng.integers(0, height - box_height + 1)), int(rng.integers(0, width - box_width + 1))
        start = decoder.decode(memoryview(data), top=top, left=left, box_height=box_height, box_width=box_width)
        rows = decoder.buffer[start : start + box_height * decoder.row_stride]
        got = np.lib.stride_tricks.as_strided(rows, (box_height, box_width, 3), (decoder.row_stride, pixel_bytes, 1))
        np.testing.assert_array_equal(got, full[top : top + box_height, left : left + box_width], err_msg=f"trial {trial}")
    decoder.close()
    with pytest.raises(ValueError, match="pixel_bytes"):
        CropDecoder(max_height=8, max_width=8, pixel_bytes=2)


def jpeg_and_box(rng: np.random.Generator, seed: int, low: int, high: int) -> tuple[bytes, dict[str, int]]:
    """A 4:2:0 JPEG of a random size in [low, high) on each side, and a random box inside it, as
    `ImageDecoder.decode_box`'s keywords."""
    height, width = int(rng.integers(low, high)), int(rng.integers(low, high))
    data = simplejpeg.encode_jpeg(make_image(height, width, seed=seed), quality=90, colorsubsampling="420")
    box_height, box_width = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
    box = {
        "height": height, "width": width, "top": int(rng.integers(0, height - box_height + 1)),
        "left": int(rng.integers(0, width - box_width + 1)), "box_height": box_height, "box_width": box_width,
    }
    return data, box


def test_a_partial_decode_writes_the_pixels_of_a_whole_decode_into_any_target() -> None:
    """`ImageDecoder.decode_box`: a trusted record's box (decoded partially, 4-byte pixels,
    resized, packed to RGB) equals the whole decode's, flipped or not, into a slot's row or
    into a view that is not contiguous."""
    rng = np.random.default_rng(11)
    partial = ImageDecoder(max_height=200, max_width=200, output_size=(96, 128), partial=True)
    whole = ImageDecoder(max_height=200, max_width=200, output_size=(96, 128))
    packed: list[bool] = []
    resize_rows = partial._wide_resizer.resize_rows
    partial._wide_resizer.resize_rows = lambda box, flip: packed.append(flip) or resize_rows(box, flip=flip)  # type: ignore[method-assign]
    same = np.zeros((96, 128, 3), np.uint8)
    same_target = as_target(same[None])[0:1]
    for trial in range(30):
        data, box = jpeg_and_box(rng, trial, 30, 200)
        flip = bool(trial % 2)
        expected = np.zeros((2, 96, 128, 3), np.uint8)
        whole.decode_box(data, **box, flip=flip, out=as_target(expected)[1:2])
        row = np.zeros((2, 96, 128, 3), np.uint8)
        partial.decode_box(data, **box, flip=flip, out=as_target(row)[1:2], trusted=True)
        wide = np.zeros((2, 96, 128, 4), np.uint8)  # rows of 4 bytes a pixel: the view of 3 is not contiguous
        partial.decode_box(data, **box, flip=flip, out=as_target(wide[:, :, :, :3])[1:2], trusted=True)
        partial.decode_box(data, **box, flip=flip, out=same_target, trusted=True)  # a target filled again, as a loader's scratch
        np.testing.assert_array_equal(row, expected, err_msg=f"trial {trial}")
        np.testing.assert_array_equal(wide[:, :, :, :3], expected, err_msg=f"trial {trial}")
        np.testing.assert_array_equal(same, expected[1], err_msg=f"trial {trial}")
        assert not wide[:, :, :, 3].any()
    assert len(packed) > 30 and True in packed and False in packed  # the partial decoder took most boxes, flipped or not


def test_a_small_output_takes_three_byte_pixels_straight_into_the_slot() -> None:
    """Below `WIDE_MIN_PIXELS` the partial decode writes RGB and resizes it into the slot, with
    no 4-byte pass or pack (they cost more than they save there): the pixels of a whole decode,
    flipped or not, into a slot's row or a view that is not contiguous."""
    from shardfmt.ops._decode import WIDE_MIN_PIXELS

    size = (24, 32)
    assert size[0] * size[1] < WIDE_MIN_PIXELS <= 96 * 128
    rng = np.random.default_rng(12)
    partial = ImageDecoder(max_height=120, max_width=120, output_size=size, partial=True)
    whole = ImageDecoder(max_height=120, max_width=120, output_size=size)
    assert partial._crop is not None and partial._crop.pixel_bytes == 3 and not hasattr(partial, "_wide_resizer")
    decoded: list[int] = []
    crop_decode = partial._crop.decode
    partial._crop.decode = lambda data, **box: decoded.append(box["box_height"]) or crop_decode(data, **box)  # type: ignore[method-assign]
    for trial in range(30):
        data, box = jpeg_and_box(rng, trial, 8, 120)
        flip = bool(trial % 2)
        expected = np.zeros((2, *size, 3), np.uint8)
        whole.decode_box(data, **box, flip=flip, out=as_target(expected)[1:2])
        row = np.zeros((2, *size, 3), np.uint8)
        partial.decode_box(data, **box, flip=flip, out=as_target(row)[1:2], trusted=True)
        wide = np.zeros((2, *size, 4), np.uint8)
        partial.decode_box(data, **box, flip=flip, out=as_target(wide[:, :, :, :3])[1:2], trusted=True)
        np.testing.assert_array_equal(row, expected, err_msg=f"trial {trial}")
        np.testing.assert_array_equal(wide[:, :, :, :3], expected, err_msg=f"trial {trial}")
        assert not wide[:, :, :, 3].any()
    assert len(decoded) > 50  # decoded partially: all but the boxes of twice the output, decoded at 1/2 scale


def test_workers_deliver_the_pixels_of_a_whole_decode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the second read of a record on, workers decode only its crop box: the batches are
    the same as those of the in-process loader, which always decodes whole images."""
    from shardfmt import DatasetWriter
    from shardfmt.format import IMAGE_CLASSIFICATION

    out = tmp_path / "ds"
    rng = np.random.default_rng(9)
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=200_000) as writer:
        for i in range(48):
            h, w = int(rng.integers(60, 200)), int(rng.integers(60, 200))
            data = simplejpeg.encode_jpeg(make_image(h, w, seed=i), quality=90, colorsubsampling="420")
            writer.write({"image": data, "label": i, "key": f"r{i}"})

    log = tmp_path / "partial.log"
    original = CropDecoder.decode

    def logged(self: CropDecoder, data: object, **box: int) -> int:
        with open(log, "a") as f:
            f.write("x\n")
        return original(self, data, **box)

    monkeypatch.setattr(CropDecoder, "decode", logged)

    def epochs(num_workers: int) -> list[bytes]:
        with Loader(
            out, batch_size=16, num_workers=num_workers, seed=4, transform=ImageTransform(size=48), workers=Workers(start_method="fork")
        ) as loader:
            return [images.numpy().tobytes() for _ in range(3) for images, _ in loader]

    assert epochs(2) == epochs(0)
    partial = len(log.read_text().splitlines())
    assert partial > 0, "the workers never decoded a box partially"


# -- a worker that libjpeg ends inside a partial decode ------------------------------------------

def test_a_fatal_libjpeg_error_ends_the_process_at_once(tmp_path: Path) -> None:
    """libjpeg ends the process on a fatal error; the decoder does it with _exit, so no exit
    handler runs (in a forked worker, one that waits for the parent's threads would hang it)."""
    marker = tmp_path / "exit-handler-ran"
    script = (
        "import ctypes\nfrom shardfmt.ops._jpegcrop import CropDecoder\n"
        f"handler = ctypes.CFUNCTYPE(None)(lambda: open({str(marker)!r}, 'w').close())\n"
        "ctypes.CDLL(None).__cxa_atexit(handler, None, None)\n"
        "decoder = CropDecoder(max_height=8, max_width=8)\n"
        "decoder.decode(bytes(100), top=0, left=0, box_height=8, box_width=8)\n"
        "print('returned')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    child = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert (child.returncode, child.stdout, child.stderr) == (1, "", "Not a JPEG file: starts with 0x00 0x00\n")
    assert not marker.exists()


RECORDS = 24


@pytest.fixture(scope="module")
def small_jpegs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 JPEGs of 40 to 64 pixels a side, labelled with their index: at an output size of 48
    every crop box is decoded at full scale, so from its second read on, partially."""
    from shardfmt import DatasetWriter
    from shardfmt.format import IMAGE_CLASSIFICATION

    out = tmp_path_factory.mktemp("partial") / "ds"
    rng = np.random.default_rng(3)
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=20_000) as writer:
        for i in range(RECORDS):
            h, w = int(rng.integers(40, 65)), int(rng.integers(40, 65))
            data = simplejpeg.encode_jpeg(make_image(h, w, seed=i), quality=90, colorsubsampling="420")
            writer.write({"image": data, "label": i, "key": f"r{i}"})
    return out


def partial_settings() -> dict[str, Any]:
    return {"batch_size": 8, "seed": 4, "transform": ImageTransform(size=48)}


def last_record_of_epoch_1(dataset: Path) -> int:
    """A record of epoch 1's last batch: the loader decodes that batch only after every record
    has been read once, so it decodes it partially."""
    with Loader(dataset, num_workers=0, **partial_settings()) as loader:
        batches = [labels.tolist() for _ in range(2) for _, labels in loader]
    return int(batches[-1][0])


def reference_epochs(dataset: Path, epochs: int) -> list[bytes]:
    """The in-process loader's batches: it always decodes whole images."""
    with Loader(dataset, num_workers=0, **partial_settings()) as loader:
        return [images.numpy().tobytes() for _ in range(epochs) for images, _ in loader]


def test_a_worker_that_libjpeg_ends_in_a_partial_decode_is_replaced(
    small_jpegs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libjpeg's error_exit calls exit(): here the partial decode of one record is handed bytes
    that are not a JPEG, in the forked workers, so libjpeg itself ends the worker."""
    target = last_record_of_epoch_1(small_jpegs)
    with open_dataset(small_jpegs) as dataset:
        shard_index, record = dataset.locate(target)
        shard_path = dataset.shard_path(shard_index)
        target_bytes = bytes(dataset.shard(shard_index).record(record)["image"])
    log = tmp_path / "partial.log"
    original = CropDecoder.decode

    def failing(self: CropDecoder, data: Any, **box: int) -> int:
        if bytes(data) == target_bytes:
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
            data = b"\0\0" + bytes(data)[2:]  # "Not a JPEG file": a fatal error, so exit(1)
        return original(self, data, **box)

    monkeypatch.setattr(CropDecoder, "decode", failing)
    with Loader(small_jpegs, num_workers=2, **partial_settings(), workers=Workers(start_method="fork")) as loader:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = [images.numpy().tobytes() for images, _ in loader]
            pids_before = loader.worker_pids
            later = [images.numpy().tobytes() for _ in range(2) for images, _ in loader]
            pids_after = loader.worker_pids
    assert first + later == reference_epochs(small_jpegs, 3)
    [warning] = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    message = str(warning.message)
    assert message.startswith(f"{shard_path}: record {record}: worker ")
    assert f"exited with code 1 in libjpeg's partial decoding of dataset record {target}" in message
    [dead] = log.read_text().split()  # one partial decode of the record, never another
    assert len(set(pids_before) & set(pids_after)) == 1
    assert set(pids_before) - set(pids_after) == {int(dead)}


def test_a_worker_that_dies_outside_a_partial_decode_is_a_worker_error(small_jpegs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same record, partially decoded without fault, then the worker exits: that is no
    libjpeg error, so the loader stops with WorkerError naming the record, as for any death."""
    from shardfmt._loader.fillers import _JpegFiller

    target = last_record_of_epoch_1(small_jpegs)
    with open_dataset(small_jpegs) as dataset:
        shard_index, record = dataset.locate(target)
        shard_path = dataset.shard_path(shard_index)
    original = _JpegFiller.fill

    def dying(self: _JpegFiller, reader: Any, row: Any, box: Any, out: Any, index: int, *, trusted: bool = False) -> None:
        original(self, reader, row, box, out, index, trusted=trusted)
        if trusted and int(row["label"]) == target:
            os._exit(1)

    monkeypatch.setattr(_JpegFiller, "fill", dying)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(
            WorkerError,
            match=re.escape(f"exited with code 1 while decoding record {record} of {shard_path} (dataset record {target})") + "$",
        ) as info:
            with Loader(small_jpegs, num_workers=2, **partial_settings(), workers=Workers(start_method="fork")) as loader:
                for _ in range(2):
                    for _batch in loader:
                        pass
    assert (info.value.path, info.value.record) == (shard_path, record)
    assert [w for w in caught if issubclass(w.category, RuntimeWarning)] == []


@pytest.mark.slow
def test_the_parsed_declarations_are_those_of_cdef() -> None:
    """_jpeglib_abi.py is _CDEF already parsed: the same functions with the same C types as a
    fresh parse, and the file is what tools/make_jpeglib_abi.py writes."""
    import cffi

    from shardfmt.ops import _jpegcrop as jpegcrop
    from shardfmt.ops._jpeglib_abi import ffi as parsed

    fresh = cffi.FFI()
    fresh.cdef(jpegcrop._CDEF)
    path = jpegcrop._library_path()
    assert path is not None
    fresh_lib, parsed_lib = fresh.dlopen(path), parsed.dlopen(path)
    names = sorted(name for name in dir(fresh_lib) if not name.startswith("_"))
    assert names and names == sorted(name for name in dir(parsed_lib) if not name.startswith("_"))
    for name in names:
        assert fresh.typeof(getattr(fresh_lib, name)).cname == parsed.typeof(getattr(parsed_lib, name)).cname, name
    tool = Path(__file__).resolve().parents[2] / "tools" / "make_jpeglib_abi.py"
    done = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
