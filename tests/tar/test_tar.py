"""Tar shards: the key rule, the deterministic writer, the member scanner and index, the reader
adapter, tar datasets, indexing existing tars and the open-time cache, and malformed tars."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import jpeg_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from shardfmt import (
    ChecksumError,
    ConvertError,
    DatasetNotFoundError,
    DatasetWriter,
    FormatError,
    LimitError,
    ManifestError,
    SchemaError,
    ShardfmtError,
    ShardNotFoundError,
    open_dataset,
)
from shardfmt._dataset.tars import (
    CACHE_NAME,
    cache_dirs,
    expand_braces,
    index_tars,
    tar_sources,
)
from shardfmt._synthetic import make_image
from shardfmt.format import IMAGE_CLASSIFICATION, ShardReader, ShardWriter
from shardfmt.tar._index import INDEX_SCHEMA, index_path_for, index_tar
from shardfmt.tar._keys import REJECT_REASONS, split_key
from shardfmt.tar._reader import TarShardReader
from shardfmt.tar._scan import iter_tar_samples
from shardfmt.tar._writer import TarShardWriter

# -- helpers -----------------------------------------------------------------------------------


def add(archive: tarfile.TarFile, name: str, data: bytes, **fields: Any) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    archive.addfile(info, io.BytesIO(data))


def write_tar(path: Path, members: list[tuple[str, bytes]], *, fmt: int = tarfile.PAX_FORMAT) -> Path:
    with tarfile.open(path, "w", format=fmt, encoding="utf-8", errors="surrogateescape") as archive:
        for name, data in members:
            add(archive, name, data)
    return path


def write_ours(path: Path, count: int = 4, *, meta: bool = False) -> list[tuple[str, bytes, int]]:
    samples = [(f"s{i:03d}", jpeg_bytes(16 + i, 20, seed=i), i % 3) for i in range(count)]
    with TarShardWriter(path) as writer:
        for key, image, label in samples:
            writer.write(key, image=image, label=label, meta={"i": key} if meta else None)
    return samples


# -- the key rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a/b.c.d.jpg", ("a/b", "c.d.jpg")),
        ("n01440764/img_00001.JPEG", ("n01440764/img_00001", "JPEG")),
        ("x.JPG", ("x", "JPG")),
        ("a.b/c.jpg", ("a.b/c", "jpg")),
        ("a/b.", ("a/b", "")),
        ("README", None),
        ("a.b/c", None),
        (".hidden.jpg", None),
        ("a/.hidden.jpg", ("a/", "hidden.jpg")),
        ("a.b/.hidden.jpg", None),
        ("a.b\nc/d.jpg", None),
        ("d" * 150 + "/k.seg.png", ("d" * 150 + "/k", "seg.png")),
        ("caf\udce9.jpg", ("caf\udce9", "jpg")),
    ],
)
def test_split_key(name: str, expected: tuple[str, str] | None) -> None:
    assert split_key(name) == expected


def test_expand_braces() -> None:
    assert expand_braces("s-{000..003}.tar") == [f"s-{i:03d}.tar" for i in range(4)]
    assert expand_braces("{a,b}/{1..2}.tar") == ["a/1.tar", "a/2.tar", "b/1.tar", "b/2.tar"]
    assert expand_braces("{x,{y,z}}.tar") == ["x.tar", "y.tar", "z.tar"]
    assert expand_braces("{3..1}") == ["3", "2", "1"]
    assert expand_braces("plain{}.tar") == ["plain{}.tar"]
    with pytest.raises(ValueError, match="more than"):
        expand_braces("{0..99999999}")


# -- the writer --------------------------------------------------------------------------------


def test_writer_is_deterministic_and_tar_headers_are_fixed(tmp_path: Path) -> None:
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    write_ours(first, meta=True)
    write_ours(second, meta=True)
    assert first.read_bytes() == second.read_bytes()
    assert index_path_for(first).read_bytes() == index_path_for(second).read_bytes()
    assert first.stat().st_size % 10240 == 0
    with tarfile.open(first) as archive:
        infos = archive.getmembers()
    assert [i.name for i in infos[:3]] == ["s000.cls", "s000.jpg", "s000.json"]
    for info in infos:
        assert (info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode) == (0, 0, 0, "", "", 0o644)
        assert info.type == tarfile.REGTYPE and not info.pax_headers
    assert not list(tmp_path.glob(".*tmp*"))


def test_writer_uses_pax_only_for_long_or_non_ascii_names(tmp_path: Path) -> None:
    keys = ["short", "d/" + "x" * 120, "h\u00e9", "caf\udce9", "k" * 96]
    path = tmp_path / "names.tar"
    with TarShardWriter(path) as writer:
        for i, key in enumerate(keys):
            writer.write(key, image=jpeg_bytes(8, 8, seed=i), label=i)
    with tarfile.open(path, encoding="utf-8", errors="surrogateescape") as archive:
        infos = {info.name: info for info in archive.getmembers()}
    assert sorted(infos) == sorted(f"{k}.{e}" for k in keys for e in ("cls", "jpg"))
    assert not infos["short.jpg"].pax_headers and not infos["k" * 96 + ".jpg"].pax_headers
    for key in keys[1:4]:
        assert infos[f"{key}.jpg"].pax_headers["path"] == f"{key}.jpg"
    assert [s["__key__"] for s in iter_tar_samples(path)] == keys


@pytest.mark.parametrize(
    "key", ["", "a.b", ".x", "a/", "/abs", "a//b", "a/../b", "./a", "x\x00y", "a\nb", "a\tb", "a\x7fb", "__meta__/k", "a/.b", 7, "\ud800"]
)
def test_writer_refuses_keys_that_would_not_read_back(tmp_path: Path, key: Any) -> None:
    with pytest.raises(SchemaError):
        with TarShardWriter(tmp_path / "a.tar") as writer:
            writer.write(key, image=jpeg_bytes(), label=0)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"label": -1}, "label must be"),
        ({"label": True}, "label must be"),
        ({"label": 1 << 20}, "label must be"),
        ({"image": b"\x89PNG...."}, "not a JPEG"),
        ({"image": "text"}, "needs bytes"),
        ({"meta": {"x": float("nan")}}, "not JSON"),
        ({"key": "dup"}, "written before"),
    ],
)
def test_writer_refuses_bad_samples_and_leaves_nothing(tmp_path: Path, change: dict[str, Any], says: str) -> None:
    sample = {"key": "k1", "image": jpeg_bytes(), "label": 0, "meta": None} | change
    with pytest.raises(SchemaError, match=says):
        with TarShardWriter(tmp_path / "a.tar") as writer:
            writer.write("dup", image=jpeg_bytes(), label=0)
            writer.write(sample["key"], image=sample["image"], label=sample["label"], meta=sample["meta"])
    assert list(tmp_path.iterdir()) == []


def test_index_of_our_tar_is_the_writers_index(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    samples = write_ours(path, 6, meta=True)
    info = index_tar(path, index=tmp_path / "again.idx")
    assert (tmp_path / "again.idx").read_bytes() == index_path_for(path).read_bytes()
    assert info.tar.num_records == 6 and info.rejects == () and info.max_label == 2
    assert info.tar.size == path.stat().st_size
    from shardfmt._checksum import checksum

    assert info.tar.checksum == checksum(path.read_bytes())
    with ShardReader(index_path_for(path)) as index:
        assert index.schema == INDEX_SCHEMA
        first = index.record(0)
        assert bytes(first["key"]) == b"s000" and first["label"] == 0
        assert sorted(first["members"]) == ["cls", "jpg", "json"]
    assert len(samples) == 6


# -- scanning and indexing anyone's tar --------------------------------------------------------


def test_members_are_grouped_by_key_even_when_not_adjacent(tmp_path: Path) -> None:
    a, b = jpeg_bytes(10, 12, seed=1), jpeg_bytes(12, 10, seed=2)
    path = write_tar(
        tmp_path / "mixed.tar",
        [("a.jpg", a), ("b.JPG", b), ("README", b"hi"), ("__meta__/x.txt", b"m"), ("b.cls", b"1"), ("a.cls", b" 2\n"), ("a.seg.png", b"p")],
    )
    samples = [{k: bytes(v) if isinstance(v, memoryview) else v for k, v in s.items()} for s in iter_tar_samples(path)]
    assert samples == [
        {"__key__": "a", "__url__": str(path), "jpg": a, "cls": b" 2\n", "seg.png": b"p"},
        {"__key__": "b", "__url__": str(path), "jpg": b, "cls": b"1"},
    ]
    info = index_tar(path)
    assert info.skipped_members == 2 and info.rejects == ()
    with TarShardReader(path) as reader:
        assert [(r["key"], r["label"], bytes(r["image"])) for r in reader] == [("a", 2, a), ("b", 1, b)]
        assert sorted(reader.members(0)) == ["cls", "jpg", "seg.png"]


def test_rejects_name_the_tar_the_key_and_the_reason(tmp_path: Path) -> None:
    good = jpeg_bytes(10, 10)
    cmyk = io.BytesIO()
    Image.fromarray(make_image(8, 8, seed=1)).convert("CMYK").save(cmyk, "JPEG")
    path = write_tar(
        tmp_path / "r.tar",
        [
            ("ok.jpg", good), ("ok.cls", b"4"),
            ("dup.jpg", good), ("dup.JPG", good), ("dup.cls", b"0"),
            ("noimage.txt", b"a caption"), ("noimage.cls", b"0"),
            ("empty.jpg", b""), ("empty.cls", b"0"),
            ("png.jpg", b"\x89PNG\r\n"), ("png.cls", b"0"),
            ("cut.jpg", good[:8]), ("cut.cls", b"0"),
            ("cmyk.jpeg", cmyk.getvalue()), ("cmyk.cls", b"0"),
            ("nolabel.jpg", good),
            ("badlabel.jpg", good), ("badlabel.cls", b"seven"),
            ("neglabel.jpg", good), ("neglabel.cls", b"-1"),
        ],
    )
    info = index_tar(path, name="r.tar")
    found = [(r.key, r.reason) for r in info.rejects]
    assert found == [
        ("dup", "duplicate-member"),
        ("noimage", "no-image"),
        ("empty", "empty"),
        ("png", "not-a-jpeg"),
        ("cut", "corrupt"),
        ("cmyk", "unsupported-jpeg"),
        ("nolabel", "no-label"),
        ("badlabel", "bad-label"),
        ("neglabel", "bad-label"),
    ]
    assert all(r.path == "r.tar" and r.detail for r in info.rejects)
    assert [reason for _, reason in found] == [r for r in REJECT_REASONS if r != "too-large"] + ["bad-label"]
    assert info.tar.num_records == 1 and info.max_label == 4


def test_iter_refuses_a_sample_with_two_members_of_one_extension(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "d.tar", [("a.jpg", b"1"), ("a.JPG", b"2")])
    with pytest.raises(FormatError, match="two members with extension 'jpg'") as info:
        list(iter_tar_samples(path))
    assert info.value.path == str(path) and info.value.offset == 1024


def test_index_keys_keep_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    image = jpeg_bytes()
    path = write_tar(tmp_path / "k.tar", [("caf\udce9.jpg", image), ("caf\udce9.cls", b"0")], fmt=tarfile.GNU_FORMAT)
    index_tar(path)
    with TarShardReader(path) as reader:
        assert reader.record(0)["key"] == "caf\udce9"
        assert bytes(reader.payload(0, "key")) == b"caf\xe9"


def test_member_extensions_that_are_not_utf8_are_indexed_as_text(tmp_path: Path) -> None:
    # The index's members JSON is UTF-8: such bytes are written \xNN, as reports show them.
    image = jpeg_bytes()
    members = [("k.jpg", image), ("k.cls", b"0"), ("k.caf\udce9", b"zz")]
    path = write_tar(tmp_path / "k.tar", members, fmt=tarfile.GNU_FORMAT)
    info = index_tar(path)
    assert (info.index.num_records, info.rejects) == (1, ())
    with TarShardReader(path) as reader:
        assert sorted(reader.index.record(0)["members"]) == ["caf\\xe9", "cls", "jpg"]
        assert bytes(reader.members(0)["caf\\xe9"]) == b"zz"
    clash = write_tar(tmp_path / "c.tar", [*members, ("k.caf\\xe9", b"yy")], fmt=tarfile.GNU_FORMAT)
    assert [(r.key, r.reason) for r in index_tar(clash).rejects] == [("k", "duplicate-member")]


# -- the reader adapter ------------------------------------------------------------------------


def test_table_has_the_binary_shards_columns_and_values(tmp_path: Path) -> None:
    samples = [(f"k{i}", jpeg_bytes(10 + i, 30 - i, seed=i), i) for i in range(5)]
    with TarShardWriter(tmp_path / "a.tar") as writer:
        for key, image, label in samples:
            writer.write(key, image=image, label=label)
    with DatasetWriter(tmp_path / "bin", schema=IMAGE_CLASSIFICATION) as writer:
        for key, image, label in samples:
            writer.write({"image": image, "label": label, "key": key})
    with TarShardReader(tmp_path / "a.tar") as tar, ShardReader(tmp_path / "bin" / "shard-00000.shard") as binary:
        assert tar.table.dtype == binary.table.dtype
        assert tar.schema == binary.schema and len(tar) == len(binary)
        same = ["image.height", "image.width", "image.channels", "image.reserved", "label"]
        assert all((tar.table[c] == binary.table[c]).all() for c in same)
        assert (tar.table["offset"] == tar.table["image.offset"]).all() and (tar.table["size"] == tar.table["image.size"]).all()
        for i in range(len(tar)):
            ours, theirs = tar.record(i), binary.record(i)
            assert (ours["key"], ours["label"], bytes(ours["image"])) == (theirs["key"], theirs["label"], bytes(theirs["image"]))
            assert sorted(ours) == sorted(theirs) and tar.image_info(i) == binary.image_info(i)
            tar.verify_record(i)


def test_corrupt_image_bytes_raise_checksum_error_naming_tar_and_record(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    write_ours(path, 3)
    with TarShardReader(path) as reader:
        start = int(reader.table[2]["offset"])
    data = bytearray(path.read_bytes())
    data[start + 100] ^= 0x01
    path.write_bytes(bytes(data))
    with TarShardReader(path) as reader:
        reader.verify_record(1)
        with pytest.raises(ChecksumError) as info:
            reader.record(2)["image"]
        assert (info.value.path, info.value.record, info.value.offset) == (str(path), 2, start)
        assert str(info.value).startswith(f"{path}: byte {start}: record 2: image member")
    with TarShardReader(path, verify=False) as reader:
        size = int(reader.table[2]["size"])
        assert bytes(reader.record(2)["image"]) == bytes(data[start : start + size])  # the flipped bytes, unchecked


def test_an_index_that_does_not_fit_its_tar_is_a_format_error(tmp_path: Path) -> None:
    write_ours(tmp_path / "big.tar", 12)
    write_ours(tmp_path / "small.tar", 1)
    assert (tmp_path / "small.tar").stat().st_size < (tmp_path / "big.tar").stat().st_size
    with pytest.raises(FormatError, match="past the end of the tar") as info:
        TarShardReader(tmp_path / "small.tar", index=index_path_for(tmp_path / "big.tar"))
    assert info.value.path == str(index_path_for(tmp_path / "big.tar")) and info.value.record is not None
    with DatasetWriter(tmp_path / "bin", schema=IMAGE_CLASSIFICATION) as writer:
        writer.write({"image": jpeg_bytes(), "label": 0, "key": "k"})
    with pytest.raises(FormatError, match="not a tar member index"):
        TarShardReader(tmp_path / "small.tar", index=tmp_path / "bin" / "shard-00000.shard")
    with pytest.raises(ShardNotFoundError):
        TarShardReader(tmp_path / "small.tar", index=tmp_path / "none.idx")


# -- malformed tars ----------------------------------------------------------------------------


def valid_tar(tmp_path: Path) -> tuple[bytes, list[int]]:
    """Our tar of two samples (four members), and the offsets of its member headers."""
    write_ours(tmp_path / "seed.tar", 2)
    with tarfile.open(tmp_path / "seed.tar") as archive:
        headers = [info.offset for info in archive.getmembers()]
    return (tmp_path / "seed.tar").read_bytes(), headers


@pytest.mark.parametrize(
    ("damage", "offset", "says"),
    [
        (lambda b, h: b"", lambda h: 0, "file is empty"),
        (lambda b, h: b"\x1f\x8b\x08" + b[3:], lambda h: 0, "gzip-compressed"),
        (lambda b, h: b"not a tar at all" * 64, lambda h: 0, "malformed tar header"),
        (lambda b, h: b[: h[1] + 600], lambda h: h[1], "runs past the end of the file"),
        (lambda b, h: b[: h[2]] + b"\x01" + b[h[2] + 1 :], lambda h: h[2], "not a valid tar header"),
        (lambda b, h: b[: h[2] + 148] + b"0000000\x00" + b[h[2] + 156 :], lambda h: h[2], "not a valid tar header"),
        (lambda b, h: b[:-512] + b"\x01" + b[-511:], lambda h: None, "after the end-of-archive"),
    ],
)
def test_malformed_tar(tmp_path: Path, damage: Any, offset: Any, says: str) -> None:
    data, headers = valid_tar(tmp_path)
    path = tmp_path / "bad.tar"
    path.write_bytes(damage(data, headers))
    with pytest.raises(ShardfmtError) as info:
        index_tar(path)
    assert type(info.value) is FormatError and says in info.value.message, info.value
    assert info.value.path == str(path)
    if offset(headers) is not None:
        assert info.value.offset == offset(headers)
    assert not (tmp_path / "bad.tar.idx").exists()


def test_tar_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardfmt.tar import _scan as tar

    path = tmp_path / "a.tar"
    write_ours(path, 3)
    monkeypatch.setattr(tar, "MAX_RECORDS_PER_SHARD", 2)
    with pytest.raises(LimitError, match="more than 2 samples"):
        index_tar(path)
    monkeypatch.setattr(tar, "MAX_SHARD_SIZE", 1000)
    with pytest.raises(LimitError, match="over the shard limit"):
        index_tar(path)


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.data())
def test_fuzzed_tars_raise_only_shardfmt_errors(tmp_path: Path, data: st.DataObject) -> None:
    seed = FUZZ_SEED
    kind = data.draw(st.sampled_from(["flip", "truncate", "extend", "splice", "octal"]))
    raw = bytearray(seed)
    if kind == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    elif kind == "extend":
        raw += data.draw(st.binary(min_size=1, max_size=1200))
    elif kind == "splice":
        start = data.draw(st.integers(0, len(raw)))
        raw[start : start + data.draw(st.integers(0, 600))] = data.draw(st.binary(max_size=600))
    else:  # a header number field (size, mtime, checksum) set to something awkward
        header = data.draw(st.sampled_from([0, 1024, 2048]))
        field = data.draw(st.sampled_from([(124, 12), (136, 12), (148, 8), (100, 8)]))
        raw[header + field[0] : header + sum(field)] = data.draw(st.binary(min_size=field[1], max_size=field[1]))
    path = tmp_path / "fuzz.tar"
    path.write_bytes(bytes(raw))
    tracemalloc.start()
    try:
        index_tar(path)
        with TarShardReader(path) as reader:
            for i in range(len(reader)):
                record = reader.record(i)
                for name in record:
                    record[name]
                reader.members(i)
    except ShardfmtError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024 + 4 * len(raw)


INT64 = st.integers(-(1 << 63), (1 << 63) - 1)


@FUZZ
@given(
    columns=st.lists(
        st.fixed_dictionaries(
            {
                "image_offset": st.one_of(st.sampled_from([0, 512, 1536, 10240, 1 << 40]), INT64),
                "image_size": st.one_of(st.sampled_from([0, 10, 1 << 30, (1 << 30) + 1]), INT64),
                "image_height": st.one_of(st.sampled_from([0, 1, 65535, 65536]), INT64),
                "image_width": st.sampled_from([1, 8, 70000]),
                "image_channels": st.sampled_from([0, 1, 3, 4]),
                "image_checksum": INT64,
                "label": st.one_of(st.sampled_from([-1, 0, 1 << 20]), INT64),
            }
        ),
        max_size=4,
    )
)
def test_index_values_are_checked_before_use(tmp_path: Path, columns: list[dict[str, int]]) -> None:
    path = tmp_path / "a.tar"
    if not path.exists():
        write_ours(path, 3)
    with ShardWriter(tmp_path / "fuzz.idx", schema=INDEX_SCHEMA) as writer:
        for i, values in enumerate(columns):
            writer.write({"key": b"k%d" % i, "members": {"jpg": [values["image_offset"] % (1 << 40), 5]}, **values})
    try:
        with TarShardReader(path, index=tmp_path / "fuzz.idx") as reader:
            for i in range(len(reader)):
                reader.record(i)["key"]
                reader.members(i)
                try:
                    reader.verify_record(i)
                except ChecksumError:
                    pass
    except FormatError:
        pass


def _fuzz_seed() -> bytes:
    """A tar with PAX and GNU long names, a plain member and non-adjacent members."""
    out = io.BytesIO()
    image = jpeg_bytes(8, 8)
    pax = tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT)
    add(pax, "p/" + "x" * 110 + ".jpg", image)
    add(pax, "short.jpg", image)
    add(pax, "p/" + "x" * 110 + ".cls", b"1")
    add(pax, "short.cls", b"0")
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as gnu:  # continues the same archive
        add(gnu, "g/" + "y" * 120 + ".jpg", image)
        add(gnu, "g/" + "y" * 120 + ".cls", b"2")
    return out.getvalue()


FUZZ_SEED = _fuzz_seed()


# -- tar datasets ------------------------------------------------------------------------------


def tar_dataset(root: Path, count: int = 9, **options: Any) -> list[tuple[str, bytes, int]]:
    samples = [(f"r{i:02d}", jpeg_bytes(12 + i, 14, seed=i), i % 3) for i in range(count)]
    with DatasetWriter(
        root, schema=IMAGE_CLASSIFICATION, shard_format="tar", shard_size=20_000, classes=["a", "b", "c"], **options
    ) as writer:
        for key, image, label in samples:
            writer.write({"image": image, "label": label, "key": key})
    return samples


def test_tar_dataset_opens_transparently(tmp_path: Path) -> None:
    samples = tar_dataset(tmp_path / "ds")
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["shard_format"] == "tar" and len(manifest["shards"]) > 1
    assert all(s["index"]["path"] == s["path"] + ".idx" for s in manifest["shards"])
    with open_dataset(tmp_path / "ds") as reader:
        assert [(r["key"], bytes(r["image"]), r["label"]) for r in reader] == samples
        assert isinstance(reader.shard(0), TarShardReader)
        assert reader.classes == ["a", "b", "c"]


def test_tar_manifest_rules(tmp_path: Path) -> None:
    tar_dataset(tmp_path / "ds")
    path = tmp_path / "ds" / "manifest.json"
    original = json.loads(path.read_text())
    cases = {
        "missing 'index'": lambda m: m["shards"][0].pop("index"),
        "index has the wrong type": lambda m: m["shards"][0].update(index="x.idx"),
        "listed twice": lambda m: m["shards"][1]["index"].update(path=m["shards"][0]["path"]),
        "has an empty": lambda m: m["shards"][0]["index"].update(path="a//b.idx"),
        "size 0": lambda m: m["shards"][0]["index"].update(size=0),
        "16 lower-case hex": lambda m: m["shards"][0]["index"].update(checksum="xxh3_64:0"),
    }
    for says, change in cases.items():
        value = json.loads(json.dumps(original))
        change(value)
        path.write_text(json.dumps(value))
        with pytest.raises(ManifestError) as info:
            open_dataset(tmp_path / "ds")
        assert says in str(info.value) or "index" in str(info.value), (says, info.value)
    value = json.loads(json.dumps(original))
    value["shards"][0]["index"]["size"] += 1
    path.write_text(json.dumps(value))
    with pytest.raises(FormatError, match="manifest says"):
        open_dataset(tmp_path / "ds")[0]


def test_tar_manifest_validates_against_the_json_schema(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(__file__).resolve().parents[2] / "spec" / "manifest.schema.json").read_text())
    tar_dataset(tmp_path / "ds")
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    validator.validate(manifest)
    manifest["shards"][0].pop("index")
    assert not validator.is_valid(manifest)


def test_a_directory_of_tars_without_manifest_is_not_a_dataset(tmp_path: Path) -> None:
    write_ours(tmp_path / "a.tar")
    with pytest.raises(DatasetNotFoundError):
        open_dataset(tmp_path)


def test_index_tars_writes_a_dataset_with_rejects(tmp_path: Path) -> None:
    root = tmp_path / "wds"
    (root / "sub").mkdir(parents=True)
    write_ours(root / "b.tar", 3)
    write_tar(root / "sub" / "a.tar", [("x.jpg", jpeg_bytes()), ("x.cls", b"5"), ("y.jpg", b"nope"), ("y.cls", b"1")])
    write_ours(root / ".hidden.tar", 1)
    manifest = index_tars([root])
    assert [s.path for s in manifest.shards] == ["b.tar", "sub/a.tar"]
    assert manifest.classes == [str(i) for i in range(6)]
    assert manifest.rejects == {"count": 1, "by_reason": {"not-a-jpeg": 1}, "report": "rejects.jsonl"}
    assert json.loads((root / "rejects.jsonl").read_text()) == {
        "path": "sub/a.tar",
        "key": "y",
        "reason": "not-a-jpeg",
        "detail": "the image member does not start with a JPEG start-of-image marker",
    }
    first = (root / "manifest.json").read_bytes()
    with open_dataset(root) as reader:
        assert [r["key"] for r in reader] == ["s000", "s001", "s002", "x"]
    with pytest.raises(ConvertError, match="already holds manifest.json"):
        index_tars([root / "b.tar"], out=root)
    index_tars([root], overwrite=True)
    assert (root / "manifest.json").read_bytes() == first
    with pytest.raises(ConvertError, match="outside the output folder"):
        index_tars([root / "b.tar"], out=root / "sub")
    with pytest.raises(ConvertError, match="has no name"):
        index_tars([root], classes=["only"], overwrite=True)


def test_open_tars_directly_indexes_once_into_the_cache(tmp_path: Path) -> None:
    root = tmp_path / "wds"
    root.mkdir()
    for i in range(3):
        write_ours(root / f"part-{i}.tar", 2)
    pattern = str(root / "part-{0..2}.tar")
    with open_dataset(pattern) as reader:
        assert len(reader) == 6 and reader.index_root == root / CACHE_NAME and reader.root == root
        assert reader.manifest.shards[0].index is not None
        keys = [r["key"] for r in reader]
    stamp = (root / CACHE_NAME / "part-0.tar.idx").stat().st_mtime_ns
    with open_dataset([root / "part-0.tar", str(root / "part-{1,2}.tar")]) as reader:
        assert [r["key"] for r in reader] == keys
    assert (root / CACHE_NAME / "part-0.tar.idx").stat().st_mtime_ns == stamp
    write_ours(root / "part-0.tar", 3)  # rewritten: indexed again
    with open_dataset(root / "part-0.tar") as reader:
        assert len(reader) == 3


def test_open_tars_falls_back_to_the_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "wds"
    root.mkdir()
    write_ours(root / "a.tar", 2)
    (root / CACHE_NAME).write_bytes(b"")  # a file where the folder would go: not writable
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))
    with open_dataset(root / "a.tar") as reader:
        assert reader.index_root == cache_dirs(root)[1]
        assert str(reader.index_root).startswith(str(tmp_path / "user" / "shardfmt" / "tar-index"))
        assert len(reader) == 2


def test_open_refuses_remote_urls_and_takes_local_paths() -> None:
    for url in ("https://example.com/shard-{0..1}.tar", "pipe:curl -s x.tar", "s3://bucket/x.tar"):
        with pytest.raises(ValueError, match="only local tars"):
            open_dataset(url)
    assert tar_sources("run:2/x-{0..1}.tar") == [Path("run:2/x-0.tar"), Path("run:2/x-1.tar")]
    assert tar_sources("file:///data/x.tar") == [Path("/data/x.tar")]
    assert tar_sources("/data/dataset") is None and tar_sources(["a.tar"]) == [Path("a.tar")]


def test_manifest_of_a_binary_dataset_is_unchanged(small_dataset: Path) -> None:
    manifest = json.loads((small_dataset / "manifest.json").read_text())
    assert manifest["shard_format"] == "binary"
    assert all("index" not in shard for shard in manifest["shards"])


def test_table_is_read_only(tmp_path: Path) -> None:
    write_ours(tmp_path / "a.tar", 1)
    with TarShardReader(tmp_path / "a.tar") as reader:
        with pytest.raises(ValueError):
            reader.table["label"][0] = 5
        assert isinstance(reader.table, np.ndarray)


# -- spec/tar.md describes the same bytes ------------------------------------------------------

SPEC = Path(__file__).resolve().parents[2] / "spec"


def test_spec_header_table_is_what_the_writer_writes() -> None:
    from shardfmt.tar._writer import _ustar_header

    text = (SPEC / "tar.md").read_text()
    header = _ustar_header(b"cat/0001.cls", 1, b"0")
    rows = re.findall(r"^\| (\d+) \| (\d+) \| `?([\w ]+)`? \| (.+) \|$", text, re.MULTILINE)
    assert [int(offset) for offset, *_ in rows] == [0, 100, 108, 116, 124, 136, 148, 156, 157, 257, 263, 265, 297, 329, 337, 345, 500]
    assert sum(int(size) for _, size, *_ in rows) == 512
    checked = 0
    for offset, size, _, value in rows:
        field = header[int(offset) : int(offset) + int(size)]
        quoted = re.match(r"`([^`]*)`( and NUL)?", value)
        if quoted:
            assert field == quoted.group(1).encode() + (b"\x00" if quoted.group(2) else b""), (offset, value)
            checked += 1
        elif value.startswith("zeros"):
            assert not any(field), offset
            checked += 1
    assert checked == 14
    assert header[148:156] == b"011026\x00 " and "`chksum` `011026`" in text


def test_spec_lists_the_index_schema_and_reject_reasons() -> None:
    text = (SPEC / "tar.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (bytes|int64|json) \|", text, re.MULTILINE)
    assert rows == [(f.name, f.type) for f in INDEX_SCHEMA.fields]
    assert re.findall(r"^\| `([a-z-]+)` \| (?:has|is)", text, re.MULTILINE) == list(REJECT_REASONS)
    conversion = (SPEC / "conversion.md").read_text()
    converter_reasons = ["duplicate-member", "no-image", "no-label", "bad-label", "corrupt", "bad-key", "duplicate-key"]
    assert all(f"`{reason}`" in conversion for reason in converter_reasons)


# -- verify and info -----------------------------------------------------------------------------


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_verify_checks_images_tars_and_indexes(tmp_path: Path) -> None:
    from shardfmt._dataset.summary import summarise_dataset
    from shardfmt._dataset.verify import verify_dataset

    root = tmp_path / "ds"
    tar_dataset(root)
    report = verify_dataset(root)
    assert report.ok and report.num_records == 9 and report.bytes_hashed > sum(p.stat().st_size for p in root.glob("*.tar"))
    summary = summarise_dataset(root)
    assert summary.num_records == 9 and summary.records_per_class == (3, 3.0, 3) and summary.channels == {3: 9}

    with TarShardReader(root / "shard-00001.tar") as reader:
        image_start = int(reader.table[1]["offset"])
    flip(root / "shard-00001.tar", image_start + 50)  # an image byte
    flip(root / "shard-00000.tar", os.path.getsize(root / "shard-00000.tar") - 1)  # trailing padding only
    problems = verify_dataset(root).problems
    assert [type(p) for p in problems] == [ChecksumError, ChecksumError]
    assert (problems[0].path, problems[0].offset, problems[0].record) == (str(root / "shard-00000.tar"), None, None)
    assert "whole-file checksum" in problems[0].message
    assert (problems[1].path, problems[1].offset, problems[1].record) == (str(root / "shard-00001.tar"), image_start, 1)
    assert verify_dataset(root, quick=True).ok


def test_verify_names_the_index_of_a_label_without_class(tmp_path: Path) -> None:
    from shardfmt._dataset.verify import verify_dataset

    root = tmp_path / "ds"
    tar_dataset(root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["classes"] = ["a", "b"]
    (root / "manifest.json").write_text(json.dumps(manifest))
    problems = verify_dataset(root, quick=True).problems
    assert problems and all(type(p) is FormatError and "names no class" in p.message for p in problems)
    index = ShardReader(root / "shard-00000.tar.idx")
    label_column = index.dtype.fields["label"][1]
    assert problems[0].path == str(root / "shard-00000.tar.idx")
    assert problems[0].offset == index.table_offset + problems[0].record * index.dtype.itemsize + label_column
    index.close()
