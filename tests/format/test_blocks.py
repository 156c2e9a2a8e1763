"""The record table is checked a block of `CHECK_BLOCK_ROWS` rows at a time: block 0 when a shard
is opened, every other block when one of its rows is first used, a 1.2 shard's block against its
block checksum first. A broken row in a block nobody touched yet is refused when it is first
read, with the error the whole-table check gave (a corrupt one, with its block's ChecksumError),
and the rows of clean blocks read fine before it; opening a 1.2 shard reads no row past block 0."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import jpeg_bytes
from shardbytes import ShardBytes, build_shard
from test_malformed import check_error

from shardfmt import ChecksumError, DatasetWriter, FormatError, ShardfmtError, open_dataset
from shardfmt._storage import LocalFile
from shardfmt.format import IMAGE_CLASSIFICATION, ShardReader
from shardfmt.format._reader import CHECK_BLOCK_ROWS

NUM_RECORDS = 3 * CHECK_BLOCK_ROWS + 300  # blocks 0 to 2 full, block 3 of 300 rows
BLOCK_2 = 2 * CHECK_BLOCK_ROWS
Case = tuple[int, str, int, str]  # (record, column of the offset, record that reads fine, words)
CASES: dict[str, Callable[[ShardBytes], Case]] = {}


@functools.cache
def valid_shard() -> bytes:
    image = jpeg_bytes(8, 8, seed=0)
    return build_shard(IMAGE_CLASSIFICATION, ({"image": image, "label": i % 10, "key": f"{i:05d}"} for i in range(NUM_RECORDS)))


def case(function: Callable[[ShardBytes], Case]) -> Callable[[ShardBytes], Case]:
    CASES[function.__name__.removeprefix("case_").replace("_", "-")] = function
    return function


@case
def case_field_offset_mid_block(s: ShardBytes) -> Case:
    s.table()[BLOCK_2 + 7]["key.offset"] += 8  # rule 28b
    s.reseal_table()
    return BLOCK_2 + 7, "key.offset", CHECK_BLOCK_ROWS + 5, "field 'key' payload is not at the next aligned offset"


@case
def case_zero_height_in_the_last_row(s: ShardBytes) -> Case:
    s.table()[NUM_RECORDS - 1]["image.height"] = 0  # rule 28c
    s.reseal_table()
    return NUM_RECORDS - 1, "image.height", BLOCK_2, "image 'image' has a zero height or width"


@case
def case_first_row_of_a_block_not_contiguous(s: ShardBytes) -> Case:
    # Rule 25 across a block edge: row B must start where row B - 1 (block 0) ends.
    s.table()[CHECK_BLOCK_ROWS]["offset"] += 64
    s.reseal_table()
    return CHECK_BLOCK_ROWS, "offset", BLOCK_2, "does not start where the previous one ends"


@case
def case_a_block_over_the_spans_of_block_0(s: ShardBytes) -> Case:
    # Block 2 copies the rows of block 0 and row 2B - 1's span is made to end where block 0
    # starts: every row of block 2 is contiguous with its neighbour, its checksums hold, yet its
    # spans are those of block 0, checked on open. Block 1 is broken: not read here.
    table = s.table()
    table[BLOCK_2 : BLOCK_2 + CHECK_BLOCK_ROWS] = table[:CHECK_BLOCK_ROWS].copy()
    table[BLOCK_2 - 1]["offset"] = int(table[0]["offset"])
    table[BLOCK_2 - 1]["size"] = 0
    s.reseal_table()
    return BLOCK_2, "offset", 10, "before"


def read_fields(reader: ShardReader, index: int) -> tuple[int, str, int]:
    record = reader.record(index)
    return record["label"], record["key"], len(record["image"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_broken_row_of_an_untouched_block_is_refused_when_first_read(tmp_path: Path, name: str) -> None:
    shard = ShardBytes(valid_shard())
    record, column, clean, says = CASES[name](shard)
    path = tmp_path / "bad.shard"
    path.write_bytes(bytes(shard))
    image_size = len(jpeg_bytes(8, 8, seed=0))
    with ShardReader(path) as reader:
        assert read_fields(reader, 3) == (3, "00003", image_size)  # block 0, checked on open
        assert read_fields(reader, clean) == (clean % 10, f"{clean:05d}", image_size)
        offset = shard.column_offset(record, column)
        for _ in range(2):  # refused each time: the block stays unchecked
            with pytest.raises(ShardfmtError) as info:
                read_fields(reader, record)
            check_error(info.value, FormatError, path=path, offset=offset, record=record, says=says)
        with pytest.raises(FormatError):
            reader.payload(record, "image")
        with pytest.raises(FormatError):
            reader.check_all()
        assert read_fields(reader, 4) == (4, "00004", image_size)


def test_a_broken_row_is_refused_on_open_in_block_0(tmp_path: Path) -> None:
    shard = ShardBytes(valid_shard())
    shard.table()[CHECK_BLOCK_ROWS - 1]["image.reserved"] = 1  # rule 28e, last row of block 0
    shard.reseal_table()
    path = tmp_path / "bad.shard"
    path.write_bytes(bytes(shard))
    with pytest.raises(ShardfmtError) as info:
        ShardReader(path)
    offset = shard.column_offset(CHECK_BLOCK_ROWS - 1, "image.reserved")
    check_error(info.value, FormatError, path=path, offset=offset, record=CHECK_BLOCK_ROWS - 1, says="reserved column is not zero")


def test_a_label_without_a_class_in_an_untouched_block_is_refused_when_first_read(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    image = jpeg_bytes(8, 8, seed=0)
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, classes=[str(c) for c in range(10)]) as writer:
        for i in range(NUM_RECORDS):
            writer.write({"image": image, "label": i % 10, "key": f"{i:05d}"})
    manifest = json.loads((out / "manifest.json").read_text())
    shard_path = out / manifest["shards"][0]["path"]
    shard = ShardBytes(shard_path.read_bytes())
    shard.table()[BLOCK_2 + 1]["label"] = 10
    shard.reseal_table()
    shard_path.write_bytes(bytes(shard))
    with open_dataset(out, verify=True) as dataset:
        assert dataset[CHECK_BLOCK_ROWS]["label"] == CHECK_BLOCK_ROWS % 10
        with pytest.raises(ShardfmtError) as info:
            dataset[BLOCK_2 + 1]["label"]
        offset = shard.column_offset(BLOCK_2 + 1, "label")
        check_error(info.value, FormatError, path=shard_path, offset=offset, record=BLOCK_2 + 1, says="label 10 names no class")


def old_version(data: bytes) -> bytes:
    """The shard as a 1.1 writer wrote it: no block checksums, one checksum of the whole table."""
    shard = ShardBytes(data)
    shard.drop_table_blocks()
    shard.header()["minor"] = 1
    shard.reseal_header()
    return bytes(shard)


def test_a_1_1_table_is_read_ahead_in_one_request_before_its_checksum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without block checksums, step 22 reads every byte of the table: from a cold page cache it
    # comes in one read-ahead request (MADV_WILLNEED) rather than a fault's readahead at a time.
    path = tmp_path / "ok.shard"
    path.write_bytes(old_version(valid_shard()))
    asked: list[tuple[int, int]] = []
    will_need = LocalFile.will_need

    def spy(self: LocalFile, start: int, stop: int) -> None:
        asked.append((start, stop))
        will_need(self, start, stop)

    monkeypatch.setattr(LocalFile, "will_need", spy)
    with ShardReader(path) as reader:
        assert reader.version == (1, 1) and not reader.table_blocks
        assert asked == [(reader.table_offset, path.stat().st_size - 64)]
        assert read_fields(reader, NUM_RECORDS - 1)[0] == (NUM_RECORDS - 1) % 10


class RecordingSource:
    """A byte source that copies what it serves (as a remote one does) and records each range."""

    zero_copy = False

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.data = path.read_bytes()
        self.size = len(self.data)
        self.reads: list[tuple[int, int]] = []

    def read(self, start: int, stop: int) -> memoryview:
        self.reads.append((start, stop))
        return memoryview(self.data[start:stop])

    def close(self) -> None:
        pass


def table_reads(source: RecordingSource, shard: ShardBytes) -> list[tuple[int, int]]:
    """The ranges `source` served that hold a byte of the table's rows."""
    return [span for span in source.reads if span[0] < shard.rows_end and span[1] > shard.table_offset]


def test_opening_a_1_2_shard_reads_only_block_0_of_the_table(tmp_path: Path) -> None:
    path = tmp_path / "ok.shard"
    path.write_bytes(valid_shard())
    shard = ShardBytes(valid_shard())
    table, row = shard.table_offset, shard.table().dtype.itemsize
    source = RecordingSource(path)
    with ShardReader(path, source=source) as reader:
        assert reader.version == (1, 2) and reader.table_blocks
        assert table_reads(source, shard) == [(table, table + CHECK_BLOCK_ROWS * row)]  # block 0, no other row
        assert (shard.rows_end, len(shard) - 64) in source.reads  # the block checksums: 4 x 8 bytes
        source.reads.clear()
        assert read_fields(reader, BLOCK_2 + 5)[0] == (BLOCK_2 + 5) % 10
        # block 2, then block 1, whose last row rule 25 compares with block 2's first
        block_1, block_2 = table + CHECK_BLOCK_ROWS * row, table + BLOCK_2 * row
        assert table_reads(source, shard) == [(block_2, block_2 + CHECK_BLOCK_ROWS * row), (block_1, block_2)]
        reader.check_all()
        read = [read_fields(reader, i)[0] for i in (0, CHECK_BLOCK_ROWS, NUM_RECORDS - 1)]
        assert read == [0, CHECK_BLOCK_ROWS % 10, (NUM_RECORDS - 1) % 10]


def corrupt(data: bytes, record: int, column: str, value: int) -> tuple[ShardBytes, bytes]:
    """Change one column of one row and no checksum: only its block checksum can tell."""
    shard = ShardBytes(data)
    shard.table()[record][column] = value
    return shard, bytes(shard)


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "range-reads"])
def test_a_corrupt_row_of_an_untouched_block_is_refused_by_its_block_checksum(tmp_path: Path, mapped: bool) -> None:
    shard, data = corrupt(valid_shard(), BLOCK_2 + 7, "label", 3)  # a valid value, a corrupt byte
    path = tmp_path / "bad.shard"
    path.write_bytes(data)
    image_size = len(jpeg_bytes(8, 8, seed=0))
    clean = CHECK_BLOCK_ROWS + 2
    with ShardReader(path, source=None if mapped else RecordingSource(path)) as reader:
        assert read_fields(reader, 3) == (3, "00003", image_size)
        assert read_fields(reader, clean) == (clean % 10, f"{clean:05d}", image_size)
        first = shard.table_offset + BLOCK_2 * shard.table().dtype.itemsize
        for _ in range(2):  # refused each time: the block stays unverified
            with pytest.raises(ShardfmtError) as info:
                read_fields(reader, BLOCK_2 + 7)
            check_error(info.value, ChecksumError, path=path, offset=first, record=BLOCK_2, says="record table block 2, bytes")
        with pytest.raises(ChecksumError):
            reader.payload(BLOCK_2 + 1000, "image")  # another row of the same block
        with pytest.raises(ChecksumError):
            reader.check_all()
        with pytest.raises(ShardfmtError) as info:  # block 3 is sound, but rule 25 reads block 2's last row
            read_fields(reader, NUM_RECORDS - 1)
        check_error(info.value, ChecksumError, path=path, offset=first, record=BLOCK_2, says="record table block 2, bytes")


def test_a_corrupt_last_row_of_the_block_before_is_named_not_the_block_that_reads_it(tmp_path: Path) -> None:
    # Rule 25 compares block 2's first offset with block 1's last row: that row's bytes are
    # proven first, so the corruption is a ChecksumError of block 1, not a contiguity error of 2.
    last_of_1 = BLOCK_2 - 1
    size = int(ShardBytes(valid_shard()).table()[last_of_1]["size"])
    shard, data = corrupt(valid_shard(), last_of_1, "size", size + 64)
    path = tmp_path / "bad.shard"
    path.write_bytes(data)
    with ShardReader(path) as reader, pytest.raises(ShardfmtError) as info:
        read_fields(reader, BLOCK_2)
    first = shard.table_offset + CHECK_BLOCK_ROWS * shard.table().dtype.itemsize
    check_error(info.value, ChecksumError, path=path, offset=first, record=CHECK_BLOCK_ROWS, says="record table block 1, bytes")


def test_an_old_version_shard_reads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "old.shard"
    path.write_bytes(old_version(valid_shard()))
    with ShardReader(path) as reader:
        assert reader.version == (1, 1) and not reader.table_blocks
        read = [read_fields(reader, i)[0] for i in (0, BLOCK_2 + 7, NUM_RECORDS - 1)]
        assert read == [0, (BLOCK_2 + 7) % 10, (NUM_RECORDS - 1) % 10]
    shard, data = corrupt(old_version(valid_shard()), BLOCK_2 + 7, "label", 3)
    path.write_bytes(data)
    with pytest.raises(ShardfmtError) as info:
        ShardReader(path)  # one checksum of the whole table, on open
    check_error(info.value, ChecksumError, path=path, offset=shard.table_offset, record=None, says="record table checksum does not match")
