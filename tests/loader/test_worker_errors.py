"""A failure in a loader worker keeps its class: the error raised in the training process is an
instance of the class the worker raised and of WorkerError, names the shard, record and offset,
and carries the worker's traceback as its cause."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
import torch
from conftest import jpeg_bytes
from shardbytes import ShardBytes

from shardfmt import ChecksumError, DatasetWriter, DecodeError, FormatError, ImageTransform, Loader, WorkerError, open_dataset
from shardfmt._errors import WorkerTraceback, worker_error_class, worker_error_kind
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.format._reader import CHECK_BLOCK_ROWS

NUM_RECORDS = 24


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("errors") / "ds"
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=12_000) as writer:
        for i in range(NUM_RECORDS):
            writer.write({"image": jpeg_bytes(40, 48, seed=i), "label": i, "key": f"r{i}"})
    return out


def corrupt(dataset: Path, tmp_path: Path, index: int) -> tuple[str, int, int]:
    """A copy of `dataset` with one payload byte of record `index` flipped; returns its shard
    path, record number and payload offset."""
    broken = tmp_path / "broken"
    shutil.copytree(dataset, broken)
    reader = open_dataset(broken)
    shard_index, local = reader.locate(index)
    shard = reader.shard(shard_index)
    offset = int(shard.table[local]["offset"])
    path = shard.path
    reader.close()
    with open(path, "r+b") as f:
        f.seek(offset + 100)
        byte = f.read(1)
        f.seek(offset + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    return path, local, offset


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.usefixtures("no_leaks")
def test_a_corrupt_record_raises_checksum_error(dataset: Path, tmp_path: Path, num_workers: int) -> None:
    path, record, offset = corrupt(dataset, tmp_path, 13)
    with pytest.raises(ChecksumError) as info:
        with Loader(tmp_path / "broken", batch_size=4, num_workers=num_workers, shuffle=False, transform=ImageTransform(size=16)) as loader:
            for _ in loader:
                pass
    error = info.value
    assert isinstance(error, WorkerError)
    assert (error.path, error.record, error.offset) == (path, record, offset)
    assert "does not match its checksum" in error.message and "dataset record 13" in error.message
    if num_workers:
        assert isinstance(error.__cause__, WorkerTraceback)
        assert "verify_record" in error.__cause__.trace and "ChecksumError" in error.__cause__.trace
    else:  # decoded in this process: the cause is the error itself, with its traceback
        assert type(error.__cause__) is ChecksumError and error.__cause__.__traceback__ is not None


def test_an_undecodable_record_raises_decode_error(tmp_path: Path) -> None:
    data = bytearray(jpeg_bytes(40, 40, seed=1))
    table = data.find(b"\xff\xc4")
    data[table + 5 : table + 21] = b"\xff" * 16  # a Huffman table no decoder accepts
    with DatasetWriter(tmp_path / "ds", schema=IMAGE_CLASSIFICATION) as writer:
        for i in range(6):
            writer.write({"image": bytes(data) if i == 4 else jpeg_bytes(40, 40, seed=i), "label": i, "key": f"r{i}"})
    with pytest.raises(DecodeError) as info:
        with Loader(tmp_path / "ds", batch_size=2, num_workers=1, shuffle=False, transform=ImageTransform(size=16)) as loader:
            list(loader)
    assert isinstance(info.value, WorkerError) and isinstance(info.value, ValueError)
    assert info.value.record == 4 and "does not decode" in info.value.message


class Refused(KeyError):
    """A user's error class, a subclass of a builtin one."""


class Oops(Exception):
    """A user's error class outside the closed set."""


def refuse_record_five(sample: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if int(sample[0, 0, 0]) == 255 - 5:
        raise Refused("record five")
    return sample


def oops(sample: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    raise Oops("a user's step failed")


@pytest.fixture(scope="module")
def marked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Flat gray images whose value is 255 - record, so a step can tell records apart."""

    out = tmp_path_factory.mktemp("marked") / "ds"
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION) as writer:
        for i in range(8):
            pixels = np.full((16, 16, 3), 255 - i, np.uint8)
            writer.write({"image": simplejpeg.encode_jpeg(pixels, quality=100), "label": i, "key": f"m{i}"})
    return out


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_user_steps_builtin_error_keeps_its_builtin_class(marked: Path, num_workers: int) -> None:
    with pytest.raises(KeyError) as info:
        with Loader(
            marked,
            batch_size=4,
            num_workers=num_workers,
            shuffle=False,
            transform=ImageTransform(crop="resize", size=8, augment=[refuse_record_five]),
        ) as loader:
            list(loader)
    assert isinstance(info.value, WorkerError) and not isinstance(info.value, Refused)
    assert info.value.record == 5 and "Refused: 'record five'" in info.value.message


def test_a_user_class_outside_the_closed_set_is_a_worker_error(marked: Path) -> None:
    with pytest.raises(WorkerError, match="Oops: a user's step failed") as info:
        with Loader(marked, batch_size=4, num_workers=1, transform=ImageTransform(crop="resize", size=8, augment=[oops])) as loader:
            list(loader)
    assert type(info.value) is WorkerError
    assert isinstance(info.value.__cause__, WorkerTraceback) and "raise Oops" in info.value.__cause__.trace


def test_worker_error_classes() -> None:
    checksum = worker_error_class("ChecksumError")
    assert checksum is worker_error_class("ChecksumError")
    assert issubclass(checksum, ChecksumError) and issubclass(checksum, WorkerError)
    assert worker_error_class("Oops") is WorkerError
    assert worker_error_class("system") is WorkerError  # a name, never code or a pickle
    assert worker_error_class("RejectError") is WorkerError
    assert worker_error_kind(Refused("x")) == "KeyError"
    assert worker_error_kind(ChecksumError("x")) == "ChecksumError"
    assert worker_error_kind(Oops("x")) == "Oops"
    error = checksum("payload does not match", path="a.shard", offset=64, record=3)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is checksum and str(again) == "a.shard: byte 64: record 3: payload does not match"


def write_three_blocks(out: Path) -> tuple[Path, ShardBytes]:
    """A one-shard dataset of 2 table blocks and 64 rows of a third; its shard and bytes."""
    image = jpeg_bytes(8, 8, seed=0)
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION) as writer:
        for i in range(2 * CHECK_BLOCK_ROWS + 64):
            writer.write({"image": image, "label": i, "key": f"{i:05d}"})
    shard_path = next(out.glob("*.shard"))
    return shard_path, ShardBytes(shard_path.read_bytes())


def read_until_error(out: Path, num_workers: int, kind: type[Exception]) -> tuple[Any, int]:
    """Read `out` in order until the loader raises `kind`; the error and the records read before."""
    seen = 0
    with pytest.raises(kind) as info:
        with Loader(out, batch_size=256, num_workers=num_workers, shuffle=False, transform=ImageTransform(size=8)) as loader:
            for _images, labels in loader:
                assert labels[0] == seen  # the rows of blocks 0 and 1 read fine, in order
                seen += len(labels)
    return info.value, seen


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_broken_table_row_of_a_later_block_is_named_when_the_loader_reaches_it(tmp_path: Path, num_workers: int) -> None:
    out, broken = tmp_path / "ds", 2 * CHECK_BLOCK_ROWS + 3
    shard_path, shard = write_three_blocks(out)
    shard.table()[broken]["image.channels"] = 2  # rule 28d, in block 2: not checked on open
    shard.reseal_table()
    shard_path.write_bytes(bytes(shard))
    error, seen = read_until_error(out, num_workers, FormatError)
    assert isinstance(error, WorkerError)
    assert (error.path, error.record, error.offset) == (str(shard_path), broken, shard.column_offset(broken, "image.channels"))
    assert "channels are not 1 or 3" in error.message and f"dataset record {broken}" in error.message
    # The batches of blocks 0 and 1 came (all but the few a loader prepares ahead of the one
    # that fails); a reader that checked the whole table on open gave none.
    assert 2 * CHECK_BLOCK_ROWS - 4 * 256 <= seen <= 2 * CHECK_BLOCK_ROWS


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_corrupt_table_row_of_a_later_block_is_refused_by_its_block_checksum(tmp_path: Path, num_workers: int) -> None:
    # The row's bytes change and no checksum is resealed: opening the shard hashes block 0 and
    # the block checksums only, so the corruption is found when the loader first reads block 2.
    out, broken = tmp_path / "ds", 2 * CHECK_BLOCK_ROWS + 3
    shard_path, shard = write_three_blocks(out)
    shard.table()[broken]["label"] = 7  # a valid value: only the block checksum can tell
    shard_path.write_bytes(bytes(shard))
    error, seen = read_until_error(out, num_workers, ChecksumError)
    assert isinstance(error, WorkerError)
    first = 2 * CHECK_BLOCK_ROWS
    assert (error.path, error.record, error.offset) == (str(shard_path), first, shard.column_offset(first, "offset"))
    assert "record table block 2" in error.message and "does not match its block checksum" in error.message
    assert 2 * CHECK_BLOCK_ROWS - 4 * 256 <= seen <= 2 * CHECK_BLOCK_ROWS
