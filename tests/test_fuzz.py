"""Fuzzing the reader: whatever bytes it is given, it raises only ShardfmtError and allocates little.

Each example mutates a valid shard (the golden vectors) by flipping, truncating, extending or
splicing bytes, or by setting one struct field or table column to an awkward value and resealing
every checksum so the structural checks behind them are reached. The reader then opens the result,
verifies and reads every field of every record. Anything but a ShardfmtError fails the test, and so
does a traced allocation peak above a small bound: the reader must check a stored size or count
before it allocates for it.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import fuzz_mutations
import numpy as np
import pytest
from conftest import jpeg_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shardbytes import ShardBytes

from shardfmt import (
    FormatError,
    ShardfmtError,
    ShardNotFoundError,
    ShardReader,
    open_dataset,
)
from shardfmt.dataset.verify import verify_dataset
from shardfmt.errors import ManifestError
from shardfmt.format.layout import (
    FOOTER_DTYPE,
    FOOTER_SIZE,
    HEADER_DTYPE,
    HEADER_SIZE,
    IMAGE_TYPES,
)
from shardfmt.tar.reader import TarShardReader
from shardfmt.tar.writer import TarShardWriter

ROOT = Path(__file__).resolve().parents[1]
SEEDS = [path.read_bytes() for path in sorted(ROOT.glob("spec/vectors/v*/valid/*.shard"))]
PEAK_LIMIT = 2 * 1024 * 1024
"""The seeds are at most a few KB; reading one allocates far less than this."""

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class MemorySource:
    """A byte source over an in-memory buffer (see shardfmt.storage.ByteSource)."""

    zero_copy = True

    def __init__(self, data: bytes) -> None:
        self.path = "fuzz.shard"
        self.size = len(data)
        self._view = memoryview(data)

    def read(self, start: int, stop: int) -> memoryview:
        return self._view[start:stop]

    def close(self) -> None:
        pass


def read_everything(data: bytes) -> None:
    with ShardReader("fuzz.shard", source=MemorySource(data)) as reader:
        images = [field.name for field in reader.schema.fields if field.type in IMAGE_TYPES]
        for index in range(len(reader)):
            reader.verify_record(index)
            record = reader.record(index)
            for name in record:
                record[name]
            for name in images:
                record.image_info(name)


def check_reader(data: bytes) -> None:
    """Read `data`; let only ShardfmtError through and bound the allocation peak."""
    tracemalloc.start()
    try:
        try:
            read_everything(data)
        except ShardfmtError:
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_LIMIT, f"reading {len(data)} bytes allocated {peak} bytes at peak"


seeds = st.sampled_from(SEEDS)


@FUZZ
@given(seeds, st.lists(st.tuples(st.integers(min_value=0), st.integers(1, 255)), min_size=1, max_size=8))
def test_flipped_bytes(seed: bytes, flips: list[tuple[int, int]]) -> None:
    data = bytearray(seed)
    for position, mask in flips:
        data[position % len(data)] ^= mask
    check_reader(bytes(data))


@FUZZ
@given(seeds, st.integers(min_value=0), st.binary(max_size=256), st.booleans())
def test_truncated_or_extended(seed: bytes, cut: int, tail: bytes, repeat_footer: bool) -> None:
    data = seed[: cut % (len(seed) + 1)] + tail
    if repeat_footer:
        data += seed[-FOOTER_SIZE:]  # a valid-looking footer after a wrong length
    check_reader(data)


@FUZZ
@given(seeds, seeds, st.integers(min_value=0), st.integers(min_value=0), st.integers(min_value=0), st.integers(0, 512))
def test_spliced(seed: bytes, donor: bytes, start: int, length: int, donor_start: int, donor_length: int) -> None:
    start %= len(seed) + 1
    stop = min(len(seed), start + length % 512)
    donor_start %= len(donor) + 1
    data = seed[:start] + donor[donor_start : donor_start + donor_length] + seed[stop:]
    check_reader(data)


# Structural fuzzing: set one field to an awkward value, then make every checksum match again.

def awkward_values(data: bytes) -> st.SearchStrategy[int]:
    special = [0, 1, 7, 8, 63, 64, 65, 4096, len(data), len(data) - 64, len(data) + 64, 1 << 24, (1 << 24) + 1]
    special += [(1 << bits) - 1 for bits in (8, 16, 31, 32, 63, 64)] + [1 << bits for bits in (30, 31, 40, 63)]
    return st.one_of(st.sampled_from(special), st.integers(0, (1 << 64) - 1))


def field_locations(shard: ShardBytes) -> list[tuple[int, int]]:
    """(offset, width) of every header and footer field and of every table cell that parses."""
    footer = shard.footer_offset
    places = [(HEADER_DTYPE.fields[n][1], HEADER_DTYPE[n].itemsize) for n in HEADER_DTYPE.names if n != "checksum"]
    places += [(footer + FOOTER_DTYPE.fields[n][1], FOOTER_DTYPE[n].itemsize) for n in FOOTER_DTYPE.names]
    dtype = shard.schema().record_dtype()
    for row in range(int(shard.footer()[0]["num_records"])):
        base = shard.table_offset + row * dtype.itemsize
        places += [(base + dtype.fields[n][1], dtype[n].itemsize) for n in dtype.names if n != "checksum"]
    return [(offset, min(width, 8)) for offset, width in places]


def reseal_what_parses(shard: ShardBytes) -> None:
    """Recompute every checksum whose input range still lies inside the file."""
    size = len(shard)
    if size < HEADER_SIZE + FOOTER_SIZE:
        return
    if HEADER_SIZE + shard.schema_size <= size:
        shard.reseal_header()
    table_offset, footer = shard.table_offset, shard.footer_offset
    if not table_offset <= footer:
        shard.reseal_footer()
        return
    try:
        dtype = shard.schema().record_dtype()
    except ShardfmtError:
        dtype = None
    num_records = int(shard.footer()[0]["num_records"])
    if dtype is not None and table_offset + num_records * dtype.itemsize <= footer:
        table = shard.table()
        for index in range(num_records):
            start, length = int(table["offset"][index]), int(table["size"][index])
            if start + length <= size:
                shard.reseal_record(index)
    shard.reseal_table()


@FUZZ
@given(st.data())
def test_one_field_set_and_resealed(data: st.DataObject) -> None:
    shard = ShardBytes(data.draw(seeds))
    offset, width = data.draw(st.sampled_from(field_locations(shard)))
    value = data.draw(awkward_values(bytes(shard))) & ((1 << (8 * width)) - 1)
    shard.data[offset : offset + width] = value.to_bytes(width, "little")
    reseal_what_parses(shard)
    check_reader(bytes(shard))


@FUZZ
@given(st.data())
def test_table_column_shuffled_and_resealed(data: st.DataObject) -> None:
    shard = ShardBytes(data.draw(seeds.filter(lambda s: int(ShardBytes(s).footer()[0]["num_records"]) > 1)))
    table = shard.table()
    column = data.draw(st.sampled_from([n for n in table.dtype.names if n != "checksum"]))
    order = data.draw(st.permutations(range(len(table))))
    table[column] = table[column][np.array(order)]
    reseal_what_parses(shard)
    check_reader(bytes(shard))


def test_seeds_read_cleanly() -> None:
    assert len(SEEDS) >= 5
    for seed in SEEDS:
        read_everything(seed)
        check_reader(seed)


# -- what the campaign found -------------------------------------------------------------------

def write_tar(path: Path) -> None:
    with TarShardWriter(path) as writer:
        writer.write("a", image=jpeg_bytes(seed=1), label=1)


@pytest.mark.parametrize("members", [[], None, 3, "jpg"])
def test_member_spans_that_are_not_an_object_are_a_format_error(tmp_path: Path, members: Any) -> None:
    write_tar(tmp_path / "t.tar")
    [row] = fuzz_mutations.index_records((tmp_path / "t.tar.idx").read_bytes())
    (tmp_path / "t.tar.idx").write_bytes(fuzz_mutations.write_index([dict(row, members=members)], tmp_path))
    with TarShardReader(tmp_path / "t.tar") as reader, pytest.raises(FormatError, match="members is a JSON") as caught:
        reader.members(0)
    assert (caught.value.path, caught.value.record) == (str(tmp_path / "t.tar.idx"), 0)


def set_manifest(root: Path, change: Any) -> None:
    document = json.loads((root / "manifest.json").read_text())
    change(document)
    (root / "manifest.json").write_text(json.dumps(document))


@pytest.mark.parametrize("name", ["a" * 300, "shard-00000.shard/x", "\ud800.shard"])
def test_a_shard_path_that_no_file_can_have_is_not_found(small_dataset: Path, name: str) -> None:
    set_manifest(small_dataset, lambda document: document["shards"][0].update(path=name))
    with open_dataset(small_dataset) as dataset, pytest.raises(ShardNotFoundError):
        dataset.shard(0)
    problems = verify_dataset(small_dataset).problems
    assert [type(problem) for problem in problems] == [ShardNotFoundError]


@pytest.mark.parametrize("name", ["a\x00b", "\ud800"])
def test_a_rejects_report_that_no_file_can_have_is_a_manifest_problem(small_dataset: Path, name: str) -> None:
    set_manifest(small_dataset, lambda document: document["rejects"].update(report=name, count=1))
    [problem] = verify_dataset(small_dataset).problems
    assert isinstance(problem, ManifestError) and "the rejects report cannot be read" in problem.message
