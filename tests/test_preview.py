"""`shardfmt preview`: the PNG's size, and tiles whose pixels are the Loader's batch (or the stored
images), labelled with class name and record index."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from shardfmt import Loader, Output, open_dataset
from shardfmt._cli import main
from shardfmt._preview import SheetLayout, draw_label, preview
from shardfmt._sampling.keys import sample_batches
from shardfmt.ops import CenterCrop, RandomResizedCrop


def tile(sheet: Image.Image, layout: SheetLayout, number: int) -> np.ndarray:
    x, y = layout.origin(number)
    return np.asarray(sheet.crop((x, y, x + layout.tile_width, y + layout.tile_height)))


def label_strip(sheet: Image.Image, layout: SheetLayout, number: int) -> np.ndarray:
    x, y = layout.origin(number)
    y += layout.tile_height
    return np.asarray(sheet.crop((x, y, x + layout.tile_width, y + layout.label_height)))


def read_png(path: Path) -> Image.Image:
    """The image at `path`, read whole and its file closed."""
    with Image.open(path) as image:
        image.load()
    return image



def test_layout_places_tiles_row_by_row() -> None:
    layout = SheetLayout(2, 3, 32, 32)
    assert layout.size == (3 * 32 + 4 * 4, 2 * (32 + 14) + 3 * 4) == (112, 104)
    assert [layout.origin(n) for n in (0, 1, 3, 5)] == [(4, 4), (40, 4), (4, 54), (76, 54)]


@pytest.mark.parametrize(("pipeline", "augment", "made"), [
    ("eval", None, CenterCrop((32, 32))),
    ("train", {"scale": (0.5, 1.0), "flip": 1.0}, RandomResizedCrop((32, 32), scale=(0.5, 1.0), flip=1.0)),
])
def test_a_sheet_holds_the_loaders_first_batch(
    small_dataset: Path, tmp_path: Path, pipeline: str, augment: dict | None, made: object
) -> None:
    result = preview(small_dataset, tmp_path / "grid.png", rows=2, cols=3, pipeline=pipeline, size=32, seed=5, augment=augment)
    sheet = read_png(tmp_path / "grid.png")
    assert sheet.size == (112, 104) and sheet.mode == "RGB"
    indices = [int(i) for i in sample_batches(40, batch_size=6, seed=5, epoch=0).batch(0)]
    assert [t.index for t in result.tiles] == indices
    with Loader(small_dataset, batch_size=6, seed=5, num_workers=1, transform=made, output=Output(layout="NHWC", copy=True)) as loader:
        images, labels = next(iter(loader))
    with open_dataset(small_dataset) as dataset:
        assert [int(dataset[i]["label"]) for i in indices] == labels.tolist()
    classes = ["a", "b", "c"]
    for n in range(6):
        assert np.array_equal(tile(sheet, result.layout, n), images[n].numpy())
        expected = draw_label(f"{classes[int(labels[n])]} #{indices[n]}", width=32, height=14)
        assert np.array_equal(label_strip(sheet, result.layout, n), np.asarray(expected))
    assert result.tiles[0].text == f"{classes[int(labels[0])]} #{indices[0]}"


def test_stored_records_are_shown_as_they_are(small_dataset: Path, tmp_path: Path) -> None:
    result = preview(small_dataset, tmp_path / "stored.png", rows=1, cols=4, size=64, records=[0, 17, 39])
    sheet = read_png(tmp_path / "stored.png")
    assert sheet.size == (4 * 64 + 5 * 4, 64 + 14 + 2 * 4)
    with open_dataset(small_dataset) as dataset:
        stored = Image.open(io.BytesIO(bytes(dataset[17]["image"]))).convert("RGB")
    width, height = stored.size  # at most 60 px: shown at its own size, centred
    x, y = result.layout.origin(1)
    left, top = x + (64 - width) // 2, y + (64 - height) // 2
    assert np.array_equal(np.asarray(sheet.crop((left, top, left + width, top + height))), np.asarray(stored))
    assert sheet.getpixel((x, y)) == (255, 255, 255)  # the background around a smaller image
    assert [t.text for t in result.tiles] == ["a #0", "c #17", "a #39"]
    assert np.array_equal(tile(sheet, result.layout, 3), np.full((64, 64, 3), 255, np.uint8))  # an unused tile


def test_the_command(small_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "grid.png"
    result = CliRunner().invoke(
        main,
        [
            "preview",
            str(small_dataset),
            "-o",
            str(out),
            "--rows",
            "2",
            "--cols",
            "2",
            "--size",
            "48",
            "--augment",
            "scale=0.25,1",
            "--augment",
            "flip=0",
            "--seed",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == f"4 records of the first train batch (seed 3) in 108x136 px: {out}\n"
    assert read_png(out).size == (2 * 48 + 3 * 4, 2 * (48 + 14) + 3 * 4) == (108, 136)
    result = CliRunner().invoke(main, ["preview", str(small_dataset), "-o", str(out), "--records", "1,2,40"])
    assert result.exit_code == 1 and "record 40 is outside the dataset's 40 records" in result.output
    result = CliRunner().invoke(main, ["preview", str(small_dataset), "-o", str(out), "--pipeline", "eval", "--augment", "flip=0"])
    assert result.exit_code == 1 and "the eval pipeline has no random draws" in result.output
    result = CliRunner().invoke(main, ["preview", str(small_dataset), "-o", str(out), "--augment", "zoom=2"])
    assert result.exit_code == 2 and "is none of scale=LOW,HIGH" in result.output
    result = CliRunner().invoke(
        main, ["preview", str(small_dataset), "-o", str(out), "--seed", "-1"]
    )  # the Loader's range, said by the CLI
    assert result.exit_code == 2 and "-1 is not in the range 0<=x<=18446744073709551615" in result.output
