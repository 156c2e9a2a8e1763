"""Write -> read round trips through the public API."""

from __future__ import annotations

from pathlib import Path

import pytest

import shardfmt.writer as writer_module
from shardfmt import Schema, SchemaError, ShardReader, ShardWriter, open_dataset


def test_dataset_reads_back_every_record(small_dataset: Path) -> None:
    with open_dataset(small_dataset) as reader:
        assert len(reader) == 40
        assert len(reader.manifest.shards) > 1
        keys = [record["key"] for record in reader]
        assert keys == [f"rec{i:03d}" for i in range(40)]
        assert [reader[i]["label"] for i in range(40)] == [i % 3 for i in range(40)]
        assert bytes(reader[7]["image"][:3]) == b"\xff\xd8\xff"


def test_writer_refuses_to_grow_a_shard_past_the_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "MAX_SHARD_SIZE", 1024)
    with ShardWriter(tmp_path / "a.shard", schema=Schema.of(blob="bytes")) as shard:
        shard.write({"blob": bytes(500)})
        with pytest.raises(SchemaError, match="record 1 would grow the shard to 1296 bytes, over the limit of 1024"):
            shard.write({"blob": bytes(500)})
    with ShardReader(tmp_path / "a.shard") as reader:
        assert len(reader) == 1  # the refused record left nothing behind
