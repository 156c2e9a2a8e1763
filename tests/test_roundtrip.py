"""Write -> read round trips through the public API."""

from __future__ import annotations

from pathlib import Path

from shardfmt import open_dataset


def test_dataset_reads_back_every_record(small_dataset: Path) -> None:
    with open_dataset(small_dataset) as reader:
        assert len(reader) == 40
        assert len(reader.manifest.shards) > 1
        keys = [record["key"] for record in reader]
        assert keys == [f"rec{i:03d}" for i in range(40)]
        assert [reader[i]["label"] for i in range(40)] == [i % 3 for i in range(40)]
        assert bytes(reader[7]["image"][:3]) == b"\xff\xd8\xff"
