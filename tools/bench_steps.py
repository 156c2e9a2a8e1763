"""The augmentation contenders of tools/bench_loader.py, and the cost of each step per image
beside PIL (what torchvision runs on PIL images) and Albumentations (OpenCV kernels).

Run alone, ``PYTHONPATH=. python tools/bench_steps.py`` makes the bench's JPEGs and prints the
table: every step of ``shardfmt.ops``, and the crop's resize, in one run.

The steps are torchvision's ``ColorJitter(0.4, 0.4, 0.4, 0.1)`` and ``RandomRotation(15)``
after RandomResizedCrop(224) + horizontal flip. shardfmt runs them in its workers
(``Loader(augment=[...])``); the PIL contender runs what torchvision runs on PIL images,
reimplemented here since torchvision has no CPU wheel in this environment: the four adjustments
in the order of ``torch.randperm(4)`` with factors drawn by ``torch.empty(1).uniform_``
(brightness, contrast and saturation with ``ImageEnhance``, hue by shifting the H channel of
PIL's HSV image), then ``Image.rotate(angle, NEAREST, fillcolor=0)``.

`measure_steps` times each step alone, in this process on one thread, on 224x224 crops of the
bench's images: shardfmt's kernels (`ops.SampleTransform` with that one step) beside the PIL
code above, in CPU microseconds per image. The empty transform's row is the sample's move into
float planes and back, what a list with a user's step pays.

Built-in steps run on the uint8 pixels themselves (`PixelOps`), so their rows count their whole
cost, copies in and out included, and no move; the move's row is what a list with a user's step
pays.

The Albumentations column runs each step's equivalent (`albumentations_equivalents`) on the
same uint8 crops: its transforms take and return H x W x 3 uint8 arrays, so they pay no move
into float planes; that move is shardfmt's own row and is paid once a sample, whatever its
steps. Albumentations has no TrivialAugmentWide, RandAugment or AutoAugment: their rows run
its ``OneOf`` / ``SomeOf`` over its transforms of the same operations and magnitude ranges.
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

from shardfmt.ops import (
    AutoAugment,
    ColorJitter,
    RandAugment,
    RandomErasing,
    RandomGrayscale,
    RandomRotation,
    RandomVerticalFlip,
    TrivialAugmentWide,
)
from shardfmt.ops._augment import AugmentStep, SampleTransform
from shardfmt.ops._autoaugment import IMAGENET_POLICY, OPERATIONS
from shardfmt.ops._decode import ImageDecoder, as_target
from shardfmt.ops._resize import Resizer

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
    """CPU microseconds per 224x224 image of one step, in shardfmt, in the PIL path and in
    Albumentations."""

    step: str
    shardfmt_us: float | None
    pil_us: float | None
    albumentations_us: float | None = None


# -- Albumentations' equivalents ----------------------------------------------------------------


def _albumentations_operations(wide: bool) -> dict[str, object]:
    """Albumentations transforms for the auto-augment operations, over torchvision's magnitude
    ranges (wide: TrivialAugmentWide's; else RandAugment's at magnitude 9 of 31)."""
    import albumentations as A
    import cv2

    shear = 44.7 if wide else 16.7  # degrees of atan(0.99), atan(0.3)
    shift = 32 if wide else 44  # pixels: 32, or 150 / 331 of 224 at bin 9 of 31 (about 29) to its maximum
    rotate, colour = (135, 0.99) if wide else (30, 0.9)
    nearest = {"interpolation": cv2.INTER_NEAREST, "border_mode": cv2.BORDER_CONSTANT, "fill": 0, "p": 1.0}
    return {
        "Identity": A.NoOp(p=1.0),
        "ShearX": A.Affine(shear={"x": (-shear, shear), "y": (0, 0)}, **nearest),
        "ShearY": A.Affine(shear={"x": (0, 0), "y": (-shear, shear)}, **nearest),
        "TranslateX": A.Affine(translate_px={"x": (-shift, shift), "y": (0, 0)}, **nearest),
        "TranslateY": A.Affine(translate_px={"x": (0, 0), "y": (-shift, shift)}, **nearest),
        "Rotate": A.Rotate(limit=rotate, **nearest),
        "Brightness": A.ColorJitter(brightness=colour, contrast=0, saturation=0, hue=0, p=1.0),
        "Color": A.ColorJitter(brightness=0, contrast=0, saturation=colour, hue=0, p=1.0),
        "Contrast": A.ColorJitter(brightness=0, contrast=colour, saturation=0, hue=0, p=1.0),
        "Sharpness": A.Sharpen(alpha=(0.0, min(colour, 1.0)), lightness=(1.0, 1.0), method="kernel", kernel_size=3, p=1.0),
        "Posterize": A.Posterize(num_bits=(2, 8) if wide else (4, 8), p=1.0),
        "Solarize": A.Solarize(threshold_range=(0.0, 1.0), p=1.0),
        "AutoContrast": A.AutoContrast(p=1.0),
        "Equalize": A.Equalize(p=1.0),
        "Invert": A.InvertImg(p=1.0),
    }


def albumentations_equivalents() -> dict[str, object]:
    """Row name -> the Albumentations transform that does the same work on a uint8 image."""
    import albumentations as A
    import cv2

    wide, standard = _albumentations_operations(True), _albumentations_operations(False)
    chosen = [wide[name] for name in OPERATIONS[:14]]
    policy = [A.Sequential([_with_p(standard[name], p) for name, p, _ in pair], p=1.0) for pair in IMAGENET_POLICY]
    return {
        "ColorJitter brightness 0.4": A.ColorJitter(brightness=0.4, contrast=0, saturation=0, hue=0, p=1.0),
        "ColorJitter contrast 0.4": A.ColorJitter(brightness=0, contrast=0.4, saturation=0, hue=0, p=1.0),
        "ColorJitter saturation 0.4": A.ColorJitter(brightness=0, contrast=0, saturation=0.4, hue=0, p=1.0),
        "ColorJitter hue 0.1": A.ColorJitter(brightness=0, contrast=0, saturation=0, hue=0.1, p=1.0),
        "ColorJitter(0.4, 0.4, 0.4, 0.1)": A.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, p=1.0),
        "RandomRotation(15)": A.Rotate(limit=15, interpolation=cv2.INTER_NEAREST, border_mode=cv2.BORDER_CONSTANT, fill=0, p=1.0),
        "RandomVerticalFlip(1.0)": A.VerticalFlip(p=1.0),
        "RandomGrayscale(1.0)": A.ToGray(num_output_channels=3, p=1.0),
        "Normalize(mean, std), float32 out": A.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), p=1.0),
        "TrivialAugmentWide()": A.OneOf(chosen, p=1.0),
        "RandAugment(2, 9)": A.SomeOf([standard[name] for name in OPERATIONS[:14]], n=2, replace=True, p=1.0),
        "AutoAugment(imagenet)": A.OneOf(policy, p=1.0),
        "RandomErasing(p=1.0)": A.Erasing(scale=(0.02, 0.33), ratio=(0.3, 3.3), fill=0, p=1.0),
        **{f"  {name} (wide range)": wide[name] for name in OPERATIONS[1:]},
    }


def _with_p(transform: object, p: float) -> object:
    import copy

    clone = copy.deepcopy(transform)
    clone.p = p  # type: ignore[attr-defined]
    return clone


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
    import cv2

    threads, opencv_threads = torch.get_num_threads(), cv2.getNumThreads()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)  # as in the loader's workers, and for Albumentations' DataLoader workers
    try:
        return _measure_steps(files, count=count, repeats=repeats)
    finally:
        torch.set_num_threads(threads)
        cv2.setNumThreads(opencv_threads)


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
        that a spell of load on the machine slows both), each keeping its best round. Steps
        that run on the uint8 pixels (every built-in step) pay no move into float planes:
        their whole cost is counted, copies in and out included."""
        run = apply_all(steps, normalise=normalise)
        if SampleTransform(steps, height=SIZE, width=SIZE, mean=(124.0, 116.0, 104.0))._pixel_ops is not None:
            return min(_cpu_per_item(run, count, 1) for _ in range(repeats))
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
    rows.append(StepCost("TrivialAugmentWide()", shardfmt_cost([TrivialAugmentWide()]), None))
    rows.append(StepCost("RandAugment(2, 9)", shardfmt_cost([RandAugment(2, 9)]), None))
    rows.append(StepCost("AutoAugment(imagenet)", shardfmt_cost([AutoAugment()]), None))
    rows.append(StepCost("RandomErasing(p=1.0)", shardfmt_cost([RandomErasing(p=1.0, value=0)]), None))
    rows += _operation_rows(crops, count, repeats, shardfmt_cost)
    rows.append(_decode_and_crop(files, count, repeats))
    rows += _resize_rows(crops, repeats)
    return _with_albumentations(rows, crops, count, repeats)


class _FixedStep(TrivialAugmentWide):
    """TrivialAugmentWide with its operation fixed: the cost of one operation over the
    magnitudes and signs it draws."""

    def __init__(self, operation: int) -> None:
        super().__init__()
        object.__setattr__(self, "_operation", operation)

    def parameters(self, u: np.ndarray) -> np.ndarray:
        params = super().parameters(u)
        params[:, 0] = self._operation  # type: ignore[attr-defined]
        return params


def _operation_rows(
    crops: list[np.ndarray], count: int, repeats: int, shardfmt_cost: Callable[[list[AugmentStep]], float]
) -> list[StepCost]:
    """Each operation of the auto-augment family alone, over TrivialAugmentWide's magnitudes."""
    return [
        StepCost(f"  {name} (wide range)", shardfmt_cost([_FixedStep(number)]), None)
        for number, name in enumerate(OPERATIONS)
        if number > 0
    ]


def _resize_rows(crops: list[np.ndarray], repeats: int) -> list[StepCost]:
    """The crop's resize, a 448x448 box to 224x224: torch's antialiased kernels (shardfmt)
    beside OpenCV's (Albumentations' Resize; INTER_LINEAR is not antialiased, INTER_AREA is)."""
    import cv2

    boxes = [
        np.ascontiguousarray(np.concatenate([np.concatenate([c, c[:, ::-1]], 1), np.concatenate([c[::-1], c], 1)], 0)) for c in crops[:16]
    ]
    out = np.empty((SIZE, SIZE, 3), np.uint8)
    target = torch.from_numpy(out).permute(2, 0, 1).unsqueeze(0)
    sources = [torch.from_numpy(box).permute(2, 0, 1).unsqueeze(0) for box in boxes]
    rows = []
    for mode, flag in (("bilinear", cv2.INTER_LINEAR), ("bicubic", cv2.INTER_CUBIC)):
        resizer = Resizer(output_size=(SIZE, SIZE), channels=3, interpolation=mode)
        ours = _cpu_per_item(lambda i, r=resizer: r.resize(sources[i], flip=False, out=target), len(boxes), repeats)  # type: ignore[misc]
        theirs = _cpu_per_item(lambda i, f=flag: cv2.resize(boxes[i], (SIZE, SIZE), dst=out, interpolation=f), len(boxes), repeats)  # type: ignore[misc]
        rows.append(StepCost(f"resize 448 -> 224, {mode} (OpenCV's not antialiased)", ours, None, theirs))
    area = _cpu_per_item(lambda i: cv2.resize(boxes[i], (SIZE, SIZE), dst=out, interpolation=cv2.INTER_AREA), len(boxes), repeats)
    rows.append(StepCost("resize 448 -> 224, OpenCV INTER_AREA (antialiased)", None, None, area))
    # a crop box is rarely a whole multiple of the output: 301 x 397 -> 224
    odd = [np.ascontiguousarray(cv2.resize(box, (397, 301), interpolation=cv2.INTER_LINEAR)) for box in boxes]
    odd_sources = [torch.from_numpy(box).permute(2, 0, 1).unsqueeze(0) for box in odd]
    resizer = Resizer(output_size=(SIZE, SIZE), channels=3, interpolation="bilinear")
    ours = _cpu_per_item(lambda i: resizer.resize(odd_sources[i], flip=False, out=target), len(odd), repeats)
    area = _cpu_per_item(lambda i: cv2.resize(odd[i], (SIZE, SIZE), dst=out, interpolation=cv2.INTER_AREA), len(odd), repeats)
    rows.append(StepCost("resize 301x397 -> 224, bilinear / OpenCV INTER_AREA", ours, None, area))
    return rows


def _with_albumentations(rows: list[StepCost], crops: list[np.ndarray], count: int, repeats: int) -> list[StepCost]:
    """Fill the Albumentations column where it has an equivalent (none where it is not installed)."""
    try:
        equivalents = albumentations_equivalents()
    except ImportError:
        return rows
    import cv2

    cv2.setNumThreads(1)
    filled = []
    for row in rows:
        transform = equivalents.get(row.step)
        if transform is None:
            filled.append(row)
            continue
        cost = _cpu_per_item(lambda i, t=transform: t(image=crops[i])["image"], count, repeats)  # type: ignore[misc,operator]
        filled.append(StepCost(row.step, row.shardfmt_us, row.pil_us, cost))
    return filled


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
    header = (
        f"{'step, per 224x224 image, one core':<56} {'shardfmt us':>11} {'PIL us':>9} {'PIL / shardfmt':>14} {'Albu us':>9} "
        f"{'Albu / shardfmt':>15}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        ours = "-" if row.shardfmt_us is None else f"{row.shardfmt_us:.0f}"
        theirs = "-" if row.pil_us is None else f"{row.pil_us:.0f}"
        ratio = f"{row.pil_us / row.shardfmt_us:.1f}x" if row.pil_us and row.shardfmt_us and row.shardfmt_us > 0 else "-"
        albu = "-" if row.albumentations_us is None else f"{row.albumentations_us:.0f}"
        albu_ratio = (
            f"{row.albumentations_us / row.shardfmt_us:.2f}x" if row.albumentations_us and row.shardfmt_us and row.shardfmt_us > 0 else "-"
        )
        print(f"{row.step:<56} {ours:>11} {theirs:>9} {ratio:>14} {albu:>9} {albu_ratio:>15}")


def main(argv: Sequence[str] | None = None) -> int:
    """Make the bench's JPEGs and print every step's cost beside PIL and Albumentations."""
    import argparse
    import os
    import platform
    import tempfile

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--images", type=int, default=64, help="JPEGs to crop the 224x224 samples from (default 64)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per step; each keeps its best (default 5)")
    args = parser.parse_args(argv)
    from bench_loader import generate_imagefolder

    with tempfile.TemporaryDirectory(prefix="shardfmt-steps-") as scratch:
        root = generate_imagefolder(Path(scratch), args.images)
        files = sorted(path for path in root.rglob("*") if path.suffix.lower() in (".jpg", ".jpeg"))
        before = os.getloadavg()[0]
        rows = measure_steps(files, count=args.images, repeats=args.rounds)
        after = os.getloadavg()[0]
    try:
        import albumentations
        import cv2

        versions = f"albumentations {albumentations.__version__}, opencv {cv2.__version__}"
    except ImportError:
        versions = "albumentations not installed (pip install shardfmt[bench])"
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {versions}")
    print(f"load average (1 min): {before:.2f} before, {after:.2f} after; {len(files)} images, best of {args.rounds} rounds")
    print()
    print_steps(rows)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
