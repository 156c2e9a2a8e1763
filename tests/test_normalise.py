"""normalise_image: what passes through byte for byte, what is re-encoded and why, what is rejected."""

from __future__ import annotations

import io

import numpy as np
import pytest
import simplejpeg
from conftest import awkward_files, exif_rotated_jpeg, jpeg_bytes, pillow_bytes, png_header_only
from PIL import Image

from shardfmt import RejectError
from shardfmt.jpeg import read_jpeg_info
from shardfmt.normalise import MAX_PIXELS, normalise_image
from shardfmt.sample import make_image


def decodes_to_rgb(data: bytes) -> tuple[int, int]:
    """Decode as the loader does (simplejpeg, strict, RGB) and return (height, width)."""
    pixels = simplejpeg.decode_jpeg(data, strict=True)
    assert pixels.ndim == 3 and pixels.shape[2] == 3
    return pixels.shape[0], pixels.shape[1]


def test_baseline_jpeg_passes_through_byte_for_byte() -> None:
    data = jpeg_bytes(30, 40, seed=1)
    result = normalise_image(data)
    assert result.reencoded is None
    assert result.data is data


def test_grayscale_jpeg_passes_through_and_decodes_to_rgb() -> None:
    data = awkward_files()["gray.jpg"]
    assert read_jpeg_info(data).components == 1
    result = normalise_image(data)
    assert result.reencoded is None and result.data == data
    assert decodes_to_rgb(result.data) == (30, 44)


@pytest.mark.parametrize(
    ("name", "reason"),
    [("cmyk.jpg", "cmyk"), ("png_named.JPEG", "not-jpeg"), ("progressive.jpg", "progressive"), ("rotated.jpg", "exif-rotated")],
)
def test_awkward_images_are_reencoded_as_baseline_rgb_jpeg(name: str, reason: str) -> None:
    result = normalise_image(awkward_files()[name])
    assert result.reencoded == reason
    info = read_jpeg_info(result.data)
    assert not info.progressive and info.components in (1, 3) and info.orientation == 1
    decodes_to_rgb(result.data)


def test_progressive_only_jpeg_keeps_its_quantisation_tables() -> None:
    source = awkward_files()["progressive.jpg"]
    result = normalise_image(source, quality=20)
    assert Image.open(io.BytesIO(result.data)).quantization == Image.open(io.BytesIO(source)).quantization


def test_exif_rotation_is_applied_so_height_and_width_swap() -> None:
    result = normalise_image(exif_rotated_jpeg(24, 40, orientation=6))
    assert decodes_to_rgb(result.data) == (40, 24)
    assert read_jpeg_info(result.data).orientation == 1


def test_max_side_shrinks_only_larger_images_keeping_aspect() -> None:
    large = jpeg_bytes(60, 100, seed=2)
    result = normalise_image(large, max_side=50)
    assert result.reencoded == "resized"
    assert decodes_to_rgb(result.data) == (30, 50)
    small = jpeg_bytes(20, 30, seed=3)
    assert normalise_image(small, max_side=50).data is small


def test_max_side_applies_after_exif_rotation() -> None:
    result = normalise_image(exif_rotated_jpeg(40, 100, orientation=6), max_side=50)
    assert decodes_to_rgb(result.data) == (50, 20)


def test_png_with_alpha_becomes_rgb_and_16_bit_gray_keeps_its_high_bits() -> None:
    rgba = Image.fromarray(np.dstack([make_image(10, 12, seed=4), np.full((10, 12), 128, np.uint8)]), "RGBA")
    assert decodes_to_rgb(normalise_image(pillow_bytes(rgba, "PNG")).data) == (10, 12)
    deep = np.full((8, 8), 0x8000, np.uint16)
    gray = normalise_image(pillow_bytes(Image.fromarray(deep), "PNG"))
    assert read_jpeg_info(gray.data).components == 1
    assert abs(int(simplejpeg.decode_jpeg(gray.data, colorspace="gray").mean()) - 0x80) <= 2


def test_palette_gif_is_converted() -> None:
    gif = pillow_bytes(Image.fromarray(make_image(12, 12, seed=5)).convert("P"), "GIF")
    assert normalise_image(gif).reencoded == "not-jpeg"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"just some text\n", "not-an-image"),
        (jpeg_bytes(30, 40)[:300], "corrupt"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "corrupt"),
        (pillow_bytes(Image.fromarray(make_image(20, 20, seed=7)), "PNG")[:600], "corrupt"),
    ],
    ids=["empty", "text", "truncated-jpeg", "jpeg-headers-only", "truncated-png"],
)
def test_rejects_carry_their_reason(data: bytes, reason: str) -> None:
    with pytest.raises(RejectError) as caught:
        normalise_image(data)
    assert caught.value.reason == reason


def test_jpeg_missing_only_its_last_bytes_is_rejected_not_passed_through() -> None:
    data = jpeg_bytes(30, 40, seed=6)
    with pytest.raises(RejectError, match="Premature end") as caught:
        normalise_image(data[:-2])
    assert caught.value.reason == "corrupt"


def test_a_second_frame_header_is_corrupt_and_a_hierarchical_jpeg_unsupported() -> None:
    data = jpeg_bytes(8, 8)
    sof = data.index(b"\xff\xc0")
    length = int.from_bytes(data[sof + 2 : sof + 4], "big")
    frame = data[sof : sof + 2 + length]
    with pytest.raises(ValueError, match="a second frame header"):
        read_jpeg_info(data[:sof] + frame + data[sof:])
    dhp = b"\xff\xde" + frame[2:]  # a DHP segment has the layout of a frame header
    assert read_jpeg_info(data[:sof] + dhp + data[sof:]).lossless
    with pytest.raises(RejectError) as info:
        normalise_image(data[:sof] + frame + data[sof:])
    assert info.value.reason == "corrupt"


def test_a_jpeg_side_over_libjpegs_limit_is_too_large_even_to_pass_through() -> None:
    data = bytearray(jpeg_bytes(8, 8))
    sof = data.index(b"\xff\xc0")
    data[sof + 7 : sof + 9] = (65501).to_bytes(2, "big")  # the width; 65501 x 8 pixels is within MAX_PIXELS
    with pytest.raises(RejectError, match="over libjpeg's limit of 65500") as info:
        normalise_image(bytes(data))
    assert info.value.reason == "too-large"


def test_too_many_pixels_is_rejected_from_the_header_before_decoding() -> None:
    data = bytearray(jpeg_bytes(16, 16))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") + (60000).to_bytes(2, "big")
    with pytest.raises(RejectError, match=f"over the limit of {MAX_PIXELS}") as caught:
        normalise_image(bytes(data))
    assert caught.value.reason == "too-large"


def test_pillow_decompression_bomb_warning_becomes_a_reject() -> None:
    # 10000 x 10000 is above Pillow's warning threshold but below its error threshold.
    with pytest.raises(RejectError) as caught:
        normalise_image(png_header_only(10_000, 10_000))
    assert caught.value.reason == "too-large"
    with pytest.raises(RejectError) as caught:
        normalise_image(pillow_bytes(Image.new("1", (100, 100)), "PNG"), max_pixels=5000)
    assert caught.value.reason == "too-large"
