"""The crop's resize kernels: "bicubic" (antialiased) beside "bilinear", against torch's own
antialiased interpolate and PIL.

Tolerances: equal to ``interpolate(uint8, antialias=True)`` (the same kernel); within 2 of PIL's
BICUBIC, at least 99.9% of values within 1; within 1 of torch's float32 kernel on a smooth image, and on pure noise (where the float
kernel's unclamped row pass overshoots) at least 99.8% of values within 1.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from shardfmt.ops import ImageOutput
from shardfmt.ops._decode import ImageDecoder, as_target
from shardfmt.ops._resize import INTERPOLATIONS, Resizer


def smooth(height: int, width: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand((1, 3, height // 8, width // 8), generator=generator) * 255
    image = torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear").round().to(torch.uint8)
    return image.contiguous(memory_format=torch.channels_last)  # a (1, C, h, w) view of h x w x C pixels, as decoded


def resized(source: torch.Tensor, size: tuple[int, int], interpolation: str, flip: bool = False) -> torch.Tensor:
    out = np.empty((*size, 3), np.uint8)
    target = torch.from_numpy(out).permute(2, 0, 1).unsqueeze(0)
    Resizer(output_size=size, channels=3, interpolation=interpolation).resize(source, flip=flip, out=target)
    return torch.from_numpy(out).permute(2, 0, 1)


@pytest.mark.parametrize("size", [(224, 224), (96, 150), (400, 520), (24, 32)])  # (24, 32): mirrored by torch
def test_bicubic_equals_torchs_antialiased_uint8_kernel_and_is_close_to_pil(size: tuple[int, int]) -> None:
    assert "bicubic" in INTERPOLATIONS
    source = smooth(300, 397)
    got = resized(source, size, "bicubic")
    assert torch.equal(got, torch.nn.functional.interpolate(source, size=size, mode="bicubic", antialias=True)[0])
    pil = np.asarray(Image.fromarray(source[0].permute(1, 2, 0).numpy()).resize(size[::-1], Image.BICUBIC))
    off = np.abs(got.permute(1, 2, 0).numpy().astype(int) - pil)
    assert off.max() <= 2 and (off <= 1).mean() >= 0.999
    as_float = torch.nn.functional.interpolate(source.float(), size=size, mode="bicubic", antialias=True).round().clamp(0, 255)
    assert (got.float() - as_float[0]).abs().max() <= 1
    assert torch.equal(resized(source, size, "bicubic", flip=True), got.flip(2))
    assert not torch.equal(got, resized(source, size, "bilinear"))


def test_bicubic_on_noise_is_within_one_of_the_float_kernel_almost_everywhere() -> None:
    source = torch.randint(0, 256, (1, 3, 300, 400), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    source = source.contiguous(memory_format=torch.channels_last)
    got = resized(source, (224, 224), "bicubic").float()
    as_float = torch.nn.functional.interpolate(source.float(), size=(224, 224), mode="bicubic", antialias=True).round().clamp(0, 255)[0]
    assert ((got - as_float).abs() <= 1).float().mean() >= 0.998


def test_a_bicubic_field_decodes_at_reduced_scale_and_is_accepted_by_image_output() -> None:
    assert ImageOutput(interpolation="bicubic").interpolation == "bicubic"
    with pytest.raises(ValueError, match="interpolation"):
        ImageOutput(interpolation="lanczos")
    decoder = ImageDecoder(max_height=64, max_width=64, output_size=(16, 16), interpolation="bicubic")
    assert decoder._dct_scaling
    assert callable(as_target)


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
def test_resize_rows_of_a_box_in_a_wider_buffer_equals_resize_bit_for_bit(interpolation: str) -> None:
    """`Resizer.resize_rows`, whose 4-byte pixels take the horizontal pass turned on their side
    (a transpose, torch's vertical pass, a transpose or rotation back), gives `resize`'s pixels:
    reductions, enlargements, one side kept, a single row or column, noise and smooth images,
    mirrored or not."""
    rng = np.random.default_rng(3)
    size = (48, 64)
    buffer = np.empty((160, 200 * 4 + 64), np.uint8)  # rows of a decode buffer, wider than any box
    resizer = Resizer(output_size=size, channels=4, interpolation=interpolation)
    shapes = [(48, 64), (48, 90), (30, 64), (1, 1), (1, 130), (150, 1), (47, 65), (160, 200), (20, 21)]
    shapes += [(int(h), int(w)) for h, w in rng.integers(1, 160, (20, 2))]
    for trial, (height, width) in enumerate(shapes):
        if trial % 2:
            buffer[:] = rng.integers(0, 256, buffer.shape, dtype=np.uint8)
        else:
            buffer[:] = smooth(160, buffer.shape[1], seed=trial)[0, 0].numpy()
        start = 4 * int(rng.integers(0, 200 - min(width, 199)))
        box = buffer[:height, start : start + 4 * width].reshape(height, width, 4)
        for flip in (False, True):
            expected = np.empty((*size, 4), np.uint8)
            Resizer(output_size=size, channels=4, interpolation=interpolation).resize(
                torch.from_numpy(np.ascontiguousarray(box)).permute(2, 0, 1).unsqueeze(0),
                flip=flip,
                out=torch.from_numpy(expected).permute(2, 0, 1).unsqueeze(0),
            )
            got = resizer.resize_rows(box, flip=flip)
            np.testing.assert_array_equal(got, expected, err_msg=f"{height}x{width} flip={flip}")
    three = Resizer(output_size=size, channels=3, interpolation=interpolation)  # 3-byte pixels: `resize` itself
    pixels = smooth(100, 70)[0].permute(1, 2, 0).numpy()
    expected = np.empty((*size, 3), np.uint8)
    target = torch.from_numpy(expected).permute(2, 0, 1).unsqueeze(0)
    three.resize(torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0), flip=True, out=target)
    np.testing.assert_array_equal(three.resize_rows(pixels, flip=True), expected)
