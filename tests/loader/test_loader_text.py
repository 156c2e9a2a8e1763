"""Captions and metadata loaded with their images: ``fields={"image": 16, "txt": None, "json":
None}`` over image-text tars (written with webdataset's ShardWriter, as img2dataset lays them out)
gives lists of str and parsed JSON batched with the images, with exact epochs, resume and ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import jpeg_bytes

from shardfmt import ImageTransform, Loader, Output, Sampling, convert
from shardfmt._dataset.tars import index_tars

wds = pytest.importorskip("webdataset")

NUM = 14
FIELDS = {"image": 16, "txt": None, "json": None, "key": None}


def samples() -> list[dict[str, Any]]:
    return [
        {"__key__": f"{i:09d}", "jpg": jpeg_bytes(20, 24, seed=i), "txt": f"caption {i} \u00e9", "json": {"i": i, "tags": ["x"] * (i % 3)}}
        for i in range(NUM)
    ]


@pytest.fixture(scope="module", params=["binary", "in-place"])
def image_text(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("i2d")
    (folder / "tars").mkdir()
    with wds.ShardWriter(str(folder / "tars" / "%05d.tar"), maxcount=5, verbose=0) as sink:
        for sample in samples():
            sink.write(sample)
    if request.param == "in-place":
        index_tars([folder / "tars"])
        return folder / "tars"
    convert(folder / "tars", folder / "out", workers=1)
    return folder / "out"


def check_batch(batch: dict[str, Any]) -> list[str]:
    by_key = {s["__key__"]: s for s in samples()}
    assert isinstance(batch["image"], torch.Tensor) and batch["image"].shape[1:] == (3, 16, 16)
    assert len(batch["txt"]) == len(batch["json"]) == len(batch["key"]) == batch["image"].shape[0]
    for key, text, meta in zip(batch["key"], batch["txt"], batch["json"], strict=True):
        assert isinstance(text, str) and text == by_key[key]["txt"] and meta == by_key[key]["json"]
    return list(batch["key"])


def test_every_epoch_delivers_each_caption_once_with_its_image(image_text: Path) -> None:
    with Loader(image_text, batch_size=4, num_workers=2, fields=FIELDS, seed=3) as loader:
        epochs = [[key for batch in loader for key in check_batch(batch)] for _ in range(2)]
    assert [sorted(keys) for keys in epochs] == [sorted(s["__key__"] for s in samples())] * 2
    assert epochs[0] != epochs[1]  # shuffled anew


def test_resume_and_ranks_give_the_same_captions(image_text: Path) -> None:
    settings: dict[str, Any] = dict(batch_size=3, num_workers=1, fields=FIELDS, seed=7)
    with Loader(image_text, **settings) as reference:
        expected = [check_batch(batch) for batch in reference]
    with Loader(image_text, **settings) as first:
        iterator = iter(first)
        next(iterator)
        next(iterator)
        state = first.state_dict()
    with Loader(image_text, **settings) as resumed:
        resumed.load_state_dict(state)
        assert [check_batch(batch) for batch in resumed] == expected[2:]
    ranks = []
    for rank in range(2):
        with Loader(image_text, **settings, sampling=Sampling(rank=rank, world_size=2)) as loader:
            ranks.append([key for batch in loader for key in check_batch(batch)])
    assert not set(ranks[0]) & set(ranks[1]) and sorted(ranks[0] + ranks[1]) == sorted(s["__key__"] for s in samples())


def test_a_dataset_without_labels_gives_images_alone(image_text: Path) -> None:
    with Loader(image_text, batch_size=5, num_workers=1, shuffle=False, transform=ImageTransform(size=16)) as loader:
        batches = list(loader)
    assert [tuple(b.shape) for b in batches] == [(5, 3, 16, 16), (5, 3, 16, 16), (4, 3, 16, 16)]
    with Loader(
        image_text, batch_size=7, num_workers=0, shuffle=False, transform=ImageTransform(size=16), output=Output(return_indices=True)
    ) as loader:
        images, indices = next(iter(loader))
    assert indices.tolist() == list(range(7)) and images.shape == (7, 3, 16, 16)


def test_preview_draws_a_dataset_without_labels(image_text: Path, tmp_path: Path) -> None:
    from shardfmt._preview import preview

    sheet = preview(image_text, tmp_path / "grid.png", rows=1, cols=3, size=16, records=None)
    assert [tile.text for tile in sheet.tiles] == [f"#{tile.index}" for tile in sheet.tiles] and len(sheet.tiles) == 3
