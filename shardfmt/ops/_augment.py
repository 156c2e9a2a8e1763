"""Augmentation steps that the loader's workers run on each sample after its crop, and the runner
that applies a list of them (then the normalisation, if any) to one sample.

The steps have torchvision's names, parameters and sampling rules: `RandomVerticalFlip`,
`RandomRotation`, `ColorJitter` and `RandomGrayscale`, and (`autoaugment`, `augmix`, `erasing`)
`TrivialAugmentWide`, `RandAugment`, `AutoAugment`, `AugMix` and `RandomErasing`, with the results of
torchvision's tensor functions on uint8 images (`colour`, `rotate`, `imageops` give the
formulas). A user's own step is any
picklable callable ``step(sample) -> sample`` or ``step(sample, generator) -> sample`` (a
torchvision transform, a `torch.nn.Module`; `as_step` tells them apart by signature): `sample` a
(3, H, W) uint8 tensor, valid during the call only, `generator` a `torch.Generator` seeded for
this record; it returns a (3, H, W) uint8 tensor (the same one, changed in place, or a new one).

Randomness. Step number j of the list (from 0) takes its draws from the key
``key(seed, STEP + j, epoch, record)`` (`sampling.keys.STEP_STREAM`; spec/sampling.md): `u[k]` is draw
k + 1 of that key as a float in [0, 1), and a user's step gets a generator seeded with the key
itself. Before a user's step runs, the process's global torch, numpy and `random` generators are
seeded from ``key(seed, RNG + j, epoch, record)`` (`sampling.keys.RNG_STREAM`), so that a step drawing
from them (every torchvision transform does) is reproducible too. So every draw is a pure function
of (seed, epoch, record, position in the list): the number of workers, the batch and a resume
never change it.

Each step keeps the sample's shape, so the slots are sized before any batch.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Union, cast

import cv2
import numpy as np
import torch

from .._arguments import check_number
from .._sampling.keys import RNG_STREAM, STEP_STREAM, keys_by_epoch, uniforms
from ._augmix import AugMix
from ._autoaugment import AutoAugment, RandAugment, TrivialAugmentWide, fill_triple, stored_fill
from ._colour import ColourKernels
from ._erasing import RandomErasing
from ._imageops import ImageOps
from ._pixelops import PixelOps
from ._rotate import Rotator

__all__ = [
    "AugmentStep",
    "CallableStep",
    "ColorJitter",
    "RandomGrayscale",
    "RandomRotation",
    "RandomVerticalFlip",
    "SampleTransform",
    "as_step",
    "describe_steps",
    "qualified_name",
]


MAX_DEGREES = 360
"""The largest angle a RandomRotation's range may reach, each way: a turn; larger angles only
repeat it (and 1e308 overflowed the draw to infinity)."""
_DEGREES_NOTE = " (each bound of (low, high))"
MAX_JITTER_FACTOR = 256
"""The largest brightness, contrast or saturation factor a ColorJitter draws: at 256 every value
off the mean is already pushed to 0 or 255."""


def _probability(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{name} is a probability in [0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class _CoinStep:
    """A step taken with probability `p`: when ``u[0] < p``."""

    p: float = 0.5
    op: ClassVar[str]
    draws: ClassVar[int] = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", _probability("p", self.p))

    def parameters(self, u: np.ndarray) -> np.ndarray:
        """Per record: 1.0 to take the step, else 0.0."""
        return (u[:, :1] < self.p).astype(np.float64)

    def to_config(self) -> dict[str, Any]:
        return {"op": self.op, "p": self.p}


@dataclass(frozen=True)
class RandomVerticalFlip(_CoinStep):
    """Flip the sample upside down with probability `p`: when ``u[0] < p``."""

    p: float = 0.5
    op: ClassVar[str] = "random_vertical_flip"


@dataclass(frozen=True)
class RandomGrayscale(_CoinStep):
    """Replace the sample by its gray image in all three channels with probability `p`
    (torchvision's default 0.1): when ``u[0] < p``."""

    p: float = 0.1
    op: ClassVar[str] = "random_grayscale"


@dataclass(frozen=True)
class RandomRotation:
    """Rotate the sample by an angle drawn uniformly from `degrees` (a number d means (-d, d)),
    counter-clockwise, about its centre, nearest-neighbour, the corners taking `fill` (one value,
    or one per channel, 0 to 255, truncated to whole numbers as a uint8 tensor holds them):
    ``angle = lo + (hi - lo) * u[0]``. A number lies in [0, 360], each bound of a pair in
    [-360, 360] (`MAX_DEGREES`); TypeError or ValueError otherwise."""

    degrees: float | tuple[float, float]
    fill: float | tuple[float, ...] = 0
    op: ClassVar[str] = "random_rotation"
    draws: ClassVar[int] = 1

    def __post_init__(self) -> None:
        degrees = self.degrees
        if isinstance(degrees, (tuple, list)) and len(degrees) == 2:
            pair: tuple[float, ...] = tuple(check_number("degrees", d, -MAX_DEGREES, MAX_DEGREES, note=_DEGREES_NOTE) for d in degrees)
            if pair[0] > pair[1]:
                raise ValueError(f"degrees must be (low, high) with low <= high, got {degrees}")
        elif isinstance(degrees, (tuple, list, str, bytes)) or degrees is None:
            raise TypeError(
                f"degrees must be a number in [0, {MAX_DEGREES}] or (low, high) in [-{MAX_DEGREES}, {MAX_DEGREES}], got {degrees!r}"
            )
        else:
            high = check_number("degrees", degrees, 0, MAX_DEGREES, note=" when it is one number (the range (-degrees, degrees))")
            pair = (-high, high)
        fill = fill_triple(self.fill)
        object.__setattr__(self, "degrees", pair)
        object.__setattr__(self, "fill", fill)

    @property
    def _range(self) -> tuple[float, float]:
        """`degrees` as __post_init__ stored it, (low, high); the field's type is what callers may pass."""
        return cast("tuple[float, float]", self.degrees)

    def parameters(self, u: np.ndarray) -> np.ndarray:
        """Per record: the angle in degrees."""
        low, high = self._range
        return low + (high - low) * u[:, :1]

    def to_config(self) -> dict[str, Any]:
        return {"op": self.op, "degrees": list(self._range), "fill": list(stored_fill(self.fill))}


def _jitter_range(
    name: str, value: float | tuple[float, float], *, center: float, bound: tuple[float, float]
) -> tuple[float, float] | None:
    """torchvision's ColorJitter rule: a number v means [center - v, center + v] (clipped to the
    bound for brightness, contrast and saturation), a pair is taken as it is; a range that is
    only the center means "not applied" (None)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{name} must not be negative when it is one number, got {value}")
        pair = (max(center - value, bound[0]) if center == 1 else center - value, center + value)
    elif (
        isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    ):
        pair = (float(value[0]), float(value[1]))
    else:
        raise ValueError(f"{name} must be a number or (low, high), got {value!r}")
    if not bound[0] <= pair[0] <= pair[1] <= bound[1]:
        raise ValueError(f"{name} range {pair} must lie within [{bound[0]:g}, {bound[1]:g}] with low <= high")
    return None if pair[0] == pair[1] == center else (float(pair[0]), float(pair[1]))


@dataclass(frozen=True)
class ColorJitter:
    """torchvision's ColorJitter: brightness, contrast and saturation factors drawn from
    [max(0, 1 - v), 1 + v] (or a given (low, high)), a hue shift from [-h, h] with h <= 0.5 (or
    a given range within [-0.5, 0.5]); the four adjustments run in a random order, each only if
    its range is not just 1 (0 for hue).

    Draws: the order is the stable argsort of ``u[0:4]`` (0 brightness, 1 contrast, 2
    saturation, 3 hue), a uniform permutation; the factors are ``low + (high - low) * u[4 + n]``
    for adjustment n.
    """

    brightness: float | tuple[float, float] = 0
    contrast: float | tuple[float, float] = 0
    saturation: float | tuple[float, float] = 0
    hue: float | tuple[float, float] = 0
    op: ClassVar[str] = "color_jitter"
    draws: ClassVar[int] = 8

    def __post_init__(self) -> None:
        for name in ("brightness", "contrast", "saturation"):
            object.__setattr__(self, name, _jitter_range(name, getattr(self, name), center=1.0, bound=(0.0, MAX_JITTER_FACTOR)))
        object.__setattr__(self, "hue", _jitter_range("hue", self.hue, center=0.0, bound=(-0.5, 0.5)))

    @property
    def ranges(self) -> tuple[tuple[float, float] | None, ...]:
        # as __post_init__ stored them: (low, high) or None; the fields' type is what callers may pass
        return cast("tuple[tuple[float, float] | None, ...]", (self.brightness, self.contrast, self.saturation, self.hue))

    def parameters(self, u: np.ndarray) -> np.ndarray:
        """Per record: the order of the four adjustments, then the four factors (NaN where an
        adjustment is not applied)."""
        order = np.argsort(u[:, :4], axis=1, kind="stable").astype(np.float64)
        factors = np.full((len(u), 4), np.nan)
        for n, span in enumerate(self.ranges):
            if span is not None:
                factors[:, n] = span[0] + (span[1] - span[0]) * u[:, 4 + n]
        return np.concatenate([order, factors], axis=1)

    def to_config(self) -> dict[str, Any]:
        return {"op": self.op} | {
            name: list(span) if span is not None else None
            for name, span in zip(("brightness", "contrast", "saturation", "hue"), self.ranges, strict=True)
        }


BuiltinStep = Union[
    RandomVerticalFlip, RandomRotation, ColorJitter, RandomGrayscale, TrivialAugmentWide, RandAugment, AutoAugment, AugMix, RandomErasing
]
AugmentStep = Union[BuiltinStep, Callable[[torch.Tensor, torch.Generator], torch.Tensor]]
"""What ``ImageTransform(augment=[...])`` takes: the steps above, or a picklable callable taking
(sample) or (sample, generator)."""

_PLANE_STEPS = (TrivialAugmentWide, RandAugment, AutoAugment, AugMix, RandomErasing)
"""Steps that run themselves on the sample's planes through `ImageOps`."""
_BUILTIN = (RandomVerticalFlip, RandomRotation, ColorJitter, RandomGrayscale, *_PLANE_STEPS)


@dataclass(frozen=True)
class CallableStep:
    """A user's step as the workers run it: the callable and whether it takes the generator."""

    function: Callable[..., torch.Tensor]
    takes_generator: bool

    def __call__(self, sample: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.function(sample, generator) if self.takes_generator else self.function(sample)

    @property
    def name(self) -> str:
        return qualified_name(self.function)


def qualified_name(value: Any) -> str:
    """A function's or class's module and qualified name; an instance's, its class's."""
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    module = getattr(value, "__module__", None) or type(value).__module__
    return f"{module}.{name}"


def as_step(step: Any) -> Any:
    """A built-in step as it is; a user's callable as a `CallableStep` that knows from its
    signature whether to pass the generator: ``step(sample, generator)`` when a second
    positional parameter is named, else ``step(sample)`` (a ``forward(self, x)`` of a
    `torch.nn.Module`, a transform's ``__call__(self, img)``, ``forward(self, *inputs)``).

    Raises:
        TypeError: `step` is not callable, or takes neither one argument nor two.
    """
    if isinstance(step, (_BUILTIN, CallableStep)):
        return step
    if not callable(step):
        raise TypeError(f"an augment step is a shardfmt.ops step or a callable taking (sample) or (sample, generator), got {step!r}")
    target = step.forward if isinstance(step, torch.nn.Module) else step
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # a builtin without a signature: pass the sample only
        return CallableStep(step, False)
    kinds = [p.kind for p in signature.parameters.values()]
    positional = [k for k in kinds if k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    takes_generator = len(positional) >= 2
    try:
        signature.bind(*(("sample", "generator") if takes_generator else ("sample",)))
    except TypeError as err:
        raise TypeError(
            f"augment step {step!r} must take (sample) or (sample, generator), but its signature is {signature}: {err}"
        ) from err
    return CallableStep(step, takes_generator)


def describe_steps(steps: Sequence[Any]) -> str:
    """A stable text naming the steps and their parameters, for a loader's resume check: the
    same rule for augment and batch steps. A step with ``to_config()`` (every built-in) by its
    parameters; any other (a user's callable, a user's batch step) by its qualified name
    (`qualified_name`)."""
    parts = []
    for step in steps:
        config = getattr(step, "to_config", None)
        if callable(config):
            parts.append(repr(sorted(config().items())))
        else:
            parts.append(qualified_name(step.function if isinstance(step, CallableStep) else step))
    return "; ".join(parts)


def seed_global_generators(key: int) -> None:
    """Seed the process's global torch, numpy and `random` generators from one 64-bit key, as a
    worker does before each user step (about 10 us; ``torch.manual_seed`` would also seed every
    accelerator, 170 us here)."""
    torch.default_generator.manual_seed(key)
    np.random.seed(key & 0xFFFFFFFF)
    random.seed(key)


class SampleTransform:
    """Apply augmentation steps, then the normalisation, to one sample at a time; one per worker
    and image field.

    Args:
        steps: the augmentation steps, in order.
        height, width: the sample's size (3 channels).
        mean, std: per-channel values on the 0-255 scale: the sample is written as float32
            ``(x - mean) / std``; None writes uint8.
    """

    def __init__(
        self,
        steps: Sequence[AugmentStep],
        *,
        height: int,
        width: int,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        self.steps = [as_step(step) for step in steps]
        self.shape = (3, height, width)
        self._image = np.empty(self.shape, np.float32)
        self._spare = np.empty(self.shape, np.float32)
        self._pixels = np.empty(self.shape, np.uint8)
        self._colour = ColourKernels(height, width)
        self._rotator = Rotator(3, height, width) if any(isinstance(s, RandomRotation) for s in self.steps) else None
        self._ops = ImageOps(height, width, self._colour) if any(isinstance(s, _PLANE_STEPS) for s in self.steps) else None
        for step in self.steps:
            if isinstance(step, RandomErasing):
                step.fill_values(mean)  # a value "mean" without a mean fails here, not at the first sample
        self._mean = None if mean is None else [np.float32(v) for v in mean]
        self._mean_values = None if mean is None else [float(v) for v in mean]
        # Built-in steps only (random erasing last, if at all) run on the uint8 pixels themselves,
        # with the same values (hue within one level), and save the move into float planes and back.
        self._pixel_ops = (
            PixelOps(height, width)
            if self.steps
            and all(isinstance(s, _BUILTIN) for s in self.steps)
            and not any(isinstance(s, RandomErasing) for s in self.steps[:-1])
            else None
        )
        self._normalised = np.empty((256, 1, 3), np.float32)
        if self._mean is not None and std is not None:
            levels = np.arange(256, dtype=np.float32)
            for channel in range(3):
                self._normalised[:, 0, channel] = (levels - self._mean[channel]) / np.float32(std[channel])
        self._std = None if std is None else [np.float32(v) for v in std]
        # A rotation that ends the steps of a uint8 sample writes it straight into its row.
        self._rotates_last = bool(self.steps) and isinstance(self.steps[-1], RandomRotation) and mean is None

    def draw(self, seed: int, epoch: int | np.ndarray, indices: np.ndarray) -> list[np.ndarray]:
        """The draws of every step for records `indices` (dataset indices) of `epoch` (one for
        all, or one per record: repeated augmentation draws each copy as its own epoch): per step
        an array with one row per record (parameters, or the generator seed of a user's step)."""
        records = indices.astype(np.uint64)
        height, width = self.shape[1:]
        draws = []
        for j, step in enumerate(self.steps):
            keys = keys_by_epoch(seed, STEP_STREAM + j, epoch, records)
            if isinstance(step, RandomErasing):
                draws.append(step.boxes(uniforms(keys, step.draws), height=height, width=width))
            elif isinstance(step, _BUILTIN):
                draws.append(step.parameters(uniforms(keys, step.draws)))
            else:
                draws.append(np.stack([keys, keys_by_epoch(seed, RNG_STREAM + j, epoch, records)], axis=1))
        return draws

    def apply(self, source: np.ndarray, draws: list[np.ndarray], row: int, out: np.ndarray) -> None:
        """Transform `source` (H x W x 3 uint8) with row `row` of `draws` and write it into
        `out` (H x W x 3, uint8, or float32 when normalising)."""
        if self._pixel_ops is not None:
            self._apply_pixels(source, draws, row, out)
            return
        image = self._image
        for channel in range(3):
            np.copyto(image[channel], source[:, :, channel], casting="unsafe")
        steps = self.steps
        direct = self._rotates_last and out.dtype == np.uint8 and out.flags.c_contiguous
        for step, params in zip(steps[:-1] if direct else steps, draws, strict=False):  # a rotation that ends the steps has the last draws
            image = self._run(step, params[row], image)
        if direct:
            rotation, rotator = steps[-1], self._rotator
            if not isinstance(rotation, RandomRotation) or rotator is None:
                raise TypeError(f"the last step rotates straight into the output only if it is a RandomRotation, got {rotation!r}")
            rotator.rotate_to_pixels(image, float(draws[-1][row, 0]), stored_fill(rotation.fill), out)
            return
        if self._mean is not None and self._std is not None:
            for channel in range(3):
                target = out[:, :, channel]
                np.subtract(image[channel], self._mean[channel], out=target)
                np.divide(target, self._std[channel], out=target)
        else:
            for channel in range(3):
                np.copyto(out[:, :, channel], image[channel], casting="unsafe")

    def _apply_pixels(self, source: np.ndarray, draws: list[np.ndarray], row: int, out: np.ndarray) -> None:
        """`apply` for steps that all run on uint8 pixels (`PixelOps`); called only when they do."""
        ops = self._pixel_ops
        if ops is None:
            raise RuntimeError("no pixel operations were set up for these steps")
        steps = self.steps
        # a rotation that ends the steps of a uint8 sample writes it straight into its row
        direct = self._rotates_last and out.dtype == np.uint8 and out.flags.c_contiguous
        # the steps work in the sample's own row where they can (a uint8 row, not the target of
        # that last rotation), so that no copy into it ends them
        row_works = self._mean is None and not direct and out.dtype == np.uint8 and out.flags.c_contiguous and out.shape == ops.shape
        image, erased = self._run_pixel_steps(source, draws, row, ops, out if row_works else None, steps[:-1] if direct else steps)
        if direct:
            self._rotate_pixels(steps[-1], draws[-1][row], image, out)
            return
        if self._mean is None or self._std is None:
            if image is not out:
                np.copyto(out, image)
            return
        # (x - mean) / std of each level, per channel, in float32: one lookup writes the float32
        # sample (numpy's broadcast over an innermost axis of 3 took about 2 ms a 224x224 sample)
        cv2.LUT(image, self._normalised, dst=out)
        if erased is not None:
            # the box holds the fill exactly (the mean's is 0), not the whole number the pixels held
            step, box = erased
            top, left, box_h, box_w = (int(v) for v in box)
            mean, std = np.array(self._mean, np.float32), np.array(self._std, np.float32)
            if box_h and box_w:
                fill = (np.array(step.fill_values(self._mean_values), np.float32) - mean) / std
                cv2.rectangle(out, (left, top), (left + box_w - 1, top + box_h - 1), tuple(float(v) for v in fill), thickness=-1)

    def _run_pixel_steps(
        self, source: np.ndarray, draws: list[np.ndarray], row: int, ops: PixelOps, work: np.ndarray | None, steps: Sequence[AugmentStep]
    ) -> tuple[np.ndarray, tuple[RandomErasing, np.ndarray] | None]:
        """Run `steps` on uint8 pixels; return the array holding the sample and the box erased, if
        any. `source` is only read: the first step that changes pixels in place works on a copy,
        in `work` (the sample's row) if given, and a flip that ends the steps writes into `work`."""
        image = source if source.flags.c_contiguous else np.ascontiguousarray(source)
        erased: tuple[RandomErasing, np.ndarray] | None = None
        first, second = ops.buffers
        copy_to = first if work is None else work
        for number, (step, params) in enumerate(zip(steps, draws, strict=False)):
            drawn = params[row]
            owned = image is first or image is second or image is work
            if isinstance(step, RandomVerticalFlip):
                if drawn[0]:
                    last = number == len(steps) - 1 and work is not None and image is not work
                    image = ops.flip_vertically(image, target=work if last else None)
                continue
            if isinstance(step, RandomGrayscale):
                if drawn[0]:
                    target = image if owned else copy_to
                    ops.grayscale(image, target=target)  # from the source, if still there, into the copy
                    image = target
                continue
            if isinstance(step, ColorJitter):
                # the first adjustment reads the source, if still there, and writes the copy
                image = self._jitter_pixels(drawn, image, ops, None if owned else copy_to)
                continue
            if isinstance(step, RandomRotation):
                # into the sample's row, even from it (the rotation reads a copy of its pixels):
                # the steps then end in the row, with no copy into it; else in place if the
                # sample is ours, or into a buffer
                target = work if work is not None else image if owned else copy_to
                self._rotate_pixels(step, drawn, image, target)
                image = target
                continue
            if not owned:
                np.copyto(copy_to, image)
                image = copy_to
            if isinstance(step, RandomErasing):
                erased = (step, drawn)
                image = step.run(ops, image, drawn, self._mean_values)
            elif isinstance(step, _PLANE_STEPS):
                image = step.run(ops, image, drawn)
            else:  # every built-in step is one of the above: a pixel transform holds no other
                raise TypeError(f"{step!r} does not run on uint8 pixels")
        return image, erased

    def _rotate_pixels(self, step: AugmentStep, params: Any, image: np.ndarray, out: np.ndarray) -> None:
        if not isinstance(step, RandomRotation) or self._rotator is None:
            raise TypeError(f"a rotation of pixels needs a RandomRotation in a transform made with it, got {step!r}")
        self._rotator.rotate_interleaved(image, float(params[0]), stored_fill(step.fill), out)

    def _run(self, step: AugmentStep, params: Any, image: np.ndarray) -> np.ndarray:
        """Run one step on `image`; return the array now holding the sample."""
        if isinstance(step, _PLANE_STEPS):
            ops = self._ops
            if ops is None:
                raise RuntimeError(f"no image operations were set up for {type(step).__name__}")
            if isinstance(step, RandomErasing):
                return step.run(ops, image, params, self._mean_values)
            return step.run(ops, image, params)
        if isinstance(step, ColorJitter):
            self._jitter(params, image, self._colour)
            return image
        if isinstance(step, RandomRotation):
            if self._rotator is None:
                raise TypeError("a RandomRotation step runs only in a transform made with it")
            self._rotator.rotate(image, float(params[0]), stored_fill(step.fill))
            return image
        if isinstance(step, RandomVerticalFlip):
            return self._flip_vertically(params, image)
        if isinstance(step, RandomGrayscale):
            if params[0]:
                self._colour.grayscale(image)
            return image
        return self._call(step, int(params[0]), int(params[1]), image)

    @staticmethod
    def _jitter(params: Any, image: np.ndarray, colour: ColourKernels | PixelOps) -> None:
        """ColorJitter's adjustments in their drawn order, in place (float planes with
        `ColourKernels`, uint8 pixels with `PixelOps`); a NaN factor is one not applied."""
        for n in params[:4].astype(np.int64).tolist():
            factor = float(params[4 + n])
            if math.isnan(factor):
                continue
            if n == 0:
                colour.brightness(image, factor)
            elif n == 1:
                colour.contrast(image, factor)
            elif n == 2:
                colour.saturation(image, factor)
            else:
                colour.hue(image, factor)

    @staticmethod
    def _jitter_pixels(params: Any, image: np.ndarray, ops: PixelOps, target: np.ndarray | None) -> np.ndarray:
        """ColorJitter on uint8 pixels: as `_jitter`, the first adjustment taken writing into
        `target` when one is given; returns the array holding the sample."""
        adjustments = (ops.brightness, ops.contrast, ops.saturation, ops.hue)
        values = params.tolist()  # the order, then the factors, as Python floats: one conversion
        for n in values[:4]:
            factor = values[4 + int(n)]
            if math.isnan(factor):
                continue
            adjustments[int(n)](image, factor, target)
            if target is not None:
                image, target = target, None
        return image  # the source still, if no adjustment was taken

    def _flip_vertically(self, params: Any, image: np.ndarray) -> np.ndarray:
        """RandomVerticalFlip: the flipped rows land in the spare buffer, which becomes the image."""
        if not params[0]:
            return image
        np.copyto(self._spare, image[:, ::-1])  # image is self._image or a buffer of self._ops, never self._spare
        self._image, self._spare = self._spare, self._image
        return self._image

    def _call(
        self, step: Callable[[torch.Tensor, torch.Generator], torch.Tensor], seed: int, global_seed: int, image: np.ndarray
    ) -> np.ndarray:
        pixels = self._pixels
        np.copyto(pixels, image, casting="unsafe")
        generator = torch.Generator()
        generator.manual_seed(seed)
        seed_global_generators(global_seed)
        result = step(torch.from_numpy(pixels), generator)
        if not isinstance(result, torch.Tensor) or tuple(result.shape) != self.shape or result.dtype != torch.uint8:
            got = f"{tuple(result.shape)} {result.dtype}" if isinstance(result, torch.Tensor) else type(result).__name__
            raise TypeError(f"augment step {step!r} returned {got}; it must return a {self.shape} uint8 tensor")
        np.copyto(image, result.numpy(), casting="unsafe")
        return image
