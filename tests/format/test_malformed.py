"""Malformed inputs: one hand-built bad file per error class and per rule of the spec.

Each shard test starts from valid bytes, breaks exactly one rule through a numpy view of the layout
dtypes, reseals the checksums that should still hold, and asserts the exact class, `.path`,
`.offset` and `.record` of the error and that its message reads as one plain sentence.
"""

from __future__ import annotations

import functools
import json
import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import jpeg_bytes
from shardbytes import ShardBytes, build_shard

from shardfmt import (
    ChecksumError,
    DatasetNotFoundError,
    DatasetWriter,
    FormatError,
    ImageTransform,
    LimitError,
    Loader,
    ManifestError,
    SchemaError,
    ShardfmtError,
    ShardNotFoundError,
    UnsupportedVersionError,
    WorkerError,
    open_dataset,
)
from shardfmt.format import IMAGE_CLASSIFICATION, Schema, ShardReader
from shardfmt.format._layout import (
    MAX_CLASSES,
    MAX_FIELD_SIZE,
    MAX_RECORDS_PER_SHARD,
    MAX_SCHEMA_SIZE,
    MAX_SHARD_SIZE,
)

SCALARS = Schema.of(label="int64", score="float64")


def check_error(
    err: BaseException,
    cls: type[ShardfmtError],
    *,
    path: str | os.PathLike[str] | None,
    offset: int | None = None,
    record: int | None = None,
    says: str = "",
) -> None:
    """Assert `err` is exactly `cls` with this context, rendered as the style guide shows."""
    assert type(err) is cls, f"expected {cls.__name__}, got {type(err).__name__}: {err}"
    assert isinstance(err, ShardfmtError)
    expected_path = os.fspath(path) if path is not None else None
    assert (err.path, err.offset, err.record) == (expected_path, offset, record), str(err)
    prefix = [p for p in (expected_path, offset is not None and f"byte {offset}", record is not None and f"record {record}") if p]
    assert str(err) == ": ".join([*prefix, err.message])
    assert says in err.message, err.message
    # One plain line: no numpy reprs, no stray newlines, not a wall of text.
    assert "\n" not in err.message and "np." not in err.message and len(err.message) < 300, err.message


# --- manifests -------------------------------------------------------------------------------


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """A dataset of two shards holding 3 + 2 scalar records."""
    root = tmp_path / "ds"
    # A shard of n scalar records is 192 (header) + 40 n (table) + 64 (footer) bytes: close at 3.
    with DatasetWriter(root, schema=SCALARS, shard_size=376, classes=["cat", "dog"]) as writer:
        for i in range(5):
            writer.write({"label": i % 2, "score": i / 4})
    counts = [s["num_records"] for s in json.loads((root / "manifest.json").read_text())["shards"]]
    assert counts == [3, 2], counts
    return root


def rewrite_manifest(root: Path, change: Callable[[dict[str, Any]], Any]) -> Path:
    path = root / "manifest.json"
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))
    return path


def set_key(*keys: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(manifest: dict[str, Any]) -> None:
        target = manifest
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return change


def drop_key(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda manifest: manifest.pop(key)


BAD_MANIFESTS = {
    "format": (set_key("format", value="zarr"), ManifestError, "expected \"shardfmt\""),
    "version-missing": (drop_key("format_version"), ManifestError, "missing 'format_version'"),
    "version-type": (set_key("format_version", value=1.0), ManifestError, "wrong type"),
    "version-shape": (set_key("format_version", value="1"), ManifestError, "MAJOR.MINOR"),
    "version-unicode-digits": (set_key("format_version", value="\u00b2.0"), ManifestError, "MAJOR.MINOR"),
    "version-arabic-digits": (set_key("format_version", value="\u0661.\u0660"), ManifestError, "MAJOR.MINOR"),
    "version-huge": (set_key("format_version", value="1" + "0" * 5000 + ".0"), ManifestError, "MAJOR.MINOR"),
    "version-major": (set_key("format_version", value="2.0"), UnsupportedVersionError, "major version 2"),
    "shard-format": (set_key("shard_format", value="zip"), UnsupportedVersionError, "'zip'"),
    "index-in-binary": (
        set_key("shards", 0, "index", value={"path": "x.idx", "size": 1, "checksum": "xxh3_64:0123456789abcdef"}),
        ManifestError,
        '"index" is only for tar shards',
    ),
    "schema-missing": (drop_key("schema"), ManifestError, "missing 'schema'"),
    "schema-field-name": (set_key("schema", "fields", 0, "name", value="a-b"), ManifestError, "schema: field name"),
    "schema-field-type": (set_key("schema", "fields", 0, "type", value="webp"), UnsupportedVersionError, "'webp'"),
    "classes": (set_key("classes", value=["a", 1]), ManifestError, "list of strings"),
    "strict-jpeg-type": (set_key("strict_jpeg", value="yes"), ManifestError, '"strict_jpeg" must be true or false'),
    "classes-limit": (set_key("classes", value=["c"] * (MAX_CLASSES + 1)), ManifestError, "limit"),
    "shards-type": (set_key("shards", value={}), ManifestError, "'shards' has the wrong type"),
    "shard-entry": (set_key("shards", 0, value=[]), ManifestError, "shards[0] is not an object"),
    "num-records-bool": (set_key("shards", 0, "num_records", value=True), ManifestError, "wrong type"),
    "num-records-negative": (set_key("shards", 1, "num_records", value=-1), ManifestError, "shards[1]: num_records -1"),
    "num-records-limit": (set_key("shards", 0, "num_records", value=MAX_RECORDS_PER_SHARD + 1), ManifestError, "outside"),
    "size-zero": (set_key("shards", 0, "size", value=0), ManifestError, "size 0"),
    "size-limit": (set_key("shards", 0, "size", value=MAX_SHARD_SIZE + 1), ManifestError, "outside"),
    "checksum-algorithm": (set_key("shards", 0, "checksum", value="crc32:00000000"), ManifestError, "16 lower-case hex"),
    "checksum-sign": (set_key("shards", 0, "checksum", value="xxh3_64:-123456789abcdef"), ManifestError, "hex"),
    "checksum-underscore": (set_key("shards", 0, "checksum", value="xxh3_64:0000_0000_0000_0"), ManifestError, "hex"),
    "checksum-upper": (set_key("shards", 0, "checksum", value="xxh3_64:0123456789ABCDEF"), ManifestError, "hex"),
    "checksum-fullwidth": (set_key("shards", 0, "checksum", value="xxh3_64:\uff10123456789abcdef"), ManifestError, "hex"),
    "duplicate-path": (set_key("shards", 1, "path", value="shard-00000.shard"), ManifestError, "listed twice"),
    "total-records": (set_key("num_records", value=6), ManifestError, '"num_records" is 6 but the shards add up to 5'),
    "total-bytes": (set_key("num_bytes", value=1), ManifestError, '"num_bytes" is 1'),
    "total-missing": (drop_key("num_bytes"), ManifestError, "missing 'num_bytes'"),
    "size-float": (set_key("shards", 0, "size", value=376.0), ManifestError, "shards[0]: 'size' has the wrong type (float)"),
    "version-leading-zero": (set_key("format_version", value="01.1"), ManifestError, "MAJOR.MINOR"),
    "rejects-type": (set_key("rejects", value=[]), ManifestError, '"rejects" must be an object'),
    "rejects-count": (set_key("rejects", value={"count": 1.5}), ManifestError, '"rejects.count" must be an integer'),
    "rejects-by-reason": (set_key("rejects", value={"by_reason": {"empty": -1}}), ManifestError, '"rejects.by_reason" must be'),
    "rejects-report": (set_key("rejects", value={"report": 3}), ManifestError, '"rejects.report" must be a string or null'),
    "converter-type": (set_key("converter", value="shardfmt"), ManifestError, '"converter" must be an object'),
    "converter-name": (set_key("converter", "name", value=None), ManifestError, '"converter.name" must be a string'),
    "converter-options": (set_key("converter", "options", value=[]), ManifestError, '"converter.options" must be an object'),
    "stats-type": (set_key("stats", value=[]), ManifestError, '"stats" must be an object'),
    "tar-schema": (set_key("shard_format", value="tar"), ManifestError, "schema: tar shards hold image"),
    "newer-type": (
        lambda m: (m.update(format_version="1.0"), m["schema"]["fields"].append({"name": "px", "type": "raw"})),
        ManifestError,
        "which format version 1.1 added, but the version stated is 1.0",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_bad_manifest_field(dataset: Path, case: str) -> None:
    change, cls, says = BAD_MANIFESTS[case]
    path = rewrite_manifest(dataset, change)
    with pytest.raises(ShardfmtError) as info:
        open_dataset(dataset)
    check_error(info.value, cls, path=path, says=says)


@pytest.mark.parametrize(
    "shard_path",
    ["../x.shard", "/etc/passwd", "a/../../x", "./shard-00000.shard", "a//b", "a/", "", ".", "..", "C:/x", "c:x", "a\\..\\x", "x\x00"],
)
def test_manifest_shard_path_must_stay_under_the_root(dataset: Path, shard_path: str) -> None:
    path = rewrite_manifest(dataset, set_key("shards", 0, "path", value=shard_path))
    with pytest.raises(ShardfmtError) as info:
        open_dataset(dataset)
    check_error(info.value, ManifestError, path=path, says="shards[0]: path")


def test_manifest_not_json(dataset: Path) -> None:
    path = dataset / "manifest.json"
    path.write_bytes(b"{\xff")
    with pytest.raises(ShardfmtError) as info:
        open_dataset(dataset)
    check_error(info.value, ManifestError, path=path, says="not valid JSON text: not UTF-8")


def test_manifest_not_an_object(dataset: Path) -> None:
    path = dataset / "manifest.json"
    path.write_text("[]")
    with pytest.raises(ShardfmtError) as info:
        open_dataset(path)
    check_error(info.value, ManifestError, path=path, says="not a JSON object")


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(ShardfmtError) as info:
        open_dataset(tmp_path)
    check_error(info.value, DatasetNotFoundError, path=tmp_path, says="no manifest.json")
    assert isinstance(info.value, FileNotFoundError)


def test_a_broken_link_is_no_manifest_and_a_fifo_is_not_one(tmp_path: Path) -> None:
    os.symlink("gone.json", tmp_path / "manifest.json")
    with pytest.raises(ShardfmtError) as info:
        open_dataset(tmp_path)
    check_error(info.value, DatasetNotFoundError, path=tmp_path, says="no manifest.json")
    (tmp_path / "manifest.json").unlink()
    os.mkfifo(tmp_path / "manifest.json")  # opening it to read would wait for a writer forever
    with pytest.raises(ShardfmtError) as info:
        open_dataset(tmp_path)
    check_error(info.value, ManifestError, path=tmp_path / "manifest.json", says="not a regular file")


def test_shard_paths_are_one_path_up_to_case_and_unicode_normalisation(dataset: Path) -> None:
    (dataset / "caf\u00e9.shard").write_bytes(b"")

    def change(manifest: dict[str, Any]) -> None:
        manifest["shards"][0]["path"] = "caf\u00e9.shard"  # NFC
        manifest["shards"][1]["path"] = "CAFE\u0301.shard"  # NFD, upper case

    path = rewrite_manifest(dataset, change)
    with pytest.raises(ShardfmtError) as info:
        open_dataset(dataset)
    check_error(info.value, ManifestError, path=path, says="names the same file as 'café.shard'")


def test_a_shard_linked_from_inside_the_root_is_read(dataset: Path) -> None:
    (dataset / "store").mkdir()
    os.replace(dataset / "shard-00001.shard", dataset / "store" / "shard-00001.shard")
    os.symlink("store/shard-00001.shard", dataset / "shard-00001.shard")
    with open_dataset(dataset) as reader:
        assert [record["label"] for record in reader] == [0, 1, 0, 1, 0]


def test_the_writer_refuses_what_readers_refuse(tmp_path: Path) -> None:
    with DatasetWriter(tmp_path / "ds", schema=SCALARS, classes=["cat", "dog"]) as writer:
        with pytest.raises(SchemaError, match="label 2 names no class: the dataset has 2 classes"):
            writer.write({"label": 2, "score": 0.0})
        writer.write({"label": 1, "score": 0.0})
    with pytest.raises(SchemaError, match=r"outside \[-2\^63, 2\^64 - 1\]"):
        build_shard(Schema.of(meta="json"), [{"meta": [1 << 64]}])


def test_missing_shard(dataset: Path) -> None:
    (dataset / "shard-00001.shard").unlink()
    with open_dataset(dataset) as reader:
        assert reader[0]["label"] == 0  # shards open lazily: the first one is fine
        with pytest.raises(ShardfmtError) as info:
            reader[3]
    check_error(info.value, ShardNotFoundError, path=dataset / "shard-00001.shard", says="does not exist")
    assert isinstance(info.value, FileNotFoundError)


def test_manifest_count_disagrees_with_shard(dataset: Path) -> None:
    def change(manifest: dict[str, Any]) -> None:
        manifest["shards"][0]["num_records"] += 1
        manifest["num_records"] += 1

    path = rewrite_manifest(dataset, change)
    with open_dataset(dataset) as reader, pytest.raises(ShardfmtError) as info:
        reader[0]
    check_error(info.value, ManifestError, path=path, says="holds 3 records but the manifest says 4")


def test_manifest_size_disagrees_with_shard(dataset: Path) -> None:
    shard = dataset / "shard-00000.shard"
    size = shard.stat().st_size
    with open(shard, "ab") as out:
        out.write(bytes(64))
    with open_dataset(dataset) as reader, pytest.raises(ShardfmtError) as info:
        reader[0]
    check_error(info.value, FormatError, path=shard, says=f"file is {size + 64} bytes but the manifest says {size}")


def test_manifest_schema_disagrees_with_shard(dataset: Path) -> None:
    path = rewrite_manifest(dataset, set_key("schema", "fields", 1, "name", value="weight"))
    with open_dataset(dataset) as reader, pytest.raises(ShardfmtError) as info:
        reader[0]
    check_error(info.value, ManifestError, path=path, says="schema that differs")


# --- shards ----------------------------------------------------------------------------------
# Every case starts from the same valid three-record shard, breaks one rule and returns what the
# reader must report: (class, offset, record, words of the message, "open" or "read").

MIXED = Schema.of(image="jpeg", data="bytes", label="int64", key="str", meta="json")
Expect = tuple[type[ShardfmtError], "int | None", "int | None", str, str]
SHARD_CASES: dict[str, Callable[[ShardBytes], Expect]] = {}


@functools.cache
def valid_shard() -> bytes:
    records = [
        {
            "image": jpeg_bytes(8 + 8 * i, 8 + 4 * i, seed=i),
            "data": bytes(range(50 * i)),
            "label": i - 1,
            "key": f"k{i}",
            "meta": {"i": i},
        }
        for i in range(3)
    ]
    return build_shard(MIXED, records)


def shard_case(function: Callable[[ShardBytes], Expect]) -> Callable[[ShardBytes], Expect]:
    SHARD_CASES[function.__name__.removeprefix("case_").replace("_", "-")] = function
    return function


def read_everything(path: Path) -> None:
    """Open a shard and read every field of every record (verify is on)."""
    with ShardReader(path) as reader:
        for record in reader:
            for name in record:
                record[name]


# Sizes and the header.


@shard_case
def case_shorter_than_header_and_footer(s: ShardBytes) -> Expect:
    s.truncate(127)
    return FormatError, 0, None, "shorter than header and footer (128)", "open"


@shard_case
def case_bad_magic(s: ShardBytes) -> Expect:
    s.header()["magic"] = b"\x89SHARD\n\n"  # a text-mode transfer turned CR LF into LF
    return FormatError, 0, None, "not a shardfmt shard", "open"


@shard_case
def case_unknown_major(s: ShardBytes) -> Expect:
    s.header()["major"], s.header()["minor"] = 2, 0
    s.reseal_header()
    return UnsupportedVersionError, 8, None, "format version 2.0 needs a reader for major version 2", "open"


@shard_case
def case_major_zero(s: ShardBytes) -> Expect:
    s.header()["major"] = 0
    s.reseal_header()
    return UnsupportedVersionError, 8, None, "this reader knows 1.x", "open"


@shard_case
def case_unknown_flag(s: ShardBytes) -> Expect:
    s.header()["flags"] = 1 << 31
    s.reseal_header()
    return UnsupportedVersionError, 12, None, "flags 0x80000000", "open"


@shard_case
def case_alignment_not_power_of_two(s: ShardBytes) -> Expect:
    s.header()["alignment"] = 96
    s.reseal_header()
    return FormatError, 28, None, "alignment 96 is not a power of two", "open"


@shard_case
def case_alignment_too_small(s: ShardBytes) -> Expect:
    s.header()["alignment"] = 4
    s.reseal_header()
    return FormatError, 28, None, "from 8 to 65536", "open"


@shard_case
def case_alignment_too_large(s: ShardBytes) -> Expect:
    s.header()["alignment"] = 1 << 17
    s.reseal_header()
    return FormatError, 28, None, "alignment 131072", "open"


@shard_case
def case_schema_too_large(s: ShardBytes) -> Expect:
    s.header()["schema_size"] = MAX_SCHEMA_SIZE + 1
    return LimitError, 24, None, f"schema of {MAX_SCHEMA_SIZE + 1} bytes exceeds the limit of {MAX_SCHEMA_SIZE}", "open"


@shard_case
def case_header_size_not_rounded(s: ShardBytes) -> Expect:
    s.header()["header_size"] += 64
    s.reseal_header()
    return FormatError, 16, None, "header_size 320 is not 64 + schema_size 164 rounded up to 64", "open"


@shard_case
def case_header_past_end(s: ShardBytes) -> Expect:
    s.header()["schema_size"] = 60_000
    s.header()["header_size"] = 60_096
    return FormatError, 16, None, f"header of 60096 bytes runs past the end of the file ({len(s)})", "open"


@shard_case
def case_header_reserved(s: ShardBytes) -> Expect:
    s.header()["reserved"][0, 2] = 1
    s.reseal_header()
    return FormatError, 32, None, "reserved header bytes [32, 56) are not zero", "open"


@shard_case
def case_header_checksum_schema(s: ShardBytes) -> Expect:
    s.data[64 + 10] ^= 0x20  # a bit flip inside the schema text
    return ChecksumError, 56, None, "header checksum does not match", "open"


@shard_case
def case_header_checksum_minor(s: ShardBytes) -> Expect:
    s.header()["minor"] = 7  # any minor is readable, but the checksum covers it
    return ChecksumError, 56, None, "header or schema is corrupt", "open"


@shard_case
def case_header_padding(s: ShardBytes) -> Expect:
    s.data[64 + s.schema_size] = 0x20
    return FormatError, 64 + s.schema_size, None, "header padding is not zero", "open"


@shard_case
def case_schema_not_json(s: ShardBytes) -> Expect:
    s.data[64] = ord("[")
    s.reseal_header()
    return FormatError, 64, None, "schema: schema is not valid JSON text: not JSON", "open"


@shard_case
def case_schema_duplicate_field(s: ShardBytes) -> Expect:
    s.replace_schema(s.schema_bytes.replace(b'"data"', b'"meta"'))
    return FormatError, 64, None, "field name 'meta' appears twice", "open"


@shard_case
def case_unknown_field_type(s: ShardBytes) -> Expect:
    s.replace_schema(s.schema_bytes.replace(b'"bytes"', b'"tiff5"'))
    return UnsupportedVersionError, 64, None, "type 'tiff5', which this reader does not know", "open"


# The footer.


@shard_case
def case_footer_magic(s: ShardBytes) -> Expect:
    s.footer()["magic"] = b"SHARDEN\x00"
    return FormatError, len(s) - 8, None, "footer magic", "open"


@shard_case
def case_footer_checksum(s: ShardBytes) -> Expect:
    s.footer()["table_checksum"] ^= 1
    return ChecksumError, s.footer_offset + 48, None, "footer checksum does not match", "open"


@shard_case
def case_footer_reserved(s: ShardBytes) -> Expect:
    s.footer()["reserved"][0, 1] = 1
    s.reseal_footer()
    return FormatError, s.footer_offset + 20, None, "reserved footer bytes are not zero", "open"


@shard_case
def case_record_size(s: ShardBytes) -> Expect:
    s.footer()["record_size"] = 96
    s.reseal_footer()
    return FormatError, s.footer_offset + 16, None, "record_size 96 differs from the 104 bytes the schema defines", "open"


@shard_case
def case_num_records_over_limit(s: ShardBytes) -> Expect:
    s.footer()["num_records"] = MAX_RECORDS_PER_SHARD + 1
    s.reseal_footer()
    return LimitError, s.footer_offset + 8, None, f"{MAX_RECORDS_PER_SHARD + 1} records exceed the limit", "open"


@shard_case
def case_num_records_off_by_one(s: ShardBytes) -> Expect:
    table, row = s.table_offset, s.table().dtype.itemsize
    s.footer()["num_records"] = 4
    s.reseal_footer()
    message = f"table [{table}, {table + 4 * row}) of 4 records and its 1 block checksums "
    message += f"does not end where the footer starts ({s.footer_offset})"
    return FormatError, s.footer_offset, None, message, "open"


@shard_case
def case_flag_newer_than_the_header(s: ShardBytes) -> Expect:
    s.header()["minor"] = 1  # TABLE_BLOCKS came with 1.2
    s.reseal_header()
    return UnsupportedVersionError, 12, None, "header flag 0x1 came with format version 1.2, but the version stated is 1.1", "open"


@shard_case
def case_block_rows_not_1024(s: ShardBytes) -> Expect:
    s.footer()["reserved0"] = 512
    s.reseal_footer()
    return FormatError, s.footer_offset + 20, None, "footer reserved0 (rows per table block) is 512, not 1024", "open"


@shard_case
def case_block_rows_without_the_flag(s: ShardBytes) -> Expect:
    s.drop_table_blocks()
    s.footer()["reserved0"] = 1024
    s.reseal_footer()
    return FormatError, s.footer_offset + 20, None, "reserved footer bytes are not zero", "open"


@shard_case
def case_block_checksums_of_a_table_without_the_flag(s: ShardBytes) -> Expect:
    s.header()["flags"] = 0  # block checksums and reserved0 left as a 1.2 writer wrote them
    s.reseal_header()
    return FormatError, s.footer_offset + 20, None, "reserved footer bytes are not zero", "open"


@shard_case
def case_block_checksum_array(s: ShardBytes) -> Expect:
    s.block_sums()[0] ^= 1
    return ChecksumError, s.rows_end, None, "block checksums of the record table do not match", "open"


@shard_case
def case_table_offset_unaligned(s: ShardBytes) -> Expect:
    s.footer()["table_offset"] += 8
    s.reseal_footer()
    return FormatError, s.footer_offset, None, f"table offset {s.table_offset} is unaligned or outside [256, {s.footer_offset}]", "open"


@shard_case
def case_table_offset_inside_header(s: ShardBytes) -> Expect:
    s.footer()["table_offset"] = 192
    s.reseal_footer()
    return FormatError, s.footer_offset, None, f"outside [256, {s.footer_offset}]", "open"


@shard_case
def case_table_checksum(s: ShardBytes) -> Expect:
    s.drop_table_blocks()  # a 1.1 table: one checksum of the whole table, on open
    s.header()["minor"] = 1
    s.reseal_header()
    s.table()["label"][1] = 5
    s.reseal_footer()
    return ChecksumError, s.table_offset, None, "record table checksum does not match", "open"


@shard_case
def case_table_block_checksum(s: ShardBytes) -> Expect:
    s.table()["label"][1] = 5  # block 0: its checksum is compared on open
    return ChecksumError, s.table_offset, 0, "record table block 0, bytes", "open"


# The record table (its checksums resealed, so only the structural rule is broken).


@shard_case
def case_record_outside_payload(s: ShardBytes) -> Expect:
    s.table()["size"][2] = 1 << 63
    s.reseal_table()
    return FormatError, s.column_offset(2, "offset"), 2, "record span lies outside the payload region", "open"


@shard_case
def case_first_record_after_header(s: ShardBytes) -> Expect:
    s.table()["offset"][0] += 64
    s.table()["size"][0] -= 64
    s.reseal_table()
    return FormatError, s.column_offset(0, "offset"), 0, "records must be contiguous", "open"


@shard_case
def case_records_gap(s: ShardBytes) -> Expect:
    s.table()["offset"][1] += 64
    s.reseal_table()
    return FormatError, s.column_offset(1, "offset"), 1, "does not start where the previous one ends", "open"


@shard_case
def case_records_overlap(s: ShardBytes) -> Expect:
    s.table()["offset"][2] = s.table()["offset"][1]
    s.reseal_table()
    return FormatError, s.column_offset(2, "offset"), 2, "does not start where the previous one ends", "open"


@shard_case
def case_last_record_short_of_table(s: ShardBytes) -> Expect:
    s.table()["size"][2] -= 64
    s.reseal_table()
    return (
        FormatError,
        s.column_offset(2, "offset"),
        2,
        f"last record ends at {s.table_offset - 64}, not at the table ({s.table_offset})",
        "open",
    )


@shard_case
def case_record_size_unaligned(s: ShardBytes) -> Expect:
    table = s.table()
    table["size"][0] -= 8
    table["offset"][1] -= 8
    table["size"][1] += 8
    s.reseal_table()
    return FormatError, s.column_offset(0, "size"), 0, "record size is not a multiple of the alignment 64", "open"


@shard_case
def case_field_over_size_limit(s: ShardBytes) -> Expect:
    s.table()["data.size"][1] = MAX_FIELD_SIZE + 1
    s.reseal_table()
    return LimitError, s.column_offset(1, "data.size"), 1, f"larger than the limit of {MAX_FIELD_SIZE} bytes", "open"


@shard_case
def case_field_unaligned(s: ShardBytes) -> Expect:
    s.table()["data.offset"][1] += 8
    s.reseal_table()
    return FormatError, s.column_offset(1, "data.offset"), 1, "field 'data' payload is not at the next aligned offset", "open"


@shard_case
def case_field_beyond_record(s: ShardBytes) -> Expect:
    s.table()["meta.size"][0] += 64
    s.reseal_table()
    return FormatError, s.column_offset(0, "size"), 0, "record span does not end at the aligned end of its last field", "open"


@shard_case
def case_record_longer_than_its_fields(s: ShardBytes) -> Expect:
    # Record 1 takes the first 64 bytes of record 2 as trailing padding; record 2's fields move
    # along, so record 1 is the first whose span ends past the aligned end of its last field.
    table = s.table()
    table["size"][1] += 64
    for column in ("offset", "image.offset", "data.offset", "key.offset", "meta.offset"):
        table[column][2] += 64
    table["size"][2] -= 64
    s.reseal_table()
    return FormatError, s.column_offset(1, "size"), 1, "record span does not end at the aligned end", "open"


@shard_case
def case_image_zero_width(s: ShardBytes) -> Expect:
    s.table()["image.width"][1] = 0
    s.reseal_table()
    return FormatError, s.column_offset(1, "image.height"), 1, "image 'image' has a zero height or width", "open"


@shard_case
def case_image_channels(s: ShardBytes) -> Expect:
    s.table()["image.channels"][2] = 4
    s.reseal_table()
    return FormatError, s.column_offset(2, "image.channels"), 2, "channels are not 1 or 3", "open"


@shard_case
def case_image_reserved(s: ShardBytes) -> Expect:
    s.table()["image.reserved"][0] = 1
    s.reseal_table()
    return FormatError, s.column_offset(0, "image.reserved"), 0, "reserved column is not zero", "open"


# Payloads: the structure is valid, reading fails.


@shard_case
def case_record_checksum(s: ShardBytes) -> Expect:
    start = int(s.table()["data.offset"][1])
    s.data[start + 3] ^= 0x01
    span = int(s.table()["offset"][1]), int(s.table()["offset"][1] + s.table()["size"][1])
    return ChecksumError, span[0], 1, f"payload [{span[0]}, {span[1]}) does not match its checksum", "read"


@shard_case
def case_record_padding_checksum(s: ShardBytes) -> Expect:
    row = s.table()[2]
    s.data[int(row["offset"]) + int(row["size"]) - 1] = 0xFF  # the zero padding is covered too
    return ChecksumError, int(row["offset"]), 2, "the shard is corrupt", "read"


@shard_case
def case_str_not_utf8(s: ShardBytes) -> Expect:
    start = int(s.table()["key.offset"][0])
    s.data[start] = 0xFF
    s.reseal_record(0)
    return FormatError, start, 0, "field 'key' is not valid UTF-8", "read"


@shard_case
def case_json_not_json(s: ShardBytes) -> Expect:
    start = int(s.table()["meta.offset"][1])
    s.data[start] = ord("]")
    s.reseal_record(1)
    return FormatError, start, 1, "field 'meta' is not valid JSON", "read"


# Truncated and extended files.


@shard_case
def case_truncated_by_one_byte(s: ShardBytes) -> Expect:
    s.truncate(len(s) - 1)
    return FormatError, len(s) - 8, None, "file truncated or extended?", "open"


@shard_case
def case_truncated_to_half(s: ShardBytes) -> Expect:
    s.truncate(len(s) // 2)
    return FormatError, len(s) - 8, None, "footer magic", "open"


@shard_case
def case_extended_by_zeros(s: ShardBytes) -> Expect:
    s.extend(bytes(64))
    return FormatError, len(s) - 8, None, "footer magic is b'\\x00", "open"


@shard_case
def case_extended_by_a_valid_footer(s: ShardBytes) -> Expect:
    s.extend(bytes(s.data[-64:]))  # a second, valid footer: only the table placement is wrong
    return FormatError, len(s) - 64, None, "does not end where the footer starts", "open"


# The cases above, each in a file of its own.


@pytest.mark.parametrize("case", sorted(SHARD_CASES))
def test_bad_shard(tmp_path: Path, case: str) -> None:
    shard = ShardBytes(valid_shard())
    cls, offset, record, says, when = SHARD_CASES[case](shard)
    path = tmp_path / "bad.shard"
    path.write_bytes(bytes(shard))
    if when == "read":
        ShardReader(path).close()  # the structure is fine: only reading the payload fails
    with pytest.raises(ShardfmtError) as info:
        read_everything(path)
    check_error(info.value, cls, path=path, offset=offset, record=record, says=says)


def test_shard_cases_start_from_a_valid_shard(tmp_path: Path) -> None:
    path = tmp_path / "good.shard"
    path.write_bytes(valid_shard())
    read_everything(path)


# Byte sources the reader cannot map.


class SizedSource:
    """A byte source that claims a size, serves the valid shard's header, and zeros elsewhere."""

    zero_copy = False

    def __init__(self, size: int) -> None:
        self.path = "huge.shard"
        self.size = size

    def read(self, start: int, stop: int) -> memoryview:
        head = valid_shard()[:256]
        return memoryview(head[start:stop] + bytes(max(0, stop - max(start, len(head)))))

    def close(self) -> None:
        pass


def test_shard_over_size_limit_is_refused_before_reading() -> None:
    with pytest.raises(ShardfmtError) as info:
        ShardReader("huge.shard", source=SizedSource(MAX_SHARD_SIZE + 1))
    check_error(info.value, LimitError, path="huge.shard", offset=0, says=f"over the shard limit of {MAX_SHARD_SIZE}")


@pytest.mark.parametrize("num_records", [MAX_RECORDS_PER_SHARD + 1, (1 << 64) - 1, MAX_RECORDS_PER_SHARD])
def test_huge_record_count_allocates_nothing(tmp_path: Path, num_records: int) -> None:
    shard = ShardBytes(valid_shard())
    shard.footer()["num_records"] = num_records
    shard.reseal_footer()
    path = tmp_path / "bad.shard"
    path.write_bytes(bytes(shard))
    tracemalloc.start()
    try:
        with pytest.raises(ShardfmtError) as info:
            ShardReader(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Within the limit the count is still refused, by the table placement rule, before any read.
    expected = LimitError if num_records > MAX_RECORDS_PER_SHARD else FormatError
    check_error(info.value, expected, path=path, offset=shard.footer_offset + (8 if expected is LimitError else 0))
    assert peak < 256 * 1024, f"peak {peak} bytes"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_fifo_in_place_of_a_shard_is_refused_at_once(tmp_path: Path, num_workers: int) -> None:
    """Opening a FIFO to read would wait for a writer forever: the loader's read-ahead and the
    shard's open both refuse it as not a regular file, in the process or in a worker."""
    out = tmp_path / "ds"
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION) as writer:
        for i in range(4):
            writer.write({"image": jpeg_bytes(20, 24, seed=i), "label": i % 2, "key": f"k{i}"})
    (shard,) = sorted(out.glob("*.shard"))
    shard.unlink()
    os.mkfifo(shard)
    with pytest.raises(ShardfmtError) as info:
        with Loader(out, batch_size=2, num_workers=num_workers, transform=ImageTransform(size=8)) as loader:
            next(iter(loader))
    assert isinstance(info.value, ShardNotFoundError if num_workers == 0 else WorkerError)
    assert "is not a regular file, so it cannot be a shard" in str(info.value)


def test_directory_is_not_a_shard(tmp_path: Path) -> None:
    with pytest.raises(ShardfmtError) as info:
        ShardReader(tmp_path)
    check_error(info.value, ShardNotFoundError, path=tmp_path, says="not a regular file")


def test_empty_shard_with_payload_bytes(tmp_path: Path) -> None:
    shard = ShardBytes(build_shard(MIXED, []))
    header_size = int(shard.header()[0]["header_size"])
    shard.data[header_size:header_size] = bytes(64)  # 64 bytes between header and (empty) table
    shard.footer()["table_offset"] = header_size + 64
    shard.reseal_table()
    path = tmp_path / "bad.shard"
    path.write_bytes(bytes(shard))
    with pytest.raises(ShardfmtError) as info:
        ShardReader(path)
    check_error(info.value, FormatError, path=path, offset=header_size, says="no records, yet 64 payload bytes")


# --- the field types of version 1.1: raw pixels and fixed-shape arrays ---------------------------
# The same scheme over a shard of raw and ndarray fields: each case breaks one rule of 1.1.

FIELDS = Schema.of(pixels="raw", mask="raw", box="ndarray:float32:2x3", key="str")
FIELD_CASES: dict[str, Callable[[ShardBytes], Expect]] = {}


@functools.cache
def valid_fields_shard() -> bytes:
    import numpy as np

    records = [
        {
            "pixels": np.full((4 + i, 6, 3), i, np.uint8),
            "mask": np.full((4 + i, 6), 1, np.uint8),
            "box": np.arange(6, dtype=np.float32).reshape(2, 3) * i,
            "key": f"k{i}",
        }
        for i in range(3)
    ]
    return build_shard(FIELDS, records)


def field_case(function: Callable[[ShardBytes], Expect]) -> Callable[[ShardBytes], Expect]:
    FIELD_CASES[function.__name__.removeprefix("case_").replace("_", "-")] = function
    return function


@field_case
def case_raw_payload_shorter_than_its_pixels(s: ShardBytes) -> Expect:
    s.table()["pixels.height"][1] += 1  # 6 x 6 x 3 declared, 5 x 6 x 3 stored
    s.reseal_table()
    return FormatError, s.column_offset(1, "pixels.size"), 1, "payload size is not height x width x channels", "open"


@field_case
def case_raw_payload_longer_than_its_pixels(s: ShardBytes) -> Expect:
    s.table()["mask.width"][2] = 5
    s.reseal_table()
    return FormatError, s.column_offset(2, "mask.size"), 2, "raw image 'mask' payload size", "open"


@field_case
def case_raw_pixel_count_wraps_around(s: ShardBytes) -> Expect:
    # 2^31 x 2^31 pixels of 4 channels is 2^64 bytes: 0 modulo 2^64; it must not pass as 0.
    table = s.table()
    table["pixels.height"][0] = table["pixels.width"][0] = 1 << 31
    table["pixels.channels"][0] = 4
    s.reseal_table()
    return FormatError, s.column_offset(0, "pixels.size"), 0, "payload size is not height x width x channels", "open"


@pytest.mark.parametrize("channels", [0, 2, 5, 1 << 31])
def test_raw_channels_other_than_1_3_4(tmp_path: Path, channels: int) -> None:
    shard = ShardBytes(valid_fields_shard())
    shard.table()["mask.channels"][1] = channels
    shard.reseal_table()
    path = tmp_path / "bad.shard"
    path.write_bytes(bytes(shard))
    with pytest.raises(ShardfmtError) as info:
        ShardReader(path)
    check_error(
        info.value, FormatError, path=path, offset=shard.column_offset(1, "mask.channels"), record=1, says="channels are not 1 or 3 or 4"
    )


@field_case
def case_raw_zero_height(s: ShardBytes) -> Expect:
    s.table()["pixels.height"][2] = 0
    s.reseal_table()
    return FormatError, s.column_offset(2, "pixels.height"), 2, "image 'pixels' has a zero height or width", "open"


@field_case
def case_raw_reserved(s: ShardBytes) -> Expect:
    s.table()["mask.reserved"][0] = 1
    s.reseal_table()
    return FormatError, s.column_offset(0, "mask.reserved"), 0, "reserved column is not zero", "open"


@field_case
def case_ndarray_payload_size(s: ShardBytes) -> Expect:
    s.replace_schema(s.schema_bytes.replace(b'"shape":[2,3]', b'"shape":[3,3]'))
    return FormatError, s.column_offset(0, "box.size"), 0, "payload size is not the 36 bytes of its float32 shape [3, 3]", "open"


def schema_case(old: bytes, new: bytes, cls: type[ShardfmtError], says: str) -> Callable[[ShardBytes], Expect]:
    def case(s: ShardBytes) -> Expect:
        assert old in s.schema_bytes
        s.replace_schema(s.schema_bytes.replace(old, new))
        return cls, 64, None, says, "open"

    return case


for _name, _old, _new, _cls, _says in [
    ("ndarray-unknown-dtype", b'"float32"', b'"bfloat16"', UnsupportedVersionError, "dtype 'bfloat16', which this reader does not know"),
    ("ndarray-big-endian-dtype", b'"float32"', b'">f4"', UnsupportedVersionError, "dtype '>f4'"),
    ("ndarray-dtype-not-a-string", b'"float32"', b"32", FormatError, 'needs a string "dtype"'),
    ("ndarray-no-dtype", b'"dtype":"float32",', b"", FormatError, 'needs a string "dtype"'),
    ("ndarray-no-shape", b',"shape":[2,3]', b"", FormatError, 'needs a "shape" of 1 to 8 sizes'),
    ("ndarray-empty-shape", b'"shape":[2,3]', b'"shape":[]', FormatError, 'needs a "shape" of 1 to 8 sizes'),
    ("ndarray-nine-dimensions", b'"shape":[2,3]', b'"shape":[1,1,1,1,1,1,1,2,3]', FormatError, "1 to 8 sizes"),
    ("ndarray-zero-size", b'"shape":[2,3]', b'"shape":[2,0]', FormatError, "sizes are not all integers from 1"),
    ("ndarray-negative-size", b'"shape":[2,3]', b'"shape":[-2,3]', FormatError, "sizes are not all integers from 1"),
    ("ndarray-float-size", b'"shape":[2,3]', b'"shape":[2.0,3]', FormatError, "sizes are not all integers"),
    ("ndarray-boolean-size", b'"shape":[2,3]', b'"shape":[true,3]', FormatError, "sizes are not all integers"),
    ("ndarray-shape-not-a-list", b'"shape":[2,3]', b'"shape":"2x3"', FormatError, 'needs a "shape"'),
    ("ndarray-over-field-limit", b'"shape":[2,3]', b'"shape":[1073741824,2]', FormatError, "over the field limit of 1073741824"),
    ("ndarray-huge-size", b'"shape":[2,3]', b'"shape":[' + b"9" * 400 + b",3]", FormatError, "is outside [-2^63, 2^64 - 1]"),
]:
    FIELD_CASES[_name] = schema_case(_old, _new, _cls, _says)


@field_case
def case_raw_type_unknown_to_a_1_0_reader(s: ShardBytes) -> Expect:
    # What a 1.0 reader meets: the same check, for a type name it does not know.
    s.replace_schema(s.schema_bytes.replace(b'"raw"', b'"raw2"', 1))
    return UnsupportedVersionError, 64, None, "type 'raw2', which this reader does not know", "open"


@pytest.mark.parametrize("case", sorted(FIELD_CASES))
def test_bad_field_shard(tmp_path: Path, case: str) -> None:
    shard = ShardBytes(valid_fields_shard())
    cls, offset, record, says, when = FIELD_CASES[case](shard)
    path = tmp_path / "bad.shard"
    path.write_bytes(bytes(shard))
    with pytest.raises(ShardfmtError) as info:
        read_everything(path)
    check_error(info.value, cls, path=path, offset=offset, record=record, says=says)


def test_field_cases_start_from_a_valid_shard(tmp_path: Path) -> None:
    path = tmp_path / "good.shard"
    path.write_bytes(valid_fields_shard())
    read_everything(path)


def test_a_1_0_reader_refuses_the_new_types_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that knows only the six 1.0 types (as shardfmt 0.1 does) refuses raw by name."""
    from shardfmt.format import _schema as schema

    path = tmp_path / "fields.shard"
    path.write_bytes(valid_fields_shard())
    monkeypatch.setattr(schema, "FIELD_TYPES", {k: v for k, v in schema.FIELD_TYPES.items() if k not in ("raw", "ndarray")})
    with pytest.raises(ShardfmtError) as info:
        ShardReader(path)
    check_error(
        info.value, UnsupportedVersionError, path=path, offset=64, says="field 'pixels' has type 'raw', which this reader does not know"
    )
