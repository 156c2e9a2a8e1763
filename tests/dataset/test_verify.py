"""verify_dataset and summarise_dataset: every problem is named by file, byte offset and record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import jpeg_bytes
from converting import convert

from shardfmt import ChecksumError, DatasetNotFoundError, DatasetWriter, FormatError
from shardfmt._dataset.summary import summarise_dataset
from shardfmt._dataset.verify import verify_dataset
from shardfmt._errors import ManifestError, ShardNotFoundError
from shardfmt.format import IMAGE_CLASSIFICATION, ShardReader


@pytest.fixture
def converted(imagefolder: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    convert(imagefolder, out, workers=1, shard_size=6000)
    return out


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_sound_dataset_verifies_fully_and_quickly(converted: Path) -> None:
    full = verify_dataset(converted)
    shards = sorted(converted.glob("shard-*.shard"))
    payload_bytes = 0
    for path in shards:
        with ShardReader(path) as reader:
            payload_bytes += int(reader.table["size"].sum())
    file_bytes = sum(path.stat().st_size for path in shards)
    # Every payload is hashed once against its record checksum, then every file whole.
    assert (full.ok, full.num_records, full.num_shards, full.bytes_hashed) == (True, 24, 9, payload_bytes + file_bytes)
    quick = verify_dataset(converted / "manifest.json", quick=True)
    assert quick.ok and quick.bytes_hashed == 0


def test_a_damaged_payload_names_shard_record_and_offset(converted: Path) -> None:
    shard = converted / "shard-00001.shard"
    with ShardReader(shard) as reader:
        start = int(reader.table[2]["offset"])
    flip(shard, start + 100)
    assert verify_dataset(converted, quick=True).ok  # payload is not read
    report = verify_dataset(converted)
    assert len(report.problems) == 1
    problem = report.problems[0]
    assert isinstance(problem, ChecksumError)
    assert (problem.path, problem.offset, problem.record) == (str(shard), start, 2)
    assert str(problem).startswith(f"{shard}: byte {start}: record 2: payload")


def test_a_damaged_table_fails_even_the_quick_check(converted: Path) -> None:
    shard = converted / "shard-00000.shard"
    with ShardReader(shard) as reader:
        table = reader.table_offset
    flip(shard, table + 3)
    problem = verify_dataset(converted, quick=True).problems[0]
    assert isinstance(problem, ChecksumError) and problem.offset == table


def test_a_whole_file_checksum_that_differs_from_the_manifest_is_reported(converted: Path) -> None:
    manifest = json.loads((converted / "manifest.json").read_text())
    manifest["shards"][0]["checksum"] = "xxh3_64:" + "0" * 16
    (converted / "manifest.json").write_text(json.dumps(manifest))
    problems = verify_dataset(converted).problems
    assert len(problems) == 1 and "whole-file checksum" in str(problems[0])


def test_every_bad_shard_is_reported_and_a_missing_one_too(converted: Path) -> None:
    (converted / "shard-00000.shard").unlink()
    flip(converted / "shard-00002.shard", 70)
    problems = verify_dataset(converted).problems
    assert [type(p) for p in problems] == [ShardNotFoundError, ChecksumError]
    assert problems[1].path == str(converted / "shard-00002.shard")


def test_labels_must_name_a_class_and_the_rejects_report_must_match(tmp_path: Path) -> None:
    with DatasetWriter(tmp_path / "ds", schema=IMAGE_CLASSIFICATION) as writer:
        for label in (0, 1, 5):
            writer.write({"image": jpeg_bytes(8, 8), "label": label, "key": str(label)})
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    manifest["classes"] = ["a", "b"]  # DatasetWriter itself refuses a label that names no class
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(manifest))
    problem = verify_dataset(tmp_path / "ds", quick=True).problems[0]
    assert isinstance(problem, FormatError) and problem.record == 2 and "label 5 names no class" in str(problem)

    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    manifest["rejects"] = {"count": 2, "by_reason": {"empty": 2}, "report": "rejects.jsonl"}
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "ds" / "rejects.jsonl").write_text("{}\n")
    problems = verify_dataset(tmp_path / "ds", quick=True).problems
    assert isinstance(problems[-1], ManifestError) and "has 1 lines" in str(problems[-1])

    (tmp_path / "ds" / "rejects.jsonl").unlink()
    os.mkfifo(tmp_path / "ds" / "rejects.jsonl")  # reading it would wait for a writer forever
    problems = verify_dataset(tmp_path / "ds", quick=True).problems
    assert isinstance(problems[-1], ManifestError) and "not a regular file" in str(problems[-1])


def test_without_a_manifest_there_is_nothing_to_verify(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError):
        verify_dataset(tmp_path)


def test_summary_reads_sizes_channels_and_rejects_from_tables(awkward_tree: Path, tmp_path: Path) -> None:
    convert(awkward_tree, tmp_path / "out", workers=1)
    summary = summarise_dataset(tmp_path / "out")
    assert summary.num_records == 25 and summary.classes is not None and len(summary.classes) == 4
    assert summary.channels == {1: 1, 3: 24}
    assert summary.height is not None and summary.height[0] == 16 and summary.height[2] >= 40
    assert summary.records_per_class is not None and summary.records_per_class[0] == 0
    assert summary.rejects["hidden"] == 2
    assert summary.stats["empty_classes"] == 1


@pytest.mark.parametrize("quick", [False, True])
def test_a_corrupt_row_of_a_later_table_block_is_reported_by_its_block_checksum(tmp_path: Path, quick: bool) -> None:
    out = tmp_path / "ds"
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION) as writer:
        for i in range(2 * 1024 + 5):
            writer.write({"image": jpeg_bytes(8, 8, seed=0), "label": i % 3, "key": f"{i:05d}"})
    path = next(out.glob("shard-*.shard"))
    with ShardReader(path) as reader:  # opening reads block 0 only: block 2 is proven by the pass
        table, row = reader.table_offset, reader.dtype.itemsize
    flip(path, table + (2 * 1024 + 3) * row + 48)  # the label of record 2051, a byte of block 2
    report = verify_dataset(out, quick=quick)
    assert not report.ok and len(report.problems) == 1
    problem = report.problems[0]
    assert isinstance(problem, ChecksumError)
    assert (problem.path, problem.offset, problem.record) == (str(path), table + 2 * 1024 * row, 2 * 1024)
    assert "record table block 2" in problem.message
