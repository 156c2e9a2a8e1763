"""Every member a tar shard delivers is checked under `verify`: the image against its checksum,
each member field (captions, JSON, bytes) against the XXH3-64 its span in the member index
carries; an index written before member checksums is still read, its members unchecked."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from conftest import jpeg_bytes

from shardfmt import ChecksumError, DatasetWriter, LimitError, Loader, SchemaError, open_dataset
from shardfmt._checksum import checksum
from shardfmt._dataset.tars import index_tars
from shardfmt.format import ShardWriter
from shardfmt.format._schema import tar_schema
from shardfmt.tar._index import INDEX_SCHEMA, index_tar
from shardfmt.tar._reader import TarShardReader

SCHEMA = tar_schema(labelled=False, members=(("json", "json"), ("txt", "str")))


def write_captions(root: Path, count: int = 3) -> list[dict[str, Any]]:
    records = [
        {"image": jpeg_bytes(8, 8, seed=i), "key": f"{i:09d}", "json": {"i": i}, "txt": f"caption {i:09d}"} for i in range(count)
    ]
    with DatasetWriter(root, schema=SCHEMA, shard_format="tar", shard_size=1 << 30) as writer:
        for record in records:
            writer.write(record)
    return records


def flip_bit(path: Path, offset: int, bit: int = 3) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def member_span(root: Path, record: int, extension: str) -> list[int]:
    with TarShardReader(root / "shard-00000.tar", verify=False, schema=SCHEMA) as reader:
        return list(reader.index.record(record)["members"][extension])


def test_the_writer_and_the_indexer_give_every_member_its_checksum(tmp_path: Path) -> None:
    write_captions(tmp_path / "d", 2)
    tar = (tmp_path / "d" / "shard-00000.tar").read_bytes()
    start, size, digest = member_span(tmp_path / "d", 1, "txt")
    assert tar[start : start + size] == b"caption 000000001" and digest == checksum(b"caption 000000001")
    written = (tmp_path / "d" / "shard-00000.tar.idx").read_bytes()
    index_tar(tmp_path / "d" / "shard-00000.tar", index=tmp_path / "again.idx")
    assert (tmp_path / "again.idx").read_bytes() == written


@pytest.mark.parametrize(("extension", "field"), [("txt", "txt"), ("json", "json")])
def test_a_flipped_bit_in_a_member_field_is_a_checksum_error_naming_it(tmp_path: Path, extension: str, field: str) -> None:
    write_captions(tmp_path / "d")
    start, size, _ = member_span(tmp_path / "d", 1, extension)
    flip_bit(tmp_path / "d" / "shard-00000.tar", start + size - 2)
    with open_dataset(tmp_path / "d") as dataset:
        assert dataset[0][field] == ({"i": 0} if field == "json" else "caption 000000000")
        with pytest.raises(ChecksumError) as info:
            dataset[1][field]
    err = info.value
    assert err.message == (
        f"member field {field!r} of sample '000000001' [{start}, {start + size}) does not match its checksum: the tar is corrupt"
    )
    assert (err.path, err.offset, err.record) == (str(tmp_path / "d" / "shard-00000.tar"), start, 1)
    with open_dataset(tmp_path / "d", verify=False) as dataset:  # unverified, the damage reads through
        assert dataset[1]["txt"] == ("caption 000000001" if field == "json" else "caption 000000081")


def test_verify_record_and_members_check_every_member(tmp_path: Path) -> None:
    write_captions(tmp_path / "d")
    start, size, _ = member_span(tmp_path / "d", 2, "json")
    flip_bit(tmp_path / "d" / "shard-00000.tar", start)
    with TarShardReader(tmp_path / "d" / "shard-00000.tar", schema=SCHEMA) as reader:
        reader.verify_record(1)
        with pytest.raises(ChecksumError, match=r"^.*record 2: member field 'json' of sample '000000002'") as info:
            reader.verify_record(2)
        assert info.value.offset == start
        with pytest.raises(ChecksumError) as info:
            reader.members(2)
        assert info.value.message == (
            f"member 'json' of sample '000000002' [{start}, {start + size}) does not match its checksum: the tar is corrupt"
        )


def test_the_loader_with_verify_always_refuses_a_damaged_caption(tmp_path: Path) -> None:
    write_captions(tmp_path / "d", 4)
    start, _, _ = member_span(tmp_path / "d", 3, "txt")
    flip_bit(tmp_path / "d" / "shard-00000.tar", start + 9)  # "caption 0..." -> "caption 8..."
    loader = Loader(tmp_path / "d", batch_size=4, fields=["image", "txt"], shuffle=False, num_workers=0, verify="always")
    with loader, pytest.raises(ChecksumError, match="member field 'txt' of sample '000000003'"):
        next(iter(loader))


def test_tars_from_elsewhere_are_indexed_with_member_checksums(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    tar = tmp_path / "t" / "a.tar"
    with tarfile.open(tar, "w", format=tarfile.GNU_FORMAT) as archive:  # as GNU tar writes them, mtimes and all
        for i in range(2):
            for name, data in ((f"k{i}.jpg", jpeg_bytes(8, 8, seed=i)), (f"k{i}.txt", f"text {i}".encode())):
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), 1700000000
                archive.addfile(info, io.BytesIO(data))
    index_tars([tmp_path / "t"])
    with TarShardReader(tar, schema=tar_schema(labelled=False, members=(("txt", "str"),))) as reader:
        start, size, _ = reader.index.record(0)["members"]["txt"]
    flip_bit(tar, start)
    with open_dataset(tmp_path / "t") as dataset:
        assert dataset[1]["txt"] == "text 1"
        with pytest.raises(ChecksumError, match=r"member field 'txt' of sample 'k0' \[\d+, \d+\)"):
            dataset[0]["txt"]


def test_an_index_without_member_checksums_is_read_with_its_members_unchecked(tmp_path: Path) -> None:
    write_captions(tmp_path / "d")
    index_path = tmp_path / "d" / "shard-00000.tar.idx"
    with TarShardReader(tmp_path / "d" / "shard-00000.tar", verify=False, schema=SCHEMA) as reader:
        rows = [dict(reader.index.record(i)) for i in range(3)]
    rows = [{**row, "key": bytes(row["key"]), "members": {e: s[:2] for e, s in row["members"].items()}} for row in rows]
    index_path.unlink()
    with ShardWriter(index_path, schema=INDEX_SCHEMA) as writer:
        for row in rows:
            writer.write(row)
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    manifest["shards"][0]["index"].update(size=index_path.stat().st_size, checksum=f"xxh3_64:{checksum(index_path.read_bytes()):016x}")
    (tmp_path / "d" / "manifest.json").write_text(json.dumps(manifest))
    start = rows[1]["members"]["txt"][0]
    flip_bit(tmp_path / "d" / "shard-00000.tar", start + 9)
    with open_dataset(tmp_path / "d") as dataset:
        assert [r["txt"] for r in dataset] == ["caption 000000000", "caption 080000001", "caption 000000002"]


def test_members_over_the_member_limit_are_refused_before_they_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardfmt.tar._index as index_module
    import shardfmt.tar._reader as reader_module
    import shardfmt.tar._writer as writer_module

    write_captions(tmp_path / "d")  # captions of 17 bytes; the limit made 16 to test it small
    for module in (index_module, reader_module, writer_module):
        monkeypatch.setattr(module, "MAX_MEMBER_SIZE", 16)
    with pytest.raises(LimitError) as info:
        open_dataset(tmp_path / "d")[0]
    index = str(tmp_path / "d" / "shard-00000.tar.idx")
    assert info.value.message == "member field 'txt' is 17 bytes, over the member limit of 16"
    assert (info.value.path, info.value.record) == (index, 0)
    tar = tmp_path / "d" / "shard-00000.tar"
    found = index_tar(tar, index=tmp_path / "again.idx")
    assert found.tar.num_records == 0
    assert [(r.key, r.reason, r.detail) for r in found.rejects] == [
        (f"{i:09d}", "too-large", "the member .txt is 17 bytes, over the member limit of 16") for i in range(3)
    ]
    with pytest.raises(SchemaError, match=r"record 0 \(key 'k'\): member 'txt' is 17 bytes, over the member limit of 16"):
        with DatasetWriter(tmp_path / "w", schema=SCHEMA, shard_format="tar") as writer:
            writer.write({"image": jpeg_bytes(8, 8), "key": "k", "json": None, "txt": "caption 000000000"})


def test_a_conversion_rejects_a_member_over_the_limit_without_reading_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from converting import convert

    import shardfmt._convert.records as records_module

    tar = tmp_path / "src" / "a.tar"
    tar.parent.mkdir()
    with tarfile.open(tar, "w") as archive:
        for i, caption in enumerate([b"short", b"a caption of 30 bytes, too big"]):
            for name, data in ((f"k{i}.jpg", jpeg_bytes(8, 8, seed=i)), (f"k{i}.txt", caption)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    monkeypatch.setattr(records_module, "MAX_MEMBER_SIZE", 16)
    result = convert(tar, tmp_path / "out", workers=1)
    assert result.num_records == 1
    rejects = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["key"], r["reason"], r["detail"]) for r in rejects] == [
        ("k1", "too-large", "member 'txt' is 30 bytes, over the member limit of 16")
    ]
