"""Golden vectors: tools/make_vectors.py reproduces spec/vectors/ byte for byte, and every vector
of every version reads back exactly as its JSON says (valid) or fails exactly as it says (invalid
shards and datasets); the writer reproduces every valid shard from its JSON, and the loader's
order and crop rules reproduce the sampling vectors."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import make_vectors
import numpy as np
import pytest
import torch
from shardbytes import ShardBytes, build_shard

import shardfmt
from shardfmt import ShardfmtError, open_dataset
from shardfmt._checksum import checksum, format_checksum
from shardfmt._dataset.verify import verify_dataset
from shardfmt._sampling.keys import AUGMENT_STREAM, check_split, record_keys, sample_batches, uniforms
from shardfmt._sampling.mixture import MixtureOrder, allocate
from shardfmt._sampling.orders import epoch_order
from shardfmt._sampling.ranks import RankPlan
from shardfmt.format import Schema, ShardReader
from shardfmt.format._fieldtypes import FIELD_TYPES
from shardfmt.format._layout import (
    FOOTER_DTYPE,
    FOOTER_SIZE,
    HEADER_DTYPE,
    NDARRAY_DTYPES,
    column_name,
)
from shardfmt.ops import CenterCrop
from shardfmt.ops._crop import pipeline_from_config, scale_plan, snap_to_scale

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "spec" / "vectors"
VALID = sorted(VECTORS.glob("v*/valid/*.shard"))
INVALID = sorted(VECTORS.glob("v*/invalid/*.shard"))
DATASETS = sorted(VECTORS.glob("v*/dataset"))
INVALID_DATASETS = sorted(VECTORS.glob("v*/invalid-datasets/*.json"))
TAR_DATASETS = sorted(VECTORS.glob("v*/tar-datasets/*.json"))


def vector_id(path: Path) -> str:
    return f"{path.parts[-3]}/{path.stem}"


def test_generator_reproduces_the_committed_vectors(tmp_path: Path) -> None:
    fresh = tmp_path / make_vectors.VERSION
    make_vectors.generate(fresh)
    assert make_vectors.compare(make_vectors.DEFAULT_OUT, fresh) == []


def test_every_version_has_vectors() -> None:
    current = VECTORS / make_vectors.VERSION
    assert current.is_dir(), "run tools/make_vectors.py"
    assert [p.name for p in sorted(VECTORS.glob("v*"))] == ["v1.0", "v1.1", "v1.2"]
    for version in sorted(VECTORS.glob("v*")):
        index = json.loads((version / "index.json").read_text())
        assert index["format_version"] == version.name[1:]
        assert sorted(index["valid"]) == sorted(p.stem for p in version.glob("valid/*.shard"))
        assert sorted(index["invalid"]) == sorted(p.stem for p in version.glob("invalid/*.shard"))
        # 1.1's tar datasets are 10 KiB a tar at least (a tar is padded to 10,240 bytes), and its
        # sampling and pixel vectors list every value a reader must reproduce
        assert sum(p.stat().st_size for p in version.rglob("*") if p.is_file()) < 1024 * 1024


RELEASED = {"v1.0": "xxh3_64:084edbc861925c74", "v1.1": "xxh3_64:a3e6e0b0da058595"}
"""XXH3-64 over the sorted relative paths and bytes of each earlier version's vectors (1.1's as
they stood when 1.2 began): they are never regenerated or edited, only read by every later reader."""


@pytest.mark.parametrize("version", sorted(RELEASED))
def test_released_vectors_are_unchanged(version: str) -> None:
    files = sorted(p for p in (VECTORS / version).rglob("*") if p.is_file())
    listing = b"".join(str(p.relative_to(VECTORS / version)).encode() + b"\0" + p.read_bytes() for p in files)
    assert format_checksum(checksum(listing)) == RELEASED[version]


FIRST_1_1_DRAFT = {
    "valid": ["align8", "all-types", "empty", "grayscale", "ndarray", "pairs", "raw", "scalars", "several", "tiny"],
    "invalid": [
        "bad-magic", "field-unaligned", "footer-checksum", "header-checksum", "ndarray-bad-shape", "ndarray-size-mismatch",
        "ndarray-unknown-dtype", "raw-channels", "raw-size-mismatch", "raw-zero-width", "record-checksum", "record-gap",
        "schema-too-large", "table-checksum", "too-many-records", "truncated", "unknown-field-type", "unknown-flag", "unknown-major",
    ],
}
"""The vectors of the first 1.1 draft. Later ones were added beside them; these keep their bytes
(XXH3-64 of their sorted paths and bytes, as for a released version)."""


def test_first_1_1_draft_vectors_are_unchanged() -> None:
    root = VECTORS / "v1.1"
    names = ["dataset.json", "dataset/manifest.json", "dataset/shard-00000.shard", "dataset/shard-00001.shard", "valid/tiny.txt"]
    names += [f"{kind}/{name}.{suffix}" for kind, listed in FIRST_1_1_DRAFT.items() for name in listed for suffix in ("json", "shard")]
    listing = b"".join(name.encode() + b"\0" + (root / name).read_bytes() for name in sorted(names))
    assert format_checksum(checksum(listing)) == "xxh3_64:5d380290d30c16bc"


def test_every_field_type_has_a_valid_vector() -> None:
    current = VECTORS / make_vectors.VERSION
    types = {field.type for path in current.glob("valid/*.shard") for field in ShardReader(path).schema.fields}
    assert types == set(FIELD_TYPES)
    dtypes = {field.dtype for path in current.glob("valid/*.shard") for field in ShardReader(path).schema.fields}
    assert set(NDARRAY_DTYPES) <= dtypes


def expect_u64(value: Any, text: str) -> None:
    """A checksum or float64 column: JSON holds the u64 value as 0x and 16 hex digits."""
    bits = struct.unpack("<Q", struct.pack("<d", float(value)))[0] if isinstance(value, np.floating) else int(value)
    assert f"0x{bits:016x}" == text


@pytest.mark.parametrize("path", VALID, ids=vector_id)
def test_valid_vector_reads_back(path: Path) -> None:
    expected = json.loads(path.with_suffix(".json").read_text())
    data = path.read_bytes()
    assert len(data) == expected["size"]
    assert format_checksum(checksum(data)) == expected["file_checksum"]

    # The layout dtypes decode header and footer as the vector says.
    header = np.frombuffer(data, HEADER_DTYPE, count=1)[0]
    footer = np.frombuffer(data, FOOTER_DTYPE, count=1, offset=len(data) - FOOTER_SIZE)[0]
    for struct_value, values in ((header, expected["header"]), (footer, expected["footer"])):
        for name, value in values.items():
            if name == "magic":
                assert bytes(struct_value[name]).hex() == value
            elif name.endswith("checksum"):
                expect_u64(struct_value[name], value)
            else:
                assert np.array(struct_value[name]).tolist() == value, name

    with ShardReader(path) as reader:
        assert reader.version == (expected["header"]["major"], expected["header"]["minor"])
        assert reader.alignment == expected["header"]["alignment"]
        assert reader.header_size == expected["header"]["header_size"]
        assert reader.table_offset == expected["footer"]["table_offset"]
        assert reader.schema == shardfmt.format.Schema.from_bytes(expected["schema"].encode())
        assert len(reader) == expected["footer"]["num_records"] == len(expected["records"])
        for index, record in enumerate(expected["records"]):
            row = reader.table[index]
            assert list(reader.table.dtype.names) == list(record["row"]), "table columns in spec order"
            for name, value in record["row"].items():
                if isinstance(value, str):
                    expect_u64(row[name], value)
                else:
                    assert int(row[name]) == value, name
            reader.verify_record(index)
            actual = reader.record(index)
            for field in reader.schema.fields:
                check_value(field.type, actual[field.name], record["values"][field.name])


def check_value(field_type: str, actual: Any, expected: Any) -> None:
    if field_type in ("jpeg", "bytes"):
        assert bytes(actual).hex() == expected
    elif field_type == "raw":
        assert actual.dtype == np.uint8 and actual.ndim == 3 and not actual.flags.writeable
        assert actual.tobytes().hex() == expected
    elif field_type == "ndarray":
        special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
        numbers = np.vectorize(lambda x: special.get(x, x) if isinstance(x, str) else x, otypes=[object])(np.array(expected, dtype=object))
        wanted = numbers.astype(actual.dtype)
        assert actual.shape == wanted.shape and not actual.flags.writeable
        assert np.array_equal(actual, wanted, equal_nan=actual.dtype.kind == "f")
        assert np.array_equal(np.signbit(actual), np.signbit(wanted)) if actual.dtype.kind == "f" else True
    elif field_type == "float64":
        special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
        number = special.get(expected, expected) if isinstance(expected, str) else expected
        assert struct.pack("<d", actual) == struct.pack("<d", number) or (math.isnan(actual) and math.isnan(number))
    else:
        assert actual == expected and type(actual) is type(expected)


class LongerFile:
    """A vector's bytes followed by zeros up to a stated size, as a byte source (the size of a
    sparse file, without making one)."""

    zero_copy = False

    def __init__(self, path: Path, size: int) -> None:
        self.path, self.size, self._data = str(path), size, path.read_bytes()

    def read(self, start: int, stop: int) -> memoryview:
        data = self._data[start:stop]
        return memoryview(data + bytes(min(stop, self.size) - start - len(data)))

    def close(self) -> None:
        pass


@pytest.mark.parametrize("path", INVALID, ids=vector_id)
def test_invalid_vector_fails_as_stated(path: Path) -> None:
    expected = json.loads(path.with_suffix(".json").read_text())
    source = LongerFile(path, expected["size"]) if "size" in expected else None
    with pytest.raises(ShardfmtError) as info:
        reader = ShardReader(path, source=source)
        assert expected["when"] == "read", "the vector should have failed on open"
        with reader:
            for index in range(len(reader)):
                dict(reader.record(index))
    err = info.value
    assert type(err).__name__ == expected["error"]
    assert type(err) is getattr(shardfmt, expected["error"])
    assert (err.offset, err.record) == (expected["offset"], expected["record"]), str(err)
    assert err.path == str(path)


@pytest.mark.parametrize("directory", DATASETS, ids=lambda p: p.parts[-2])
def test_dataset_vector_reads_back(directory: Path) -> None:
    expected = json.loads((directory.parent / "dataset.json").read_text())
    with open_dataset(directory) as reader:
        assert len(reader) == expected["num_records"]
        assert reader.classes == expected["classes"]
        for record, values in zip(reader, expected["records"], strict=True):
            assert bytes(record["image"]).hex() == values["image"]
            assert (record["label"], record["key"]) == (values["label"], values["key"])
        for entry in reader.manifest.shards:
            data = (directory / entry.path).read_bytes()
            assert (len(data), checksum(data)) == (entry.size, entry.checksum)


@pytest.mark.parametrize("expected_path", INVALID_DATASETS, ids=lambda p: f"{p.parts[-3]}/{p.stem}")
def test_invalid_dataset_vector_fails_as_stated(expected_path: Path) -> None:
    expected = json.loads(expected_path.read_text())
    directory = expected_path.with_suffix("")
    if expected["when"] == "verify":
        with open_dataset(directory) as reader:  # every check but the optional file checksum passes
            assert len(list(reader)) == reader.manifest.num_records
        problems = verify_dataset(directory).problems
        assert len(problems) == 1
        err = problems[0]
    else:
        with pytest.raises(ShardfmtError) as info:
            reader = open_dataset(directory)
            assert expected["when"] == "read", "the dataset should have failed on open"
            with reader:
                for record in reader:
                    dict(record)
        err = info.value
    assert type(err) is getattr(shardfmt, expected["error"]), str(err)
    assert err.message == expected["message"]
    assert err.path == os.path.normpath(directory / expected["path"])
    assert (err.offset, err.record) == (expected["offset"], expected["record"]), str(err)


def _tar_value(field: str, value: Any) -> Any:
    return bytes(value).hex() if isinstance(value, memoryview) else value


@pytest.mark.parametrize("expected_path", TAR_DATASETS, ids=lambda p: f"{p.parts[-3]}/{p.stem}")
def test_tar_dataset_vector_reads_or_fails_as_stated(expected_path: Path) -> None:
    expected = json.loads(expected_path.read_text())
    directory = expected_path.with_suffix("")
    if expected.get("valid"):
        with open_dataset(directory) as reader:
            assert reader.manifest.schema == Schema.from_json(expected["schema"]) and reader.manifest.classes == expected["classes"]
            assert [{name: _tar_value(name, value) for name, value in record.items()} for record in reader] == expected["records"]
            index = reader.shard(0).index  # type: ignore[attr-defined]
            rows = [dict(index.record(i)) for i in range(len(index))]
        assert [
            {**row, "key": bytes(row["key"]).hex(), "image_checksum": f"0x{row['image_checksum'] % (1 << 64):016x}"} for row in rows
        ] == expected["index"]
        return
    with pytest.raises(ShardfmtError) as info:
        with open_dataset(directory) as reader:
            for record in reader:
                dict(record)
    err = info.value
    assert type(err) is getattr(shardfmt, expected["error"]), str(err)
    assert err.message == expected["message"]
    assert err.path == os.path.normpath(directory / expected["path"])
    assert (err.offset, err.record) == (expected["offset"], expected["record"]), str(err)


def test_every_tar_reading_check_has_an_invalid_vector() -> None:
    checks = {json.loads(path.read_text()).get("check") for path in TAR_DATASETS}
    assert set(range(1, 10)) | {"schema", "checksum", "member-checksum"} <= checks


def test_every_manifest_step_has_an_invalid_dataset() -> None:
    steps = {json.loads(path.read_text())["step"] for path in INVALID_DATASETS}
    assert steps == set(range(1, 14))


def record_values(schema: Schema, vector: dict[str, Any]) -> list[dict[str, Any]]:
    """The records a writer is given to write a valid vector, from its JSON alone."""
    special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
    records = []
    for record in vector["records"]:
        values: dict[str, Any] = {}
        for field in schema.fields:
            value = record["values"][field.name]
            if field.type in ("jpeg", "bytes"):
                values[field.name] = bytes.fromhex(value)
            elif field.type == "raw":
                shape = [record["row"][column_name(field.name, c)] for c in ("height", "width", "channels")]
                values[field.name] = np.frombuffer(bytes.fromhex(value), np.uint8).reshape(shape)
            elif field.type == "ndarray":
                numbers = [special.get(x, x) if isinstance(x, str) else x for x in np.array(value, dtype=object).ravel()]
                values[field.name] = np.array(numbers, dtype=NDARRAY_DTYPES[field.dtype or ""]).reshape(field.shape or ())
            elif field.type == "float64":  # the exact bits, NaN payloads included
                values[field.name] = struct.unpack("<d", int(record["row"][field.name], 16).to_bytes(8, "little"))[0]
            else:
                values[field.name] = value
        records.append(values)
    return records


@pytest.mark.parametrize("path", VALID, ids=vector_id)
def test_valid_vector_is_canonical_writer_output(path: Path) -> None:
    vector = json.loads(path.with_suffix(".json").read_text())
    schema = Schema.from_bytes(vector["schema"].encode())
    data = build_shard(schema, record_values(schema, vector), alignment=vector["header"]["alignment"])
    if vector["header"]["minor"] != shardfmt.format.FORMAT_VERSION[1]:
        # a 1.0 or 1.1 vector: the same bytes but the version and the block checksums of 1.2
        shard = ShardBytes(data)
        shard.drop_table_blocks()
        shard.header()["minor"] = vector["header"]["minor"]
        shard.reseal_header()
        data = bytes(shard)
    assert data == path.read_bytes()
    index = json.loads((path.parents[1] / "index.json").read_text())
    assert path.stem in index.get("canonical", index["valid"])


def sampling_vector(name: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads((VECTORS / make_vectors.VERSION / "sampling" / f"{name}.json").read_text())
    return value


def test_sampling_vectors_give_the_batches() -> None:
    vector = sampling_vector("sorted-keys-batches")
    for case in vector["cases"]:
        for rank, batches in enumerate(case["batches"]):
            plan = sample_batches(
                case["num_records"], batch_size=case["batch_size"], seed=case["seed"], epoch=case["epoch"], rank=rank,
                world_size=case["world_size"], shuffle=case["shuffle"], drop_last=case["drop_last"],
                shard_sizes=case["shard_sizes"], window=case["window"],
            )
            assert [plan.batch(b).tolist() for b in range(len(plan))] == batches, case
        flat = sorted(i for batches in case["batches"] for batch in batches for i in batch)
        assert flat == list(range(case["num_records"])) or case["drop_last"]
    assert len(vector["cases"]) == 13


def test_sampling_vectors_give_the_crops() -> None:
    vector = sampling_vector("crops")
    ops = set()
    for case in vector["cases"]:
        pipeline = pipeline_from_config(dict(case["pipeline"]))
        ops.add(case["pipeline"]["op"])
        height, width = np.array([case["height"]]), np.array([case["width"]])
        for draw in case["draws"]:
            key = record_keys(draw["seed"], AUGMENT_STREAM, draw["epoch"], np.array([draw["record"]], np.uint64))
            assert f"0x{int(key[0]):016x}" == draw["key"]
            assert uniforms(key, 4)[0].tolist() == draw["u"]
            plan = pipeline.plan(height, width, key)
            assert [int(plan.top[0]), int(plan.left[0]), int(plan.height[0]), int(plan.width[0])] == draw["box"]
            assert bool(plan.flip[0]) == draw["flip"]
            for field, box in zip(case.get("fields", []), draw.get("field_boxes", []), strict=True):
                fh, fw = np.array([field["height"]]), np.array([field["width"]])
                carried = scale_plan(plan, fh, fw, height, width)
                if field["snap"]:
                    carried = snap_to_scale(carried, fh, fw, tuple(field["size"]))
                assert [int(carried.top[0]), int(carried.left[0]), int(carried.height[0]), int(carried.width[0])] == box
    assert ops == {"random_resized_crop", "random_crop", "center_crop", "resize"}


def test_eval_crop_vectors_follow_the_written_rule() -> None:
    vector = sampling_vector("eval-crops")
    for case in vector["cases"]:
        size = tuple(case["size"])
        field_size = tuple(case.get("field_size", size))
        resize = max(int(round(case["resize"] * field_size[0] / size[0])), max(field_size))  # spec/sampling.md
        assert resize == case["field_resize"]
        height, width = case["height"], case["width"]
        short, long = min(height, width), max(height, width)
        new_long = int((resize * long) / short)
        new_h, new_w = (new_long, resize) if width <= height else (resize, new_long)
        top, left = int(round((new_h - field_size[0]) / 2.0)), int(round((new_w - field_size[1]) / 2.0))
        assert [new_h, new_w] == case["resized"] and [top, left, *field_size] == case["crop"]
        pipeline = CenterCrop(size, resize=case["resize"])
        assert list(pipeline.resized_crop(height, width, size=field_size)) == [new_h, new_w, top, left]
    assert len(vector["cases"]) == 8


def test_annotated_listing_covers_every_byte() -> None:
    listing = (VECTORS / make_vectors.VERSION / "valid" / "tiny.txt").read_text().splitlines()[1:]
    data = (VECTORS / make_vectors.VERSION / "valid" / "tiny.shard").read_bytes()
    rebuilt = b"".join(bytes.fromhex(line[10:57].replace(" ", "")) for line in listing)
    offsets = [int(line[:8], 16) for line in listing]
    assert rebuilt == data
    assert offsets == sorted(offsets)


_MASK = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's finaliser on Python integers, written from spec/sampling.md."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _key(seed: int, stream: int, epoch: int, index: int) -> int:
    return _mix64(_mix64(_mix64(_mix64(seed & _MASK) ^ stream) ^ (epoch & _MASK)) ^ index)


def _bijection(position: int, size: int, seed: int, stream: int, epoch: int, index: int) -> int:
    """The Feistel bijection of spec/sampling.md, one position at a time, in plain integers."""
    bits = 1
    while 4**bits < size:
        bits += 1
    mask = (1 << bits) - 1
    keys = [_key(seed, stream, epoch, 8 * index + j) for j in range(6)]
    value = position
    while True:
        left, right = value >> bits, value & mask
        for key in keys:
            left, right = right, left ^ (_mix64(key ^ right) & mask)
        value = (left << bits) | right
        if value < size:
            return value


def test_feistel_vectors_follow_the_written_rule() -> None:
    vector = sampling_vector("feistel-batches")
    for item in vector["permutations"]:
        stream = int(item["stream"], 16)
        keys = [f"0x{_key(item['seed'], stream, item['epoch'], 8 * item['index'] + j):016x}" for j in range(6)]
        assert keys == item["round_keys"]
        assert [_bijection(p, item["size"], item["seed"], stream, item["epoch"], item["index"]) for p in range(len(item["image"]))] == item[
            "image"
        ]
    for case in vector["cases"]:
        for rank, batches in case["batches"].items():
            if case["window"] is None:  # the rank takes positions rank + k * world_size of the bijection's order
                flat = [i for batch in batches for i in batch]
                positions = [int(rank) + k * case["world_size"] for k in range(len(flat))]
                assert flat == [_bijection(p, case["num_records"], case["seed"], 0x46454953, case["epoch"], 0) for p in positions]
            sizes = make_vectors._shard_sizes(case["shard_sizes"])
            order = epoch_order(
                "feistel", num_records=case["num_records"], seed=case["seed"], epoch=case["epoch"], shard_sizes=sizes, window=case["window"]
            )
            plan = RankPlan(order, batch_size=case["batch_size"], rank=int(rank), world_size=case["world_size"], drop_last=False)
            assert [plan.batch(b).tolist() for b in range(len(batches))] == batches
    assert len(vector["cases"]) == 9


def test_mixture_and_elastic_vectors_give_the_batches() -> None:
    for case in sampling_vector("mixture-batches")["cases"]:
        assert allocate(case["weights"], epoch_size=case["epoch_size"]) == case["counts"]
        for epoch, ranks in case["batches"].items():
            order = MixtureOrder(case["sizes"], counts=case["counts"], seed=case["seed"], epoch=int(epoch), shuffle=case["shuffle"])
            flat = sorted(i for batches in ranks for batch in batches for i in batch)
            starts = np.cumsum([0, *case["sizes"]])
            assert np.bincount(np.searchsorted(starts, flat, side="right") - 1, minlength=len(case["sizes"])).tolist() == case["counts"]
            for rank, batches in enumerate(ranks):
                plan = RankPlan(order, batch_size=case["batch_size"], rank=rank, world_size=case["world_size"], drop_last=False)
                assert [plan.batch(b).tolist() for b in range(len(plan))] == batches
    for case in sampling_vector("elastic-batches")["cases"]:
        order = epoch_order(case["order"], num_records=case["num_records"], seed=case["seed"], epoch=case["epoch"])
        seen = []
        for hop in case["hops"]:
            for rank, batches in enumerate(hop["batches"]):
                plan = RankPlan(
                    order, batch_size=case["batch_size"], rank=rank, world_size=hop["world_size"], drop_last=False, start=hop["start"]
                )
                assert [plan.batch(b).tolist() for b in range(len(batches))] == batches
                seen += [i for batch in batches for i in batch]
        assert sorted(seen) == list(range(case["num_records"])), "the hops cover the epoch exactly once"
        for refused in case.get("refuses", []):  # fewer records left than ranks: the loader refuses the state
            with pytest.raises(ValueError, match="cannot be split"):
                check_split(
                    case["num_records"] - refused["start"], batch_size=case["batch_size"], world_size=refused["world_size"], drop_last=False
                )


def _uniform(key: int, k: int) -> float:
    """Draw k (from 1) of a key as a float in [0, 1), from spec/sampling.md."""
    return (_mix64((key + k) & _MASK) >> 11) * 2.0**-53


def _erasing_box(u: list[float], args: dict[str, Any], height: int, width: int) -> list[int]:
    """RandomErasing's box by the written rule: [top, left, height, width], all 0 when it does not erase."""
    box = [0, 0, 0, 0]
    if u[0] < args["p"]:
        lo, hi = args.get("scale", [0.02, 0.33])
        rlo, rhi = args.get("ratio", [0.3, 3.3])
        for a in range(10):
            area = height * width * (lo + (hi - lo) * u[1 + 2 * a])
            aspect = math.exp(math.log(rlo) + (math.log(rhi) - math.log(rlo)) * u[2 + 2 * a])
            h, w = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if h < height and w < width:
                if h and w:
                    box = [math.floor(u[21] * (height - h + 1)), math.floor(u[22] * (width - w + 1)), h, w]
                break
    return box


def spec_policies() -> dict[str, list[list[tuple[str, float, int | None]]]]:
    """AutoAugment's policy tables as spec/sampling.md writes them."""
    text = (ROOT / "spec" / "sampling.md").read_text()
    policies = {}
    for name in ("imagenet", "cifar10", "svhn"):
        block = text.split(f'\n`"{name}"` (', 1)[1].split("\n\n", 2)[1]
        rows = []
        for line in block.splitlines()[2:]:
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            assert int(cells[0]) == len(rows)
            rows.append([(cells[i], float(cells[i + 1]), None if cells[i + 2] == "-" else int(cells[i + 2])) for i in (1, 4)])
        assert len(rows) == 25
        policies[name] = rows
    return policies


def test_policy_tables_are_the_reference_policies() -> None:
    from shardfmt.ops._autoaugment import POLICIES

    assert spec_policies() == {name: [list(pair) for pair in table] for name, table in POLICIES.items()}


def test_policy_vector_reaches_every_sub_policy() -> None:
    cases = sampling_vector("autoaugment-policies")["cases"]
    policies = spec_policies()
    assert sorted(case["args"]["policy"] for case in cases) == ["cifar10", "imagenet", "svhn"]
    for case in cases:
        table = policies[case["args"]["policy"]]
        reached = {draw["sub_policy"] for draw in case["draws"]}
        ran = {  # every operation of the sub-policy whose probability is not 0 runs
            s
            for draw in case["draws"]
            for s in [draw["sub_policy"]]
            if all(op is not None or table[s][i][1] == 0 for i, op in enumerate(draw["operations"]))
        }
        assert reached == set(range(25)) and ran == set(range(25)), case["args"]


@pytest.mark.parametrize("vector", ["augment-steps", "autoaugment-policies"])
def test_augment_step_vectors_follow_the_written_rules(vector: str) -> None:
    policies = spec_policies()
    names = [
        "Identity",
        "ShearX",
        "ShearY",
        "TranslateX",
        "TranslateY",
        "Rotate",
        "Brightness",
        "Color",
        "Contrast",
        "Sharpness",
        "Posterize",
        "Solarize",
        "AutoContrast",
        "Equalize",
    ]
    kinds = set()
    for case in sampling_vector(vector)["cases"]:
        kinds.add(case["step"])
        args, height, width = case["args"], case["height"], case["width"]
        for draw in case["draws"]:
            key = _key(draw["seed"], 0x53544550530000 + case["position"], draw["epoch"], draw["record"])
            assert f"0x{key:016x}" == draw["key"]
            u = [_uniform(key, k) for k in range(1, 64)]
            assert u[: len(draw["u"])] == draw["u"]
            if case["step"] == "RandomErasing":
                assert draw["box"] == _erasing_box(u, args, height, width)
                continue
            if case["step"] == "AugMix":
                chosen = _augmix_operations(u, args)
                _check_augmix_weights(u, args, draw["weights"])
            elif case["step"] == "TrivialAugmentWide":
                chosen = [(names[math.floor(14 * u[0])], math.floor(31 * u[1]), u[2] < 0.5)]
            elif case["step"] == "RandAugment":
                chosen = [(names[math.floor(14 * u[2 * k])], args["magnitude"], u[2 * k + 1] < 0.5) for k in range(args["num_ops"])]
            else:
                assert draw.get("sub_policy", math.floor(25 * u[0])) == math.floor(25 * u[0])
                policy = policies[args.get("policy", "imagenet")][math.floor(25 * u[0])]
                chosen = [
                    (name, bin_index or 0, u[3 + i] < 0.5) if u[1 + i] <= p else None for i, (name, p, bin_index) in enumerate(policy)
                ]
            got = draw["operations"]
            assert len(got) == len(chosen)
            for have, want in zip(got, chosen, strict=True):
                if want is None:
                    assert have is None
                    continue
                name, bin_index, negative = want
                assert have[0] == name
                if have[1] is not None:
                    assert have[1] == bin_index
                    assert (have[2] < 0) == (negative and have[2] != 0 and name not in ("Posterize", "Solarize"))
    everything = {"TrivialAugmentWide", "RandAugment", "AutoAugment", "AugMix", "RandomErasing"}
    assert kinds == ({"AutoAugment"} if vector == "autoaugment-policies" else everything)


AUGMIX_NAMES = [
    "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Posterize", "Solarize", "AutoContrast", "Equalize",
    "Brightness", "Color", "Contrast", "Sharpness",
]


def _augmix_operations(u: list[float], args: dict[str, Any]) -> list[Any]:
    """spec/sampling.md's AugMix slots: chain i from s = 2 + W + i (1 + 3 D); depth 1 + floor(3 u[s])
    unless fixed; slot d: operation floor(n u[s+1+3d]), bin floor(severity u[s+2+3d]), sign u[s+3+3d] < 0.5."""
    width, chain_depth, severity = args.get("mixture_width", 3), args.get("chain_depth", -1), args.get("severity", 3)
    names = AUGMIX_NAMES if args.get("all_ops", True) else AUGMIX_NAMES[:9]
    depth = chain_depth if chain_depth > 0 else 3
    chosen: list[Any] = []
    for i in range(width):
        start = 2 + width + i * (1 + 3 * depth)
        drawn = depth if chain_depth > 0 else 1 + math.floor(3 * u[start])
        for d in range(depth):
            slot = start + 1 + 3 * d
            name = names[math.floor(len(names) * u[slot])]
            chosen.append((name, math.floor(severity * u[slot + 1]), u[slot + 2] < 0.5) if d < drawn else None)
    return chosen


def _check_augmix_weights(u: list[float], args: dict[str, Any], weights: list[float]) -> None:
    """m = (g0, g1) / (g0 + g1) and chain i's weight m1 g_(2+i) / sum g_(2+j), g_k the u[k]-quantile
    of Gamma(alpha): in closed form for alpha 1 (-log(1 - u)) and 1/2 (erfinv(u)^2)."""
    alpha, width = args.get("alpha", 1.0), args.get("mixture_width", 3)
    values = torch.tensor(u[: 2 + width], dtype=torch.float64)
    g = -torch.log1p(-values) if alpha == 1.0 else torch.erfinv(values) ** 2
    assert alpha in (1.0, 0.5)
    m0 = float(g[0] / (g[0] + g[1]))
    want = [m0, *((1 - m0) * g[2:] / g[2:].sum()).tolist()]
    assert weights == pytest.approx(want, rel=1e-6, abs=1e-9)


def test_repeat_vectors_follow_the_written_rule() -> None:
    for case in sampling_vector("repeats-batches")["cases"]:
        k, world_size = case["repeats"], case["world_size"]
        base = epoch_order(case["order"], num_records=case["num_records"], seed=case["seed"], epoch=case["epoch"])
        records = base.at(np.arange(case["num_records"])).tolist()
        assert case["draw_epochs"] == [k * case["epoch"] + c for c in range(k)]
        for rank, batches in enumerate(case["batches"]):
            flat = [pair for batch in batches for pair in batch]
            positions = [rank + n * world_size for n in range(len(flat))]
            assert flat == [[records[p // k], p % k] for p in positions]
        assert len({len(batches) for batches in case["batches"]}) == 1
        everything = sorted(tuple(pair) for batches in case["batches"] for batch in batches for pair in batch)
        if case.get("repeats_epoch", "copies") == "copies":
            assert everything == [(r, c) for r in range(case["num_records"]) for c in range(k)]
        else:  # RASampler's epoch: the first N positions (N a multiple of the world size here)
            assert everything == sorted((records[p // k], p % k) for p in range(case["num_records"]))
    assert {case.get("repeats_epoch", "copies") for case in sampling_vector("repeats-batches")["cases"]} == {"copies", "records"}


def _beta_quantile(u: float, alpha: float) -> float:
    """Beta(alpha, alpha)'s quantile by bisection of its CDF, the CDF by Simpson's rule on the
    density (an independent route to spec/sampling.md's lam; good to about 1e-6 here)."""
    if alpha == 1.0:
        return u
    scale = math.exp(math.lgamma(2 * alpha) - 2 * math.lgamma(alpha))

    def cdf(x: float) -> float:
        if x > 0.5:
            return 1.0 - cdf(1.0 - x)
        # substitute x = t^(1/alpha) to remove the endpoint singularity: density dt / alpha
        top, n = x**alpha, 2000
        total = 0.0
        for i in range(n + 1):
            t = top * i / n
            weight = 1 if i in (0, n) else (4 if i % 2 else 2)
            total += weight * (1 - t ** (1 / alpha)) ** (alpha - 1)
        return scale * total * top / (3 * n) / alpha

    low, high = 0.0, 1.0
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < u else (low, middle)
    return (low + high) / 2


def test_batch_step_vectors_follow_the_written_rules() -> None:
    kinds = set()
    for case in sampling_vector("batch-steps")["cases"]:
        (name, args), = case["step"].items()
        kinds.add(name)
        height, width = case["height"], case["width"]
        for draw in case["draws"][:3]:
            key = _key(draw["seed"], 0x4241544348530000, draw["epoch"], draw["batch"])
            assert f"0x{key:016x}" == draw["key"]
            u = [_uniform(key, k) for k in range(1, len(draw["u"]) + 1)]
            assert u == draw["u"]
            kind, options = name, args
            if kind == "RandomChoice":
                weights = options["p"]
                bounds = [sum(weights[: i + 1]) / sum(weights) for i in range(len(weights))]
                choice = next(i for i, bound in enumerate(bounds) if u[0] < bound)
                assert draw["choice"] == choice
                (kind, options), = options["steps"][choice].items()
                u = u[1:]
            lam = _beta_quantile(u[0], options["alpha"])
            if kind == "MixUp":
                assert abs(draw["lam"] - lam) < 1e-5
                continue
            cx, cy = math.floor(width * u[1]), math.floor(height * u[2])
            r = 0.5 * math.sqrt(1 - lam)
            half_w, half_h = int(r * width), int(r * height)
            box = [max(cx - half_w, 0), max(cy - half_h, 0), min(cx + half_w, width), min(cy + half_h, height)]
            if box != draw["box"]:  # lam lies within 1e-5 of a rounding edge of the half sides
                assert abs(r * width - round(r * width)) < 1e-3 or abs(r * height - round(r * height)) < 1e-3
                box = draw["box"]
            assert abs(draw["lam"] - (1 - (box[2] - box[0]) * (box[3] - box[1]) / (height * width))) < 1e-12
    assert kinds == {"MixUp", "CutMix", "RandomChoice"}


def _spec_linspace(a: float, b: float, n: int) -> list[float]:
    """spec/sampling.md's linspace: every value rounded to float32 once from the exact A + i step
    (B - (n - 1 - i) step); in binary64 the product and the sum are exact for these sizes."""
    start, end = float(np.float32(a)), float(np.float32(b))
    if n == 1:
        return [start]
    step = float(np.float32(np.float32(end - start) / np.float32(n - 1)))
    values = [start + i * step if i < n // 2 else end - (n - 1 - i) * step for i in range(n)]
    return [float(np.float32(v)) for v in values]


def test_linspace_vector_is_the_one_rounding_rule() -> None:
    from shardfmt.ops._autoaugment import magnitude_table

    cases = sampling_vector("linspace")["cases"]
    for case in cases:
        assert case["values"] == _spec_linspace(case["a"], case["b"], case["n"]), case["use"]
    tables = {(case["a"], case["b"], case["n"]): case["values"] for case in cases}
    assert tables[(0.0, 0.9, 21)][15] == 0.675000011920929
    assert any(i < case["n"] // 2 for case in cases for i in case["twice_rounded_differs_at"])
    assert magnitude_table("standard", "Color", 21, height=224, width=224) == tables[(0.0, 0.9, 21)]
    assert magnitude_table("wide", "TranslateX", 31, height=224, width=224) == tables[(0.0, 32.0, 31)]
    assert magnitude_table("standard", "TranslateY", 21, height=160, width=331) == tables[(0.0, 150.0 / 331.0 * 160, 21)]


def _jitter_range(value: Any, center: float) -> list[float] | None:
    """ColorJitter's range by spec/sampling.md: v means [max(0, 1 - v), 1 + v] ([-v, v] for hue); a pair is the range."""
    if isinstance(value, list):
        pair = [float(v) for v in value]
    else:
        pair = [max(0.0, 1.0 - value) if center == 1 else -value, center + value]
    return None if pair == [center, center] else pair


def test_step_draw_vectors_follow_the_written_rules() -> None:
    import random

    cases = sampling_vector("step-draws")["cases"]
    assert {case["step"] for case in cases} == {"ColorJitter", "RandomRotation", "RandomGrayscale", "RandomVerticalFlip", "user"}
    for case in cases:
        args = case["args"] if case["step"] != "user" else {}
        for draw in case["draws"]:
            if case["step"] == "user":
                j = draw["position"]
                k, g = (_key(draw["seed"], stream + j, draw["epoch"], draw["record"]) for stream in (0x53544550530000, 0x524E47530000))
                assert (f"0x{k:016x}", f"0x{g:016x}") == (draw["generator_key"], draw["global_key"])
                assert float(torch.rand(1, generator=torch.Generator().manual_seed(k), dtype=torch.float64)[0]) == draw["generator_rand"]
                assert float(torch.rand(1, generator=torch.Generator().manual_seed(g), dtype=torch.float64)[0]) == draw["torch_rand"]
                assert float(np.random.RandomState(g % 2**32).random_sample()) == draw["numpy_random"]
                assert random.Random(g).random() == draw["python_random"]
                continue
            key = _key(draw["seed"], 0x53544550530000 + case["position"], draw["epoch"], draw["record"])
            u = [_uniform(key, n) for n in range(1, len(draw["u"]) + 1)]
            assert f"0x{key:016x}" == draw["key"] and u == draw["u"]
            if case["step"] == "ColorJitter":
                names = ["brightness", "contrast", "saturation", "hue"]
                assert draw["order"] == [names[n] for n in sorted(range(4), key=lambda n: u[n])]
                for n, name in enumerate(names):
                    span = _jitter_range(args.get(name, 0), 0.0 if name == "hue" else 1.0)
                    assert draw["factors"][n] == (None if span is None else span[0] + (span[1] - span[0]) * u[4 + n])
            elif case["step"] == "RandomRotation":
                d = args["degrees"]
                lo, hi = (-d, d) if not isinstance(d, list) else d
                assert draw["angle"] == lo + (hi - lo) * u[0]
            else:
                assert draw["applies"] == (u[0] < args.get("p", 0.1 if case["step"] == "RandomGrayscale" else 0.5))


def _from_vector(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"float"}:
        return float(np.array([int(value["float"], 16)], np.uint64).view(np.float64)[0])
    if isinstance(value, list):
        return [_from_vector(v) for v in value]
    if isinstance(value, dict):
        return {k: _from_vector(v) for k, v in value.items()}
    return value


def test_json_text_vector_reads_as_stated() -> None:
    from shardfmt._jsontext import parse_json

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, (list, dict)):
            pairs = zip(a, b, strict=True) if isinstance(a, list) else ((a[k], b[k]) for k in a)
            return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in pairs)
        return type(a) is type(b) and (a == b and math.copysign(1, a) == math.copysign(1, b) if isinstance(a, float) else a == b)

    cases = json.loads((VECTORS / make_vectors.VERSION / "json-text.json").read_text())["cases"]
    for case in cases:
        text = case["text"].encode()
        if case["kind"] == "value":
            assert same(parse_json(text), _from_vector(case["value"])), case
        elif "canonical" in case:
            assert Schema.from_bytes(text).to_bytes().decode() == case["canonical"]
        else:
            with pytest.raises(shardfmt.ShardfmtError) as caught:
                Schema.from_bytes(text)
            kind = "UnsupportedVersionError" if isinstance(caught.value, shardfmt.UnsupportedVersionError) else "FormatError"
            assert kind == case["error"] and isinstance(caught.value, (shardfmt.SchemaError, shardfmt.UnsupportedVersionError))


def test_shard_plan_vector_follows_the_written_rule() -> None:
    cases = json.loads((VECTORS / make_vectors.VERSION / "shard-plans.json").read_text())["cases"]
    for case in cases:
        sizes = case["sizes"]
        if sizes and isinstance(sizes[0], list):
            sizes = [size for size, count in sizes for _ in range(count)]
        limit, bound = case["shard_size"], case.get("max_records", 1 << 24)
        shards, start, total = [], 0, 0
        for i, size in enumerate(sizes):
            total += size
            if total >= limit or i + 1 - start >= bound:
                shards.append([start, i + 1])
                start, total = i + 1, 0
        if start < len(sizes):
            shards.append([start, len(sizes)])
        assert shards == case["shards"]


def _pixels_vector() -> list[dict[str, Any]]:
    return json.loads((VECTORS / make_vectors.VERSION / "pixels.json").read_text())["cases"]


def _summary_matches(pixels: np.ndarray, summary: dict[str, Any], tolerance: int = 0) -> bool:
    if list(pixels.shape) != summary["shape"]:
        return False
    if tolerance == 0 and format_checksum(checksum(np.ascontiguousarray(pixels).tobytes())) != summary["checksum"]:
        return False
    return all(np.abs(pixels[y, x].astype(int) - np.array(values)).max() <= tolerance for y, x, values in summary["samples"])


def test_pixel_vector_decodes_as_libjpeg_does_by_default() -> None:
    """PIL's decoder (libjpeg-turbo with its defaults: ISLOW IDCT, fancy upsampling) gives every
    decoded image byte for byte, and PIL's antialiased resize of each box every crop within 1."""
    import io

    from PIL import Image

    filters = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC, "nearest": Image.Resampling.NEAREST}
    worst = 0
    for case in _pixels_vector():
        if "jpeg" not in case:
            continue
        with Image.open(io.BytesIO(bytes.fromhex(case["jpeg"]))) as image:
            image.load()
            decoded = np.asarray(image).reshape(case["height"], case["width"], case["channels"])
            assert _summary_matches(decoded, case["decoded"]), case["name"]
            for crop in case["crops"]:
                top, left, h, w = crop["box"]
                box = image.crop((left, top, left + w, top + h))
                resized = box if [h, w] == crop["size"] else box.resize(crop["size"][::-1], filters[crop["interpolation"]])
                pixels = np.asarray(resized).reshape(*crop["size"], case["channels"])
                pixels = pixels[:, ::-1] if crop["flip"] else pixels
                assert _summary_matches(pixels, crop, tolerance=0 if crop["interpolation"] == "nearest" else 1), (case["name"], crop)
                worst = max(worst, max(int(np.abs(pixels[y, x].astype(int) - v).max()) for y, x, v in crop["samples"]))
    assert worst <= 1


def test_pixel_vector_steps_follow_the_written_formulas() -> None:
    cases = _pixels_vector()
    sample_case = cases[-1]
    image = next(case for case in cases if case.get("name") == sample_case["sample"]["image"])
    import simplejpeg

    decoded = simplejpeg.decode_jpeg(bytes.fromhex(image["jpeg"]), colorspace="RGB", fastdct=False, fastupsample=False)
    source = torch.from_numpy(decoded).permute(2, 0, 1)[None]
    size = tuple(sample_case["sample"]["resized_to"])
    x = torch.nn.functional.interpolate(source, size=size, mode="bilinear", antialias=True)[0].permute(1, 2, 0).numpy()
    assert _summary_matches(x, sample_case)
    gray = np.trunc(0.2989 * x[..., 0].astype(np.float64) + 0.587 * x[..., 1] + 0.114 * x[..., 2])
    formulas = {
        "VerticalFlip": lambda m: x[::-1],
        "Invert": lambda m: 255 - x,
        "Posterize": lambda m: x & np.uint8(256 - 2 ** (8 - int(m))),
        "Solarize": lambda m: np.where(x >= m, 255 - x, x),
        "Grayscale": lambda m: np.repeat(gray[..., None], 3, axis=2),
    }
    steps = {step["step"]: step for step in sample_case["steps"]}
    for name, formula in formulas.items():
        step = steps[name]
        assert _summary_matches(np.asarray(formula(step["magnitude"])).astype(np.uint8), step, step["tolerance"]), name
