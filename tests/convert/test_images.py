"""The images module through both entry points: normalise_image (one image as JPEG: what passes
through byte for byte, what is re-encoded and why, what is rejected) and store_image /
read_header / plan_geometry (an image field in a kind), which must follow the same rules."""

from __future__ import annotations

import io
import struct
from collections.abc import Callable

import numpy as np
import pytest
import simplejpeg
from conftest import (
    awkward_files,
    exif_rotated_jpeg,
    jpeg_bytes,
    pillow_bytes,
    png_header_only,
)
from PIL import Image, ImageOps

from shardfmt import RejectError
from shardfmt._convert.images import (
    IMAGE_KINDS,
    JPEG_MAX_SIDE,
    MAX_PIXELS,
    Geometry,
    normalise_image,
    plan_geometry,
    read_header,
    store_image,
)
from shardfmt._synthetic import make_image
from shardfmt.format._jpeg import read_jpeg_info


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


# --- store_image, read_header and plan_geometry -------------------------------------------------


def stored(data: bytes, kind: str, geometry: Geometry | None = None) -> np.ndarray:
    """The pixels `store_image` keeps for `kind` (not "jpeg")."""
    value = store_image(data, kind=kind, geometry=geometry, quality=90).value
    assert isinstance(value, np.ndarray) and value.dtype == np.uint8
    return value


def expect_reject(reason: str, call: Callable[..., object], *args: object, **kwargs: object) -> RejectError:
    """The RejectError that `call` raises, asserting its reason."""
    with pytest.raises(RejectError) as caught:
        call(*args, **kwargs)
    assert caught.value.reason == reason
    return caught.value


def damaged_jpeg() -> bytes:
    """A baseline JPEG with 20 bytes of its entropy-coded data flipped: Pillow decodes it."""
    data = bytearray(jpeg_bytes(64, 96, seed=3))
    start = data.index(b"\xff\xda") + 40
    data[start : start + 20] = bytes(b ^ 0x5A for b in data[start : start + 20])
    return bytes(data)


def png_with_exif_after_pixels(image: Image.Image, orientation: int) -> bytes:
    """A PNG whose eXIf chunk (with `orientation`) follows its pixel data, as the PNG extension allows."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = pillow_bytes(image, "PNG", exif=exif)
    chunks, pos = [], 8
    while pos < len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        chunks.append(data[pos : pos + 12 + length])
        pos += 12 + length
    late = [chunk for chunk in chunks if chunk[4:8] == b"eXIf"]
    rest = [chunk for chunk in chunks if chunk[4:8] != b"eXIf"]
    assert len(late) == 1 and rest[-1][4:8] == b"IEND"
    return data[:8] + b"".join(rest[:-1]) + late[0] + rest[-1]


def test_plan_geometry_shrinks_to_max_side_or_cuts_a_centered_patch() -> None:
    assert plan_geometry(100, 60, max_side=50, patch=None) == Geometry((50, 30))
    assert plan_geometry(1000, 3, max_side=10, patch=None) == Geometry((10, 1))
    assert plan_geometry(40, 30, max_side=50, patch=None) is None
    assert plan_geometry(30, 45, max_side=None, patch=20) == Geometry((20, 30), (0, 5, 20, 25))
    assert plan_geometry(45, 30, max_side=None, patch=60) == Geometry((90, 60), (15, 0, 75, 60))
    assert plan_geometry(20, 20, max_side=None, patch=20) is None
    patch = Geometry((20, 30), (0, 5, 20, 25))
    assert patch.scaled(4) == Geometry((80, 120), (0, 20, 80, 100))
    assert (patch.final_size, patch.scaled(4).final_size, Geometry((50, 30)).final_size) == ((20, 20), (80, 80), (50, 30))


def test_the_upright_size_is_read_from_the_headers_only() -> None:
    assert read_header(exif_rotated_jpeg(24, 40, orientation=6)).upright == (24, 40)
    assert read_header(exif_rotated_jpeg(24, 40, orientation=3)).upright == (40, 24)
    # The pixel data of this PNG is invalid: its size comes from the header alone.
    assert read_header(png_header_only(30, 20)).upright == (30, 20)
    expect_reject("too-large", read_header, png_header_only(100, 100), max_pixels=5000)
    expect_reject("not-an-image", read_header, b"just some text\n")
    twelve_bit = bytearray(jpeg_bytes(16, 16))
    twelve_bit[twelve_bit.index(b"\xff\xc0") + 4] = 12
    expect_reject("corrupt", read_header, bytes(twelve_bit))


@pytest.mark.parametrize("orientation", range(2, 9))
def test_exif_rotated_jpeg_is_turned_alike_by_both_entry_points(orientation: int) -> None:
    data = exif_rotated_jpeg(24, 40, orientation=orientation, seed=orientation)
    expected = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    assert np.array_equal(stored(data, "raw"), expected)
    assert read_header(data).upright == (expected.shape[1], expected.shape[0])
    result = normalise_image(data)
    assert result.reencoded == "exif-rotated" and decodes_to_rgb(result.data) == expected.shape[:2]


def test_a_png_whose_exif_follows_its_pixels_is_turned_without_an_extra_decode() -> None:
    image = Image.fromarray(make_image(12, 20, seed=4))
    data = png_with_exif_after_pixels(image, orientation=6)
    assert read_header(data).upright == (12, 20)
    assert np.array_equal(stored(data, "raw"), np.asarray(image.transpose(Image.Transpose.ROTATE_270)))
    assert decodes_to_rgb(normalise_image(data).data) == (20, 12)


def test_malformed_exif_counts_as_no_orientation() -> None:
    data = pillow_bytes(Image.new("RGB", (10, 6)), "PNG", exif=b"Exif\x00\x00MM\x00*garbage")
    assert read_header(data).upright == (10, 6) and stored(data, "raw").shape == (6, 10, 3)


@pytest.mark.parametrize(
    "name", ["big.jpg", "big.png", "progressive.jpg", "cmyk.jpg", "rotated.jpg", "gray.jpg"]
)
def test_a_reshaped_jpeg_field_is_what_normalise_image_makes(name: str) -> None:
    """One rule for JPEG output: the same bytes and the same first matching reason (a JPEG field
    was once always counted "resized", and decoded at full scale)."""
    files = dict(awkward_files(), **{"big.jpg": jpeg_bytes(90, 130, seed=8)})
    files["big.png"] = pillow_bytes(Image.fromarray(make_image(90, 130, seed=8)), "PNG")
    data = files[name]
    geometry = plan_geometry(*read_header(data).upright, max_side=20, patch=None)
    assert geometry is not None
    field = store_image(data, kind="jpeg", geometry=geometry, quality=70)
    single = normalise_image(data, max_side=20, quality=70)
    assert (field.value, field.reencoded) == (single.data, single.reencoded)
    reasons = {
        "big.jpg": "resized",
        "big.png": "not-jpeg",
        "progressive.jpg": "progressive",
        "cmyk.jpg": "cmyk",
        "rotated.jpg": "exif-rotated",
        "gray.jpg": "resized",
    }
    assert single.reencoded == reasons[name]
    unreshaped = store_image(data, kind="jpeg", geometry=None, quality=70)
    assert unreshaped.value == normalise_image(data, quality=70).data


def test_16_bit_gray_keeps_its_high_bits_in_every_kind() -> None:
    values = (np.arange(48).reshape(6, 8) * 1361).astype(np.uint16)
    data = pillow_bytes(Image.fromarray(values), "PNG")
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    high = (values >> 8).astype(np.uint8)
    assert np.array_equal(stored(data, "gray"), high)
    assert np.array_equal(stored(data, "raw"), np.dstack([high] * 3))
    assert np.array_equal(stored(data, "rgba"), np.dstack([high] * 3 + [np.full_like(high, 255)]))
    single = normalise_image(data)
    assert single.reencoded == "not-jpeg" and read_jpeg_info(single.data).components == 1
    field = store_image(data, kind="jpeg", geometry=Geometry((4, 3)), quality=90)
    assert read_jpeg_info(field.value).components == 1  # type: ignore[arg-type]
    error = expect_reject("unsupported", store_image, data, kind="mask", geometry=None, quality=90)
    assert error.message == f"a I;16 mask holds values from 0 to {int(values.max())}; a raw mask holds 0 to 255"
    small = (np.arange(48).reshape(6, 8) % 5).astype(np.uint16)
    assert np.array_equal(stored(pillow_bytes(Image.fromarray(small), "PNG"), "mask"), small.astype(np.uint8))


def test_32_bit_integer_values_within_a_byte_are_kept_and_negatives_become_0() -> None:
    values = (np.arange(48).reshape(6, 8) * 5 - 20).astype(np.int32)  # -20 .. 215
    data = pillow_bytes(Image.fromarray(values, "I"), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "I"
    assert np.array_equal(stored(data, "gray"), np.clip(values, 0, 255).astype(np.uint8))


def test_la_is_gray_and_only_rgba_keeps_its_alpha() -> None:
    gray = make_image(10, 12, seed=2)[:, :, 0]
    alpha = np.tile(np.arange(12, dtype=np.uint8) * 20, (10, 1))
    data = pillow_bytes(Image.merge("LA", (Image.fromarray(gray), Image.fromarray(alpha))), "PNG")
    assert np.array_equal(stored(data, "gray"), gray)
    assert np.array_equal(stored(data, "raw"), np.dstack([gray] * 3))
    assert np.array_equal(stored(data, "rgba"), np.dstack([gray] * 3 + [alpha]))
    assert read_jpeg_info(normalise_image(data).data).components == 1
    field = store_image(data, kind="jpeg", geometry=Geometry((6, 5)), quality=90)
    assert read_jpeg_info(field.value).components == 1 and field.reencoded == "not-jpeg"  # type: ignore[arg-type]


def test_palette_with_transparency() -> None:
    indices = ((np.arange(10)[:, None] + np.arange(12)[None, :]) % 4).astype(np.uint8)
    image = Image.fromarray(indices, "P")
    image.putpalette([0, 0, 0, 200, 10, 10, 10, 200, 10, 10, 10, 200] + [0] * 756)
    data = pillow_bytes(image, "PNG", transparency=2)
    colours = np.array([[0, 0, 0], [200, 10, 10], [10, 200, 10], [10, 10, 200]], np.uint8)[indices]
    assert np.array_equal(stored(data, "raw"), colours)
    assert np.array_equal(stored(data, "rgba"), np.dstack([colours, np.where(indices == 2, 0, 255).astype(np.uint8)]))
    assert np.array_equal(stored(data, "mask"), indices)  # the indices, not the colours
    single = normalise_image(data)
    assert read_jpeg_info(single.data).components == 3 and decodes_to_rgb(single.data) == (10, 12)


def test_cmyk_jpeg_through_both_entry_points() -> None:
    data = awkward_files()["cmyk.jpg"]
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.array_equal(stored(data, "raw"), expected)
    assert normalise_image(data).reencoded == "cmyk"
    assert store_image(data, kind="jpeg", geometry=Geometry((22, 15)), quality=90).reencoded == "cmyk"


def test_masks_keep_their_values_when_resized_and_colour_is_not_a_mask() -> None:
    values = ((np.arange(30)[:, None] // 3 + np.arange(44)[None, :] // 4) % 3).astype(np.uint8)
    mask = stored(pillow_bytes(Image.fromarray(values, "L"), "PNG"), "mask", Geometry((11, 8)))
    assert mask.shape == (8, 11) and set(np.unique(mask).tolist()) == {0, 1, 2}
    one_bit = Image.fromarray(values == 1)
    assert np.array_equal(stored(pillow_bytes(one_bit, "PNG"), "mask"), (values == 1).astype(np.uint8))
    error = expect_reject("unsupported", store_image, jpeg_bytes(8, 8), kind="mask", geometry=None, quality=90)
    assert error.message == "a RGB image is not a mask: store one channel of class values (L, P or 1)"


def test_a_damaged_jpeg_is_rejected_whatever_it_would_become() -> None:
    data = damaged_jpeg()
    Image.open(io.BytesIO(data)).load()  # Pillow alone decodes it without a word
    for max_side in (None, 40):
        error = expect_reject("corrupt", normalise_image, data, max_side=max_side)
        assert error.message.startswith("JPEG does not decode: Corrupt JPEG data")
    for kind in IMAGE_KINDS:
        for geometry in (None, Geometry((48, 32))):
            expect_reject("corrupt", store_image, data, kind=kind, geometry=geometry, quality=90)


def test_the_jpeg_side_limit_applies_to_the_jpeg_written() -> None:
    wide = pillow_bytes(Image.new("L", (JPEG_MAX_SIDE + 1, 2), 77), "PNG")
    error = expect_reject("too-large", normalise_image, wide)
    assert error.message == f"{JPEG_MAX_SIDE + 1}x2 has a side over libjpeg's limit of {JPEG_MAX_SIDE}"
    shrunk = normalise_image(wide, max_side=1000)
    assert shrunk.reencoded == "not-jpeg" and decodes_to_rgb(shrunk.data) == (1, 1000)
    assert stored(wide, "gray").shape == (2, JPEG_MAX_SIDE + 1)  # raw pixels have no such bound
    expect_reject("too-large", store_image, wide, kind="jpeg", geometry=None, quality=90)


def test_store_image_checks_the_pixel_limit_before_decoding() -> None:
    for kind in IMAGE_KINDS:
        expect_reject("too-large", store_image, png_header_only(10_000, 10_000), kind=kind, geometry=None, quality=90)
        expect_reject("too-large", store_image, png_header_only(100, 100), kind=kind, geometry=None, quality=90, max_pixels=5000)


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
