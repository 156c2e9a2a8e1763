"""A loader worker names, before it opens the shards of a chunk, what the opens and the table
checks will read (`DatasetReader.read_ahead`): from a cold page cache the disk then serves them
together instead of one shard after another. The hints are placed from the manifest alone."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from shardfmt import DatasetWriter, open_dataset
from shardfmt._storage import LocalFile
from shardfmt.format import Schema
from shardfmt.format._reader import CHECK_BLOCK_ROWS

LABELS = Schema.of(label="int64")
NUM_RECORDS = 3 * CHECK_BLOCK_ROWS + 10  # four blocks of table


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    with DatasetWriter(out, schema=LABELS) as writer:
        for i in range(NUM_RECORDS):
            writer.write({"label": i})
    return out


def test_a_shard_not_open_is_hinted_where_its_header_footer_and_blocks_lie(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hinted: list[tuple[int, int]] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_WILLNEED
        hinted.append((offset, offset + length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    with open_dataset(dataset) as reader:
        reader.read_ahead([0], [2 * CHECK_BLOCK_ROWS + 5])
        shard = reader.shard(0)
        assert shard.table_blocks
        size, row, table = shard.source.size, shard.dtype.itemsize, shard.table_offset
        wanted = [(0, shard.header_size), (table, table + CHECK_BLOCK_ROWS * row)]  # header; block 0
        wanted += [(table + CHECK_BLOCK_ROWS * row, table + 3 * CHECK_BLOCK_ROWS * row)]  # blocks 1 (rule 25) and 2
        wanted += [(table + NUM_RECORDS * row, size)]  # block checksums and footer
        page = os.sysconf("SC_PAGE_SIZE")
        for start, stop in wanted:  # each lies in a hinted range (widened to pages, merged)
            assert any(first <= start and stop <= end for first, end in hinted), (start, stop, hinted)
        assert all(first % page == 0 and end <= size for first, end in hinted)


def test_an_open_shard_is_hinted_only_for_blocks_not_yet_verified(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[tuple[int, int]]] = []

    def spy(self: LocalFile, ranges: list[tuple[int, int]]) -> None:
        asked.append(ranges)

    with open_dataset(dataset) as reader:
        shard = reader.shard(0)
        row, table = shard.dtype.itemsize, shard.table_offset
        monkeypatch.setattr(LocalFile, "prefetch", spy)
        reader.read_ahead([0, 0], [3, CHECK_BLOCK_ROWS + 1])  # block 0 is verified on open
        assert asked == [[(table + CHECK_BLOCK_ROWS * row, table + 2 * CHECK_BLOCK_ROWS * row)]]
        assert reader[CHECK_BLOCK_ROWS + 1]["label"] == CHECK_BLOCK_ROWS + 1
        asked.clear()
        reader.read_ahead([0], [CHECK_BLOCK_ROWS + 7])  # its block is verified now: no system call
        assert asked == []


def test_the_hints_change_no_result(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(os, "posix_fadvise", lambda *args: calls.append(args))
    with open_dataset(dataset) as reader:
        reader.read_ahead([0], [NUM_RECORDS - 1])
        reader.read_ahead([0], [NUM_RECORDS + 10**6])  # a hint past the table is harmless
        assert [reader[i]["label"] for i in (0, NUM_RECORDS - 1)] == [0, NUM_RECORDS - 1]
    assert calls
