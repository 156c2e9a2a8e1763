"""`ImageOutput`: how the loader delivers one image field of several (its size, channels, kernel)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._resize import INTERPOLATIONS

__all__ = ["ImageOutput"]


@dataclass(frozen=True)
class ImageOutput:
    """The tensor one image field ("jpeg" or "raw") becomes: uint8, (height, width, channels).

    Every image field of a record is cut at the same place: the pipeline draws one box on the
    first image field (the reference), and each other field takes that box scaled by its size
    ratio to the reference (a 4x high-resolution image takes the box 4x larger), with the same
    flip; a jpeg field decoded at a reduced DCT scale has that box snapped to its own scale
    (see `shardfmt.ops._crop.scale_plan`).

    Attributes:
        size: (height, width) or one int for both. None: the pipeline's size for the reference;
            for another field, that size times the field's size ratio to the reference when the
            ratio is the same for every record and gives whole pixels, else the pipeline's size.
        channels: 1 (grayscale), 3 (RGB) or 4 (RGBA; alpha 255 where none is stored). None: 3
            for jpeg; for raw, the stored count if every record has the same, else 3.
        interpolation: "bilinear" or "bicubic" (antialiased, for images) or "nearest" (for masks and label
            maps: every output pixel is one stored pixel, so no new label values appear).
    """

    size: int | tuple[int, int] | None = None
    channels: int | None = None
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        if self.size is not None:
            pair = (self.size, self.size) if isinstance(self.size, int) else tuple(self.size)
            if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 65535 for v in pair):
                raise ValueError(f"size must be a positive int or (height, width), got {self.size!r}")
            object.__setattr__(self, "size", (int(pair[0]), int(pair[1])))
        if self.channels not in (None, 1, 3, 4):
            raise ValueError(f"channels must be 1, 3 or 4, got {self.channels!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {self.interpolation!r}")

    def to_config(self) -> dict[str, Any]:
        size = [self.size, self.size] if isinstance(self.size, int) else list(self.size) if self.size is not None else None
        return {"size": size, "channels": self.channels, "interpolation": self.interpolation}
