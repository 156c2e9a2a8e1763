"""The augmentation contenders of tools/bench_loader.py, and the cost of each step per image.

The steps are torchvision's ``ColorJitter(0.4, 0.4, 0.4, 0.1)`` and ``RandomRotation(15)``
after RandomResizedCrop(224) + horizontal flip. shardfmt runs them in its workers
(``Loader(augment=[...])``); the PIL contender runs what torchvision runs on PIL images,
reimplemented here since torchvision has no CPU wheel in this environment: the four adjustments
in the order of ``torch.randperm(4)`` with factors drawn by ``torch.empty(1).uniform_``
(brightness, contrast and saturation with ``ImageEnhance``, hue by shifting the H channel of
PIL's HSV image), then ``Image.rotate(angle, NEAREST, fillcolor=0)``.

`measure_steps` times each step alone, in this process on one thread, on 224x224 crops of the
bench's images: shardfmt's kernels (`ops.SampleTransform` with that one step, less the cost of
an empty transform timed in alternate rounds, which is reported on its own row: the sample's
move into float planes and back) beside the PIL code above, in CPU microseconds per image. A
rotation that ends the steps writes the sample's uint8 row itself (`Rotator.rotate_to_pixels`),
so its row is the rotation less the move back out of float planes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import simplejpeg
import torch
from PIL import Image, ImageEnhance

from shardfmt.ops import ColorJitter, RandomGrayscale, RandomRotation, RandomVerticalFlip
from shardfmt.ops._augment import AugmentStep, SampleTransform
from shardfmt.ops._decode import ImageDecoder, as_target

JITTER = (0.4, 0.4, 0.4, 0.1)
DEGREES = 15.0
SIZE = 224


def shardfmt_steps() -> list[AugmentStep]:
    """What ``Loader(augment=...)`` gets in the bench."""
    return [ColorJitter(*JITTER), RandomRotation(DEGREES)]


# -- torchvision's PIL path ---------------------------------------------------------------------


def pil_hue(image: Image.Image, factor: float) -> Image.Image:
    """adjust_hue on a PIL image: H of PIL's 8-bit HSV shifted by factor * 255, wrapping."""
    h, s, v = image.convert("HSV").split()
    shifted = (np.asarray(h, dtype=np.int16) + int(factor * 255)) % 256
    return Image.merge("HSV", (Image.fromarray(shifted.astype(np.uint8), "L"), s, v)).convert("RGB")


def pil_adjust(image: Image.Image, adjustment: int, factor: float) -> Image.Image:
    if adjustment == 0:
        return ImageEnhance.Brightness(image).enhance(factor)
    if adjustment == 1:
        return ImageEnhance.Contrast(image).enhance(factor)
    if adjustment == 2:
        return ImageEnhance.Color(image).enhance(factor)
    return pil_hue(image, factor)


def pil_color_jitter(image: Image.Image) -> Image.Image:
    """ColorJitter(0.4, 0.4, 0.4, 0.1).forward on a PIL image, drawing from torch's generator."""
    order = torch.randperm(4).tolist()
    spans = [(1 - JITTER[0], 1 + JITTER[0]), (1 - JITTER[1], 1 + JITTER[1]), (1 - JITTER[2], 1 + JITTER[2]), (-JITTER[3], JITTER[3])]
    factors = [float(torch.empty(1).uniform_(low, high)) for low, high in spans]
    for adjustment in order:
        image = pil_adjust(image, adjustment, factors[adjustment])
    return image


def pil_rotate(image: Image.Image) -> Image.Image:
    """RandomRotation(15).forward on a PIL image: nearest, no expansion, black corners."""
    angle = float(torch.empty(1).uniform_(-DEGREES, DEGREES).item())
    return image.rotate(angle, Image.Resampling.NEAREST, expand=False, fillcolor=(0, 0, 0))


def pil_augment(image: Image.Image) -> Image.Image:
    return pil_rotate(pil_color_jitter(image))


# -- the cost of each step ------------------------------------------------------------------------


@dataclass(frozen=True)
class StepCost:
    """CPU microseconds per 224x224 image of one step, in shardfmt and in the PIL path."""

    step: str
    shardfmt_us: float | None
    pil_us: float | None


def _crops(files: Sequence[Path], count: int) -> list[np.ndarray]:
    """The central square of each of the first `count` images, resized to 224 (PIL)."""
    crops = []
    for path in list(files)[:count]:
        image = Image.open(path).convert("RGB")
        side = min(image.size)
        left, top = (image.width - side) // 2, (image.height - side) // 2
        crops.append(np.asarray(image.crop((left, top, left + side, top + side)).resize((SIZE, SIZE), Image.Resampling.BILINEAR)))
    return crops


def _cpu_per_item(run: Callable[[int], object], count: int, repeats: int) -> float:
    """CPU microseconds per call of run(i), i over range(count), `repeats` times (best round)."""
    for i in range(min(count, 4)):
        run(i)
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        for i in range(count):
            run(i)
        best = min(best, (time.thread_time() - start) / count * 1e6)
    return best


def measure_steps(files: Sequence[Path], *, count: int = 64, repeats: int = 5) -> list[StepCost]:
    """Time each step alone on `count` crops of `files` (see the module docstring), with torch
    on one thread as in the loader's workers."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure_steps(files, count=count, repeats=repeats)
    finally:
        torch.set_num_threads(threads)


def _measure_steps(files: Sequence[Path], *, count: int, repeats: int) -> list[StepCost]:
    crops = _crops(files, count)
    count = len(crops)
    images = [Image.fromarray(crop) for crop in crops]
    indices = np.arange(count, dtype=np.int64)
    out = np.empty((SIZE, SIZE, 3), np.uint8)
    normalised = np.empty((SIZE, SIZE, 3), np.float32)

    def apply_all(steps: list[AugmentStep], *, normalise: bool = False) -> Callable[[int], None]:
        transform = SampleTransform(
            steps, height=SIZE, width=SIZE, mean=(124.0, 116.0, 104.0) if normalise else None, std=(58.0, 57.0, 57.0) if normalise else None
        )
        draws = transform.draw(0, 0, indices)
        target = normalised if normalise else out
        return lambda i: transform.apply(crops[i], draws, i, target)

    nothing = apply_all([])

    def shardfmt_cost(steps: list[AugmentStep], *, normalise: bool = False) -> float:
        """The steps' cost over an empty transform's, the two timed in alternate rounds (so
        that a spell of load on the machine slows both), each keeping its best round."""
        run = apply_all(steps, normalise=normalise)
        with_steps = without = float("inf")
        for _ in range(repeats):
            with_steps = min(with_steps, _cpu_per_item(run, count, 1))
            without = min(without, _cpu_per_item(nothing, count, 1))
        return with_steps - without

    empty = min(_cpu_per_item(nothing, count, 1) for _ in range(repeats))
    factors = np.random.default_rng(0).uniform(0.6, 1.4, count)
    shifts = np.random.default_rng(1).uniform(-0.1, 0.1, count)
    rows = [StepCost("move into float planes and back (shardfmt only)", empty, None)]
    for name, step, adjustment, values in (
        ("ColorJitter brightness 0.4", ColorJitter(brightness=0.4), 0, factors),
        ("ColorJitter contrast 0.4", ColorJitter(contrast=0.4), 1, factors),
        ("ColorJitter saturation 0.4", ColorJitter(saturation=0.4), 2, factors),
        ("ColorJitter hue 0.1", ColorJitter(hue=0.1), 3, shifts),
    ):
        pil = _cpu_per_item(lambda i, a=adjustment, v=values: pil_adjust(images[i], a, float(v[i])), count, repeats)  # type: ignore[misc]
        rows.append(StepCost(name, shardfmt_cost([step]), pil))
    rows.append(
        StepCost(
            "ColorJitter(0.4, 0.4, 0.4, 0.1)",
            shardfmt_cost([ColorJitter(*JITTER)]),
            _cpu_per_item(lambda i: pil_color_jitter(images[i]), count, repeats),
        )
    )
    rows.append(
        StepCost(
            "RandomRotation(15)", shardfmt_cost([RandomRotation(DEGREES)]), _cpu_per_item(lambda i: pil_rotate(images[i]), count, repeats)
        )
    )
    rows.append(
        StepCost(
            "RandomVerticalFlip(1.0)",
            shardfmt_cost([RandomVerticalFlip(1.0)]),
            _cpu_per_item(lambda i: images[i].transpose(Image.Transpose.FLIP_TOP_BOTTOM), count, repeats),
        )
    )
    rows.append(
        StepCost(
            "RandomGrayscale(1.0)",
            shardfmt_cost([RandomGrayscale(1.0)]),
            _cpu_per_item(lambda i: images[i].convert("L").convert("RGB"), count, repeats),
        )
    )
    rows.append(StepCost("Normalize(mean, std), float32 out", shardfmt_cost([], normalise=True), None))
    rows.append(_decode_and_crop(files, count, repeats))
    return rows


def _decode_and_crop(files: Sequence[Path], count: int, repeats: int) -> StepCost:
    """For scale: RandomResizedCrop(224) + flip from the JPEG bytes, shardfmt's ImageDecoder
    (full decode, fast IDCT, a quarter-area box) beside PIL's open, convert, crop and resize."""
    blobs = [path.read_bytes() for path in list(files)[:count]]
    sizes = [simplejpeg.decode_jpeg_header(blob)[:2] for blob in blobs]
    decoder = ImageDecoder(max_height=max(h for h, _ in sizes), max_width=max(w for _, w in sizes), output_size=(SIZE, SIZE))
    target = as_target(np.empty((1, SIZE, SIZE, 3), np.uint8))

    def shardfmt_decode(i: int) -> None:
        height, width = sizes[i]
        decoder.decode_box(
            blobs[i],
            height=height,
            width=width,
            top=height // 4,
            left=width // 4,
            box_height=height // 2,
            box_width=width // 2,
            flip=True,
            out=target,
        )

    def pil_decode(i: int) -> None:
        height, width = sizes[i]
        image = Image.open(files[i]).convert("RGB")
        box = (width // 4, height // 4, width // 4 + width // 2, height // 4 + height // 2)
        image.crop(box).resize((SIZE, SIZE), Image.Resampling.BILINEAR).transpose(Image.Transpose.FLIP_LEFT_RIGHT)

    return StepCost(
        "for scale: decode, crop a quarter, resize to 224, flip",
        _cpu_per_item(shardfmt_decode, len(blobs), repeats),
        _cpu_per_item(pil_decode, len(blobs), repeats),
    )


def print_steps(rows: Sequence[StepCost]) -> None:
    header = f"{'step, per 224x224 image, one core':<56} {'shardfmt us':>11} {'PIL us':>9} {'PIL / shardfmt':>14}"
    print(header)
    print("-" * len(header))
    for row in rows:
        ours = "-" if row.shardfmt_us is None else f"{row.shardfmt_us:.0f}"
        theirs = "-" if row.pil_us is None else f"{row.pil_us:.0f}"
        ratio = f"{row.pil_us / row.shardfmt_us:.1f}x" if row.pil_us and row.shardfmt_us and row.shardfmt_us > 0 else "-"
        print(f"{row.step:<56} {ours:>11} {theirs:>9} {ratio:>14}")
