"""Every step checks its own arguments when it is made: a wrong type is a TypeError, a value out
of range a ValueError, each naming the argument and its range (docs/limits.md, "Arguments are
checked at the door"). Before, the values below were taken and blew up at the first batch (10**9
magnitude bins grew to 23.5 GB), overflowed to infinity, or silently did something else."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from shardfmt.ops import (
    ColorJitter,
    CutMix,
    MixUp,
    RandAugment,
    RandomChoice,
    RandomErasing,
    RandomResizedCrop,
    RandomRotation,
    TrivialAugmentWide,
)

TWO = [MixUp(num_classes=3), CutMix(num_classes=3)]
BINS = r"num_magnitude_bins must be in \[2, 1024\], got "
BINS_TYPE = r"num_magnitude_bins must be an int in \[2, 1024\], got "
ALPHA = r"alpha must be in \[0.001, 1000\], got "
CLASSES = r"num_classes must be in \[1, 1048576\] \(a one-hot row of num_classes floats per sample; MAX_CLASSES of the format\), got "
DEGREES = r"degrees must be in \[0, 360\] when it is one number \(the range \(-degrees, degrees\)\), got "
BOUNDS = r"degrees must be in \[-360, 360\] \(each bound of \(low, high\)\), got "
WEIGHT = r"p must be in \[0, 1.79769e\+308\] \(a weight, finite\), got "
PAIR = r"scale must be \(low, high\), each in \(0, 1\], got "
RATIO = r"ratio must be in \[1.5259e-05, 65535\] \(each of \(low, high\)\), got "
FILL = r"fill must be one value or three, each in \[0, 255\], got "

CASES: list[tuple[str, Callable[[], Any], type, str]] = [
    ("randaugment bins 10**9", lambda: RandAugment(num_magnitude_bins=10**9), ValueError, BINS + "1000000000$"),
    ("trivial bins 10**12", lambda: TrivialAugmentWide(num_magnitude_bins=10**12), ValueError, BINS + "1000000000000$"),
    ("trivial bins 1025", lambda: TrivialAugmentWide(num_magnitude_bins=1025), ValueError, BINS + "1025$"),
    ("trivial bins 1", lambda: TrivialAugmentWide(num_magnitude_bins=1), ValueError, BINS + "1$"),
    ("randaugment bins -5", lambda: RandAugment(num_magnitude_bins=-5), ValueError, BINS + "-5$"),
    ("trivial bins float", lambda: TrivialAugmentWide(num_magnitude_bins=31.0), TypeError, BINS_TYPE + "31.0$"),
    ("trivial bins bool", lambda: TrivialAugmentWide(num_magnitude_bins=True), TypeError, BINS_TYPE + "True$"),
    ("randaugment bins str", lambda: RandAugment(num_magnitude_bins="31"), TypeError, BINS_TYPE + "'31'$"),
    ("randaugment num_ops 65", lambda: RandAugment(num_ops=65), ValueError, r"num_ops must be in \[0, 64\], got 65$"),
    ("randaugment num_ops float", lambda: RandAugment(num_ops=2.0), TypeError, r"num_ops must be an int in \[0, 64\], got 2.0$"),
    (
        "randaugment magnitude 31",
        lambda: RandAugment(magnitude=31),
        ValueError,
        r"magnitude must be in \[0, 30\] \(a bin of num_magnitude_bins\), got 31$",
    ),
    ("randaugment magnitude nan", lambda: RandAugment(magnitude=math.nan), TypeError, r"magnitude must be an int in \[0, 30\]"),
    ("randaugment fill None", lambda: RandAugment(fill=None), TypeError, FILL + "None$"),
    ("trivial fill nan", lambda: TrivialAugmentWide(fill=math.nan), ValueError, FILL + "nan$"),
    ("trivial fill str", lambda: TrivialAugmentWide(fill="255"), TypeError, FILL + "'255'$"),
    ("rotation 1e308", lambda: RandomRotation(1e308), ValueError, DEGREES + r"1e\+308$"),
    ("rotation inf", lambda: RandomRotation(math.inf), ValueError, DEGREES + "inf$"),
    ("rotation nan", lambda: RandomRotation(math.nan), ValueError, DEGREES + "nan$"),
    ("rotation negative", lambda: RandomRotation(-5), ValueError, DEGREES + "-5$"),
    ("rotation 361", lambda: RandomRotation(361), ValueError, DEGREES + "361$"),
    ("rotation pair 1e308", lambda: RandomRotation((-1e308, 1e308)), ValueError, BOUNDS + r"-1e\+308$"),
    ("rotation pair nan", lambda: RandomRotation((0, math.nan)), ValueError, BOUNDS + "nan$"),
    ("rotation pair str", lambda: RandomRotation((0, "5")), TypeError, r"degrees must be a number in \[-360, 360\] \(each bound"),
    ("rotation bool", lambda: RandomRotation(True), TypeError, r"degrees must be a number in \[0, 360\] when it is one number"),
    ("rotation str", lambda: RandomRotation("30"), TypeError, r"degrees must be a number in \[0, 360\] or \(low, high\) in \[-360, 360\]"),
    ("rotation None", lambda: RandomRotation(None), TypeError, r"degrees must be a number in \[0, 360\] or \(low, high\)"),
    ("rotation triple", lambda: RandomRotation((1, 2, 3)), TypeError, r"degrees must be a number in \[0, 360\] or \(low, high\)"),
    ("jitter inf", lambda: ColorJitter(brightness=math.inf), ValueError, r"brightness range \(0.0, inf\) must lie within \[0, 256\]"),
    ("jitter 1e308", lambda: ColorJitter(contrast=1e308), ValueError, r"contrast range \(0.0, 1e\+308\) must lie within \[0, 256\]"),
    ("jitter nan pair", lambda: ColorJitter(saturation=(0, math.nan)), ValueError, r"saturation range \(0.0, nan\) must lie within"),
    ("mixup alpha 1e30", lambda: MixUp(alpha=1e30, num_classes=3), ValueError, ALPHA + r"1e\+30$"),
    ("cutmix alpha 1e30", lambda: CutMix(alpha=1e30, num_classes=3), ValueError, ALPHA + r"1e\+30$"),
    ("mixup alpha inf", lambda: MixUp(alpha=math.inf, num_classes=3), ValueError, ALPHA + "inf$"),
    ("mixup alpha nan", lambda: MixUp(alpha=math.nan, num_classes=3), ValueError, ALPHA + "nan$"),
    ("cutmix alpha 0", lambda: CutMix(alpha=0, num_classes=3), ValueError, ALPHA + "0$"),
    ("cutmix alpha negative", lambda: CutMix(alpha=-1.0, num_classes=3), ValueError, ALPHA + r"-1.0$"),
    ("mixup alpha subnormal", lambda: MixUp(alpha=1e-320, num_classes=3), ValueError, ALPHA + "1e-320$"),
    ("mixup alpha str", lambda: MixUp(alpha="1", num_classes=3), TypeError, r"alpha must be a number in \[0.001, 1000\], got '1'$"),
    ("cutmix alpha bool", lambda: CutMix(alpha=True, num_classes=3), TypeError, r"alpha must be a number in \[0.001, 1000\], got True$"),
    ("mixup classes 10**12", lambda: MixUp(num_classes=10**12), ValueError, CLASSES + "1000000000000$"),
    ("cutmix classes 10**12", lambda: CutMix(num_classes=10**12), ValueError, CLASSES + "1000000000000$"),
    ("cutmix classes 2**20 + 1", lambda: CutMix(num_classes=2**20 + 1), ValueError, CLASSES + "1048577$"),
    ("mixup classes 0", lambda: MixUp(num_classes=0), ValueError, CLASSES + "0$"),
    ("mixup classes None", lambda: MixUp(), TypeError, r"num_classes must be an int in \[1, 1048576\]"),
    ("mixup classes float", lambda: MixUp(num_classes=3.0), TypeError, r"num_classes must be an int in \[1, 1048576\]"),
    ("cutmix classes bool", lambda: CutMix(num_classes=True), TypeError, r"num_classes must be an int in \[1, 1048576\]"),
    ("choice weights str", lambda: RandomChoice(TWO, p=["1", 1]), TypeError, r"p must be a number in \[0, 1.79769e\+308\] .*, got '1'$"),
    ("choice weights bool", lambda: RandomChoice(TWO, p=[True, 1]), TypeError, r"p must be a number in \[0, 1.79769e\+308\]"),
    ("choice weight nan", lambda: RandomChoice(TWO, p=[math.nan, 1]), ValueError, WEIGHT + "nan$"),
    ("choice weight inf", lambda: RandomChoice(TWO, p=[math.inf, 1]), ValueError, WEIGHT + "inf$"),
    ("choice weight negative", lambda: RandomChoice(TWO, p=[-1, 1]), ValueError, WEIGHT + "-1$"),
    ("choice weights short", lambda: RandomChoice(TWO, p=[1]), TypeError, r"p must be a list of one weight per step \(2\), got \[1\]$"),
    ("choice weights number", lambda: RandomChoice(TWO, p=5), TypeError, r"p must be a list of one weight per step \(2\), got 5$"),
    ("choice weights zero", lambda: RandomChoice(TWO, p=[0, 0]), ValueError, r"p must hold one non-negative weight per step, not all 0"),
    ("erasing scale str", lambda: RandomErasing(scale="ab"), TypeError, PAIR + "'ab'$"),
    ("erasing scale number", lambda: RandomErasing(scale=0.5), TypeError, PAIR + "0.5$"),
    ("erasing scale 0", lambda: RandomErasing(scale=(0, 0.5)), ValueError, r"scale must be in \(0, 1\] \(each of \(low, high\)\), got 0$"),
    ("erasing ratio 1e308", lambda: RandomErasing(ratio=(0.5, 1e308)), ValueError, RATIO + r"1e\+308$"),
    ("erasing ratio inf", lambda: RandomErasing(ratio=(0.5, math.inf)), ValueError, RATIO + "inf$"),
    ("erasing ratio reversed", lambda: RandomErasing(ratio=(2, 1)), ValueError, r"ratio must be \(low, high\) with low <= high, got \(2"),
    ("crop scale str", lambda: RandomResizedCrop(8, scale="ab"), TypeError, PAIR + "'ab'$"),
    ("crop scale nan", lambda: RandomResizedCrop(8, scale=(math.nan, 1)), ValueError, r"scale must be in \(0, 1\] \(each of"),
    ("crop ratio 1e-308", lambda: RandomResizedCrop(8, ratio=(1e-308, 1)), ValueError, RATIO + "1e-308$"),
    ("crop flip str", lambda: RandomResizedCrop(8, flip="0.5"), TypeError, r"flip must be a number in \[0, 1\] \(a probability\), got .0"),
    ("crop flip nan", lambda: RandomResizedCrop(8, flip=math.nan), ValueError, r"flip must be in \[0, 1\] \(a probability\), got nan$"),
    ("choice of one step", lambda: RandomChoice(MixUp(num_classes=3)), TypeError, r"RandomChoice takes a list of batch steps"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("make", "error", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_step_refuses_what_it_cannot_run_when_it_is_made(make: Callable[[], Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message) as info:
        make()
    assert type(info.value) is error


def test_the_largest_values_allowed_are_taken() -> None:
    assert RandAugment(num_magnitude_bins=1024, magnitude=1023).num_magnitude_bins == 1024
    assert TrivialAugmentWide(num_magnitude_bins=np.int64(2)).num_magnitude_bins == 2
    assert RandomRotation(360).degrees == (-360.0, 360.0)
    assert RandomRotation((-360, 0)).degrees == (-360.0, 0.0)
    assert MixUp(alpha=1000, num_classes=2**20).alpha == 1000.0
    assert CutMix(alpha=0.001, num_classes=1).alpha == 0.001
    assert ColorJitter(brightness=255).ranges[0] == (0.0, 256.0)
    assert RandomErasing(ratio=(1 / 65535, 65535)).ratio == (1 / 65535, 65535.0)
    assert RandomResizedCrop(8, scale=[0.08, 1], ratio=(1 / 65535, 65535)).scale == [0.08, 1]  # kept as given: its config is in states


def test_weights_of_1e308_choose_each_step_in_proportion() -> None:
    """Before: the weights summed to infinity and every batch took the second step."""
    choice = RandomChoice(TWO, p=[1e308, 1e308])
    assert [choice.choose(np.array([u])) for u in (0.0, 0.25, 0.4999, 0.5, 0.75, 0.9999)] == [0, 0, 0, 1, 1, 1]
    tilted = RandomChoice(TWO, p=[1e308, 1e-308])
    assert [tilted.choose(np.array([u])) for u in (0.0, 0.9999)] == [0, 0]
