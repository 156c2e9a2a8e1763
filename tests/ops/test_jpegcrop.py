"""Partial JPEG decoding (shardfmt.ops.jpegcrop): the box's pixels equal a full fast decode's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from conftest import make_image

from shardfmt import Loader
from shardfmt.ops.jpegcrop import CropDecoder

pytestmark = pytest.mark.skipif(not CropDecoder.available(), reason="libjpeg-turbo's partial decoding is not available here")


@pytest.mark.parametrize("subsampling", ["444", "422", "420", "Gray"])
def test_boxes_equal_the_full_fast_decode(subsampling: str) -> None:
    rng = np.random.default_rng(5)
    decoder = CropDecoder(max_height=300, max_width=300)
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
        got = np.lib.stride_tricks.as_strided(rows, (box_height, box_width, 3), (decoder.row_stride, 3, 1))
        np.testing.assert_array_equal(got, full[top : top + box_height, left : left + box_width], err_msg=f"trial {trial}")
    decoder.close()


def test_workers_deliver_the_pixels_of_a_whole_decode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the second read of a record on, workers decode only its crop box: the batches are
    the same as those of the in-process loader, which always decodes whole images."""
    from shardfmt import IMAGE_CLASSIFICATION, DatasetWriter

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
        with Loader(out, batch_size=16, num_workers=num_workers, size=48, seed=4, start_method="fork") as loader:
            return [images.numpy().tobytes() for _ in range(3) for images, _ in loader]

    assert epochs(2) == epochs(0)
    partial = len(log.read_text().splitlines())
    assert partial > 0, "the workers never decoded a box partially"
