"""`preview`: a contact sheet (a PNG) of one batch as the `Loader` yields it, or of stored records
as they are, each tile labelled with its class name and record index.

The batch is the first batch of epoch 0 of a `Loader` with the given pipeline, size and seed: the
crops, flips and colours a training run would see. Its record indices are the sampler's first
batch, as the loader returns them (`return_indices`). Stored records are decoded as
stored and shrunk only to fit their tile, never enlarged. Tiles are laid out by `SheetLayout`,
row by row, each with a strip of text below it (Pillow's default font).
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ._dataset.reader import DatasetReader
from ._loader import Loader, Output
from ._sampling.policy import Sampling
from ._storage import RemoteOptions
from .ops import CenterCrop, Pipeline, RandomResizedCrop, Resize

__all__ = ["PIPELINES", "PreviewSheet", "SheetLayout", "Tile", "draw_label", "preview"]

PIPELINES: Final = ("train", "eval", "resize")
AUGMENT_NAMES: Final = ("scale", "ratio", "flip")
"""What `augment` may set: `ops.RandomResizedCrop`'s parameters, as the Loader's "train" pipeline takes them."""
BACKGROUND: Final = (255, 255, 255)
TEXT: Final = (0, 0, 0)


@dataclass(frozen=True)
class SheetLayout:
    """Where each tile lies: `rows` x `cols` tiles of `tile_height` x `tile_width` pixels, each
    with a text strip of `label_height` below it, `gap` pixels around and between them."""

    rows: int
    cols: int
    tile_height: int
    tile_width: int
    label_height: int = 14
    gap: int = 4

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the sheet in pixels."""
        width = self.cols * self.tile_width + (self.cols + 1) * self.gap
        height = self.rows * (self.tile_height + self.label_height) + (self.rows + 1) * self.gap
        return width, height

    def origin(self, number: int) -> tuple[int, int]:
        """(x, y) of the top left pixel of tile `number` (row by row); its label starts
        `tile_height` pixels below."""
        row, col = divmod(number, self.cols)
        return self.gap + col * (self.tile_width + self.gap), self.gap + row * (self.tile_height + self.label_height + self.gap)


@dataclass(frozen=True)
class Tile:
    """One tile: its pixels (H x W x 3 uint8), the record index and the text below it."""

    pixels: np.ndarray[Any, Any]
    index: int
    text: str


@dataclass(frozen=True)
class PreviewSheet:
    """What `preview` drew: the PNG's path, the layout and the tiles in order."""

    path: Path
    layout: SheetLayout
    tiles: tuple[Tile, ...]


def preview(
    dataset: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    rows: int = 4,
    cols: int = 8,
    pipeline: str = "train",
    size: int = 160,
    seed: int = 0,
    augment: Mapping[str, Any] | None = None,
    records: Sequence[int] | None = None,
    remote: RemoteOptions | None = None,
) -> PreviewSheet:
    """Draw a contact sheet of `dataset` into the PNG `out`.

    Args:
        dataset: the dataset root or its manifest, or a URL, as `Loader` takes it.
        out: the PNG to write.
        rows, cols: tiles of the sheet; the batch has ``rows * cols`` records (or every record
            of a smaller dataset).
        pipeline: "train", "eval" or "resize", the Loader's named pipelines, at `size`.
        size: the output side of the pipeline, and of each tile.
        seed: the Loader's seed: which records come first and how they are cut.
        augment: for "train", `ops.RandomResizedCrop` parameters: scale, ratio (pairs), flip.
        records: draw these records as stored instead of a loader batch (at most ``rows * cols``).
        remote: credentials and retries for a URL.

    Raises:
        ValueError: an option is out of range, or `augment` is given for another pipeline.
        IndexError: a record index is outside the dataset.
        ShardfmtError: the dataset cannot be read.
    """
    if rows < 1 or cols < 1 or size < 1:
        raise ValueError(f"rows, cols and size must be at least 1, got {rows}, {cols}, {size}")
    layout = SheetLayout(rows, cols, size, size)
    if records is not None:
        if not 1 <= len(records) <= rows * cols:
            raise ValueError(f"{len(records)} records do not fit {rows} x {cols} tiles")
        tiles = stored_tiles(dataset, records, size=size, remote=remote)
    else:
        tiles = loader_tiles(dataset, count=rows * cols, pipeline=make_pipeline(pipeline, size, augment), seed=seed, remote=remote)
    sheet = draw_sheet(tiles, layout)
    path = Path(out)
    sheet.save(path, "PNG")
    return PreviewSheet(path, layout, tuple(tiles))


def make_pipeline(name: str, size: int, augment: Mapping[str, Any] | None) -> Pipeline:
    """The Loader's pipeline `name` at `size`, "train" with `augment`'s RandomResizedCrop parameters."""
    if name not in PIPELINES:
        raise ValueError(f"pipeline must be one of {', '.join(PIPELINES)}, got {name!r}")
    if augment and name != "train":
        raise ValueError(f"augment sets the train pipeline's RandomResizedCrop; the {name} pipeline has no random draws")
    unknown = set(augment or {}) - set(AUGMENT_NAMES)
    if unknown:
        raise ValueError(f"augment takes {', '.join(AUGMENT_NAMES)}, not {', '.join(sorted(unknown))}")
    if name == "train":
        return RandomResizedCrop((size, size), **dict(augment or {}))
    if name == "eval":
        return CenterCrop((size, size))
    return Resize((size, size))


def loader_tiles(
    dataset: str | os.PathLike[str], *, count: int, pipeline: Pipeline, seed: int, remote: RemoteOptions | None = None
) -> list[Tile]:
    """The first `count` images of a Loader's first batch, labelled with class name and record index."""
    with DatasetReader(dataset, verify=False, remote=remote) as reader:
        classes, num_records = reader.classes, len(reader)
    if num_records == 0:
        raise ValueError("the dataset holds no records")
    batch_size = min(count, num_records)
    loader = Loader(dataset, batch_size=batch_size, seed=seed, num_workers=0, transform=pipeline, remote=remote,
                    sampling=Sampling(rank=0, world_size=1), output=Output(layout="NHWC", copy=True, return_indices=True))
    with loader:
        batch = next(iter(loader))
    images, labels, indices = batch if len(batch) == 3 else (batch[0], None, batch[1])  # a dataset without labels: no labels
    return [Tile(images[n].numpy(), int(index), _text(classes, None if labels is None else int(labels[n]), int(index)))
            for n, index in enumerate(indices)]


def stored_tiles(dataset: str | os.PathLike[str], indices: Sequence[int], *, size: int, remote: RemoteOptions | None = None) -> list[Tile]:
    """Records `indices` as stored, decoded and shrunk to fit a `size` x `size` tile (never enlarged).

    Raises:
        IndexError: an index is outside the dataset.
    """
    tiles = []
    with DatasetReader(dataset, remote=remote) as reader:
        image_field = next(field.name for field in reader.schema.fields if field.kind.is_image)
        for index in indices:
            if not 0 <= index < len(reader):
                raise IndexError(f"record {index} is outside the dataset's {len(reader)} records")
            record = reader[index]
            value = record[image_field]
            picture = Image.fromarray(np.asarray(value)) if isinstance(value, np.ndarray) else Image.open(io.BytesIO(bytes(value)))
            picture = picture.convert("RGB")
            picture.thumbnail((size, size), Image.Resampling.BILINEAR)
            label = int(record["label"]) if "label" in reader.schema.names else None
            tiles.append(Tile(np.asarray(picture), index, _text(reader.classes, label, index)))
    return tiles


def _text(classes: Sequence[str] | None, label: int | None, index: int) -> str:
    if label is None:
        return f"#{index}"
    name = classes[label] if classes is not None and 0 <= label < len(classes) else str(label)
    return f"{name} #{index}"


def draw_label(text: str, *, width: int, height: int) -> Image.Image:
    """The strip of text below a tile: `text` in Pillow's default font, cut to fit `width`."""
    strip = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(strip)
    font = ImageFont.load_default()
    while len(text) > 1 and draw.textlength(text, font=font) > width - 2:
        text = text[:-1]
    draw.text((1, 1), text, fill=TEXT, font=font)
    return strip


def draw_sheet(tiles: Sequence[Tile], layout: SheetLayout) -> Image.Image:
    """The sheet: each tile centred in its place (a smaller image on the background), its label below."""
    sheet = Image.new("RGB", layout.size, BACKGROUND)
    for number, tile in enumerate(tiles):
        x, y = layout.origin(number)
        height, width = tile.pixels.shape[:2]
        sheet.paste(Image.fromarray(tile.pixels), (x + (layout.tile_width - width) // 2, y + (layout.tile_height - height) // 2))
        sheet.paste(draw_label(tile.text, width=layout.tile_width, height=layout.label_height), (x, y + layout.tile_height))
    return sheet
