"""Crop rules, vectorised over a chunk of records: which box of the source each output comes from.

Every pipeline maps (heights, widths, per-record random keys) to integer boxes
(top, left, height, width) in source pixels plus a flip flag; the decoder then resizes each box
to the fixed output size. Boxes come from the record table, so no payload is read to choose them.
A box at least 2, 4 or 8 times the output size is decoded at that reduced DCT scale, so its
edges are snapped to multiples of the scale: the scaled box is then whole pixels and resizes
exactly (an integer crop of a fractional box costs about 6 dB of PSNR).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from .._arguments import check_number, check_pair
from .._sampling.keys import uniforms

__all__ = [
    "CenterCrop",
    "CropPlan",
    "Pipeline",
    "RandomCrop",
    "RandomResizedCrop",
    "Resize",
    "center_offsets",
    "check_pipeline",
    "dct_scale",
    "field_resize",
    "pipeline_from_config",
    "resized_size",
    "scale_plan",
    "snap_to_scale",
]

_ATTEMPTS = 10


@dataclass(frozen=True)
class CropPlan:
    """Per-record boxes in source pixels and horizontal flips, all int64/bool arrays of one length."""

    top: np.ndarray
    left: np.ndarray
    height: np.ndarray
    width: np.ndarray
    flip: np.ndarray


def _size_pair(size: int | tuple[int, int]) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(isinstance(v, int) and 0 < v <= 65535 for v in pair):
        raise ValueError(f"size must be a positive int or (height, width), got {size!r}")
    return (int(pair[0]), int(pair[1]))


MAX_ASPECT = 65535
"""The largest aspect ratio (height over width) a random box may be drawn with: a box one pixel wide
is then as tall as the tallest image the format holds (65,535), so no larger ratio ever fits."""
MIN_ASPECT = 1 / MAX_ASPECT
"""The smallest, the same the other way round."""


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision's RandomResizedCrop (same parameters, same sampling rule) then a random flip.

    Up to 10 attempts draw an area fraction uniformly from `scale` and a log-uniform aspect ratio
    from `ratio`; the first box that fits is placed uniformly; otherwise a center crop clamped to
    `ratio`. `flip` is the probability of a horizontal flip.
    """

    op: ClassVar[str] = "random_resized_crop"
    """The name of this pipeline in its `to_config` form."""

    size: tuple[int, int] = (224, 224)
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _size_pair(self.size))
        check_pair("scale", self.scale, 0, 1, low_open=True)
        check_pair("ratio", self.ratio, MIN_ASPECT, MAX_ASPECT)
        check_number("flip", self.flip, 0, 1, note=" (a probability)")

    def plan(self, heights: np.ndarray, widths: np.ndarray, keys: np.ndarray) -> CropPlan:
        n = len(heights)
        h_src = heights.astype(np.float64)
        w_src = widths.astype(np.float64)
        u = uniforms(keys, 4 * _ATTEMPTS + 1).reshape(n, -1)
        area = (h_src * w_src)[:, None]
        target = area * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, 0 : 4 * _ATTEMPTS : 4])
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = np.exp(log_lo + (log_hi - log_lo) * u[:, 1 : 4 * _ATTEMPTS : 4])
        w = np.round(np.sqrt(target * aspect)).astype(np.int64)
        h = np.round(np.sqrt(target / aspect)).astype(np.int64)
        fits = (w > 0) & (w <= widths[:, None]) & (h > 0) & (h <= heights[:, None])
        first = np.argmax(fits, axis=1)
        found = fits[np.arange(n), first]
        rows = np.arange(n)
        h_pick, w_pick = h[rows, first], w[rows, first]
        top = np.floor(u[rows, 4 * first + 2] * (heights - h_pick + 1)).astype(np.int64)
        left = np.floor(u[rows, 4 * first + 3] * (widths - w_pick + 1)).astype(np.int64)
        # torchvision's fallback: the whole image, clamped to the ratio range, centered.
        in_ratio = w_src / h_src
        fb_w = np.where(
            in_ratio < self.ratio[0], widths, np.where(in_ratio > self.ratio[1], np.round(h_src * self.ratio[1]), widths)
        ).astype(np.int64)
        fb_h = np.where(in_ratio < self.ratio[0], np.round(w_src / self.ratio[0]), heights).astype(np.int64)
        fb_h = np.clip(fb_h, 1, heights)
        fb_w = np.clip(fb_w, 1, widths)
        plan = CropPlan(
            top=np.where(found, top, (heights - fb_h) // 2),
            left=np.where(found, left, (widths - fb_w) // 2),
            height=np.where(found, h_pick, fb_h),
            width=np.where(found, w_pick, fb_w),
            flip=u[:, -1] < self.flip,
        )
        return snap_to_scale(plan, heights, widths, self.size)

    def with_size(self, size: tuple[int, int]) -> RandomResizedCrop:
        """The same crop rule, to `size`."""
        return dataclasses.replace(self, size=size)

    def to_config(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "size": list(self.size),
            "scale": list(self.scale),
            "ratio": list(self.ratio),
            "flip": self.flip,
        }


@dataclass(frozen=True)
class CenterCrop:
    """Evaluation: torchvision's ``Resize(resize)`` then ``CenterCrop(size)``.

    The pixels are torchvision's: the whole image is resized so that its shorter side is
    `resize` (`resized_size`), then the centered `size` box of that is taken at whole pixels
    (`center_offsets`). `plan` gives that box mapped back to source pixels (rounded): the region
    the crop shows, which further image fields are carried by; a decoder of the crop itself
    uses `resized_crop` instead.
    """

    op: ClassVar[str] = "center_crop"
    """The name of this pipeline in its `to_config` form."""

    size: tuple[int, int] = (224, 224)
    resize: int = 256

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _size_pair(self.size))
        if self.resize < max(self.size):
            raise ValueError(f"resize ({self.resize}) must be at least the crop size {self.size}")

    def plan(self, heights: np.ndarray, widths: np.ndarray, keys: np.ndarray) -> CropPlan:
        short = np.minimum(heights, widths).astype(np.float64)
        factor = short / self.resize  # source pixels per resized pixel
        new_h = np.where(heights <= widths, self.resize, np.floor(self.resize * heights / short)).astype(np.int64)
        new_w = np.where(widths <= heights, self.resize, np.floor(self.resize * widths / short)).astype(np.int64)
        crop_top = np.round((new_h - self.size[0]) / 2.0)
        crop_left = np.round((new_w - self.size[1]) / 2.0)
        height = np.clip(np.round(self.size[0] * factor), 1, heights).astype(np.int64)
        width = np.clip(np.round(self.size[1] * factor), 1, widths).astype(np.int64)
        top = np.clip(np.round(crop_top * factor), 0, heights - height).astype(np.int64)
        left = np.clip(np.round(crop_left * factor), 0, widths - width).astype(np.int64)
        return snap_to_scale(CropPlan(top, left, height, width, np.zeros(len(heights), bool)), heights, widths, self.size)

    def resized_crop(self, height: int, width: int, *, size: tuple[int, int] | None = None) -> tuple[int, int, int, int]:
        """The crop of an image of `height` x `width` as torchvision makes it: (resized height,
        resized width, top, left), the box of `size` (default the pipeline's; a further field's
        output size, with `resize` scaled alike) at (top, left) of the whole image resized."""
        out = self.size if size is None else size
        resize = self.resize if size is None else field_resize(self.resize, self.size, out)
        new_h, new_w = resized_size(height, width, resize)
        top, left = center_offsets(new_h, new_w, out)
        return new_h, new_w, top, left

    def with_size(self, size: tuple[int, int]) -> CenterCrop:
        """The same crop to `size`, its `resize` scaled with it (at least the larger side), so
        that the crop keeps its share of the image."""
        resize = max(max(size), round(self.resize * max(size) / max(self.size)))
        return dataclasses.replace(self, size=size, resize=resize)

    def to_config(self) -> dict[str, Any]:
        return {"op": self.op, "size": list(self.size), "resize": self.resize}


def resized_size(height: int, width: int, shorter: int) -> tuple[int, int]:
    """torchvision's ``Resize(shorter)`` size (``_compute_resized_output_size`` with one int):
    the shorter side becomes `shorter`, the longer ``int(shorter * long / short)``."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(shorter * long / short)
    return (new_long, shorter) if width <= height else (shorter, new_long)


def center_offsets(height: int, width: int, size: tuple[int, int]) -> tuple[int, int]:
    """torchvision's ``center_crop`` anchor of a `size` box in a `height` x `width` image:
    ``int(round((height - size_h) / 2.0))`` (Python's round, half to even), likewise left."""
    return int(round((height - size[0]) / 2.0)), int(round((width - size[1]) / 2.0))


def field_resize(resize: int, size: tuple[int, int], field_size: tuple[int, int]) -> int:
    """A further image field's `resize` for a `CenterCrop(size, resize=resize)`: scaled by the
    ratio of the output heights, rounded half to even, at least the field's larger side."""
    return max(int(round(resize * field_size[0] / size[0])), max(field_size))


@dataclass(frozen=True)
class Resize:
    """Plain decode: the whole image resized to `size`, aspect ratio not kept."""

    op: ClassVar[str] = "resize"
    """The name of this pipeline in its `to_config` form."""

    size: tuple[int, int] = (224, 224)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _size_pair(self.size))

    def plan(self, heights: np.ndarray, widths: np.ndarray, keys: np.ndarray) -> CropPlan:
        zeros = np.zeros(len(heights), np.int64)
        plan = CropPlan(zeros, zeros, heights.astype(np.int64), widths.astype(np.int64), np.zeros(len(heights), bool))
        return snap_to_scale(plan, heights.astype(np.int64), widths.astype(np.int64), self.size)

    def with_size(self, size: tuple[int, int]) -> Resize:
        """The whole image, resized to `size`."""
        return dataclasses.replace(self, size=size)

    def to_config(self) -> dict[str, Any]:
        return {"op": self.op, "size": list(self.size)}


@dataclass(frozen=True)
class RandomCrop:
    """A box of exactly `size` placed uniformly (no resampling: the crop is copied), then a random
    flip: the usual super-resolution patch. A side shorter than `size` is taken whole and resized.
    Its boxes are never larger than the output, so they are decoded at full scale and need no
    snapping.
    """

    op: ClassVar[str] = "random_crop"
    """The name of this pipeline in its `to_config` form."""

    size: tuple[int, int] = (224, 224)
    flip: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _size_pair(self.size))
        if not 0 <= self.flip <= 1:
            raise ValueError(f"flip is a probability in [0, 1], got {self.flip}")

    def plan(self, heights: np.ndarray, widths: np.ndarray, keys: np.ndarray) -> CropPlan:
        u = uniforms(keys, 3)
        height = np.minimum(heights, self.size[0]).astype(np.int64)
        width = np.minimum(widths, self.size[1]).astype(np.int64)
        top = np.floor(u[:, 0] * (heights - height + 1)).astype(np.int64)
        left = np.floor(u[:, 1] * (widths - width + 1)).astype(np.int64)
        return CropPlan(top, left, height, width, u[:, 2] < self.flip)

    def with_size(self, size: tuple[int, int]) -> RandomCrop:
        """Boxes of `size`, placed by the same rule."""
        return dataclasses.replace(self, size=size)

    def to_config(self) -> dict[str, Any]:
        return {"op": self.op, "size": list(self.size), "flip": self.flip}


class Pipeline(Protocol):
    """What ``ImageTransform(crop=...)`` (and ``Loader(transform=...)``, ``Dataset(transform=...)``)
    take: the built-ins (`RandomResizedCrop`, `RandomCrop`, `CenterCrop`, `Resize`) or an object of
    your own with these members (docs/augmentation.md, "Pipelines and batch steps of your own"). A
    transform checks them when it is made (`check_pipeline`), and a loader whose workers are
    spawned checks that the object pickles.
    """

    @property
    def size(self) -> tuple[int, int]:
        """The (height, width) every box is resized to."""
        ...

    def plan(self, heights: np.ndarray, widths: np.ndarray, keys: np.ndarray) -> CropPlan:
        """The boxes of records of `heights` x `widths` (int64 arrays of one length) and their
        flips, drawn from `keys` (uint64, one per record, a pure function of (seed, epoch,
        record): `sampling.keys.uniforms` turns them into uniform floats). A box lies inside
        its image and is at least one pixel; one at least 2, 4 or 8 times `size` is decoded
        at that reduced DCT scale, its edges rounded outward to the scale."""
        ...

    def to_config(self) -> dict[str, Any]:
        """The pipeline's parameters as a JSON object: a loader's state records them (but
        ``"size"``) and a resume refuses a pipeline whose parameters differ."""
        ...

    def with_size(self, size: tuple[int, int]) -> Pipeline:
        """The same pipeline cropping to `size` (``Loader.set_size``)."""
        ...


PIPELINE_MEMBERS = ("size", "plan", "to_config", "with_size")
"""The members of `Pipeline` a loader calls."""


def check_pipeline(pipeline: Any, *, name: str = "pipeline") -> None:
    """Refuse an object that is not a `Pipeline`: one lacking a member, a `size` that is not a
    pair of positive ints, or a `to_config` that is not a JSON object. `name`: the argument that
    gave it (``ImageTransform(crop=...)``), as the message says it.

    Raises:
        TypeError: naming what is missing or malformed.
    """
    missing = [
        name for name in PIPELINE_MEMBERS if not hasattr(pipeline, name) or (name != "size" and not callable(getattr(pipeline, name)))
    ]
    if missing:
        raise TypeError(
            f"{name} must be 'train', 'eval', 'resize' or a pipeline of shardfmt.ops (RandomResizedCrop, RandomCrop, CenterCrop, "
            f"Resize) or an object with size, plan(), to_config() and with_size(), got {pipeline!r}, which lacks {' and '.join(missing)}"
        )
    size = pipeline.size
    if not (isinstance(size, tuple) and len(size) == 2 and all(isinstance(v, int) and 0 < v <= 65535 for v in size)):
        raise TypeError(f"pipeline {pipeline!r}: size must be a (height, width) tuple of ints in [1, 65535], got {size!r}")
    config = pipeline.to_config()
    try:
        if not isinstance(config, dict):
            raise TypeError(f"it is a {type(config).__name__}")
        json.dumps(config, sort_keys=True)
    except (TypeError, ValueError) as err:
        raise TypeError(f"pipeline {pipeline!r}: to_config() must return a JSON object (a loader's state records it): {err}") from err


DCT_SCALES = (8, 4, 2)


def dct_scale(box_height: int, box_width: int, size: tuple[int, int]) -> int:
    """The largest libjpeg-turbo scale (1/8, 1/4, 1/2) that keeps a box at least `size`: 8, 4, 2 or 1."""
    for scale in DCT_SCALES:
        if box_height >= scale * size[0] and box_width >= scale * size[1]:
            return scale
    return 1


def snap_to_scale(plan: CropPlan, heights: np.ndarray, widths: np.ndarray, size: tuple[int, int]) -> CropPlan:
    """Round the edges of every box that will be decoded at 1/s scale to multiples of s, so that
    the box is a whole number of pixels of the scaled image (each edge moves by at most s/2
    source pixels; a box that would pass the image's edge loses s instead)."""
    top, left, height, width = plan.top.copy(), plan.left.copy(), plan.height.copy(), plan.width.copy()
    # Snapping can grow a box into the next scale (31 px rounds to 32); repeat until every box is
    # aligned to the scale it now qualifies for. Two rounds suffice; four are allowed.
    for _ in range(4):
        changed = False
        for scale in DCT_SCALES:
            chosen = (height >= scale * size[0]) & (width >= scale * size[1]) & ((top | left | height | width) % scale > 0)
            if not chosen.any():
                continue
            changed = True
            half = scale // 2
            y0 = (top[chosen] + half) // scale * scale
            x0 = (left[chosen] + half) // scale * scale
            y1 = np.minimum((top[chosen] + height[chosen] + half) // scale * scale, heights[chosen] // scale * scale)
            x1 = np.minimum((left[chosen] + width[chosen] + half) // scale * scale, widths[chosen] // scale * scale)
            top[chosen], left[chosen], height[chosen], width[chosen] = y0, x0, y1 - y0, x1 - x0
        if not changed:
            break
    return CropPlan(top, left, height, width, plan.flip)


def scale_plan(plan: CropPlan, heights: np.ndarray, widths: np.ndarray, ref_heights: np.ndarray, ref_widths: np.ndarray) -> CropPlan:
    """Carry boxes drawn on reference images to images of other sizes of the same scenes.

    Each edge is scaled by the size ratio and rounded to the nearest pixel, so with an integer
    ratio s the box (top, left, h, w) becomes exactly (top s, left s, h s, w s); every box keeps
    at least one pixel and stays inside its image. The flips are the reference's.

    A field decoded at a reduced DCT scale then has its carried box snapped to that scale, chosen
    on its own box and output size (`snap_to_scale`). With an integer ratio r and an output r
    times the reference's, the field's scale is the reference's and the reference's snapped box
    scaled by r already lies on that grid, so the carried box stays exactly r times the
    reference's; other ratios can move its edges by up to half the field's scale.
    """
    h, w = heights.astype(np.int64), widths.astype(np.int64)
    rh, rw = ref_heights.astype(np.int64), ref_widths.astype(np.int64)
    top = np.minimum((plan.top * h + rh // 2) // rh, h - 1)
    left = np.minimum((plan.left * w + rw // 2) // rw, w - 1)
    bottom = np.clip(((plan.top + plan.height) * h + rh // 2) // rh, top + 1, h)
    right = np.clip(((plan.left + plan.width) * w + rw // 2) // rw, left + 1, w)
    return CropPlan(top, left, bottom - top, right - left, plan.flip)


PIPELINES: dict[str, type[RandomResizedCrop | CenterCrop | Resize | RandomCrop]] = {
    cls.op: cls for cls in (RandomResizedCrop, CenterCrop, Resize, RandomCrop)
}
"""Every pipeline class by the name it declares (`op`): the one place a name is looked up."""


def pipeline_from_config(config: dict[str, Any]) -> Pipeline:
    """Rebuild a pipeline from its `to_config()` form (the crop vectors hold that form)."""
    op = config.get("op")
    cls = PIPELINES.get(op) if isinstance(op, str) else None
    if cls is None:
        raise ValueError(f"unknown pipeline op {op!r}")
    params: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k != "op"}
    return cls(**params)
