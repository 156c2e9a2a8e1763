"""convert: one record model. Every source's scan is records of named, typed fields, one plan
and one record builder take them all, and image classification is one set of fields among
others: its schema, the tar schema's order and a reject's detail follow from the fields and the
scan, not from a second pipeline."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import jpeg_bytes
from converting import convert

from shardfmt import open_dataset
from shardfmt._convert.plan import InputFile, PlannedRecord, from_scan, record_schema
from shardfmt._convert.records import Chunk, InputReader, RecordBuilder, build_chunk
from shardfmt._convert.sources import scan_fields, scan_source
from shardfmt._convert.sources.results import IMAGE_AND_LABEL, RecordField, SourceScan
from shardfmt._synthetic import make_imagefolder
from shardfmt.format._schema import IMAGE_CLASSIFICATION, tar_schema

CAPTION = RecordField("txt", "str", member=True)


def write_tar(path: Path) -> Path:
    """Three samples of a JPEG, a .cls label and a .txt caption."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for n in range(3):
            for ext, data in {"jpg": jpeg_bytes(8, 8, seed=n), "cls": str(n).encode(), "txt": f"caption {n}".encode()}.items():
                info = tarfile.TarInfo(f"s{n}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def write_parquet(path: Path) -> Path:
    """Two rows of encoded image bytes, an int label and a caption."""
    table = pa.table({"image": [jpeg_bytes(8, 8, seed=n) for n in range(2)], "label": [0, 1], "caption": ["a", "b"]})
    pq.write_table(table, path)
    return path


def test_every_source_kind_is_a_scan_of_named_typed_fields(tmp_path: Path) -> None:
    tree = make_imagefolder(tmp_path / "tree", num_classes=2, per_class=2, size=(8, 8), seed=1)
    (tmp_path / "list.csv").write_text("path,label\ntree/class_000/img_00000.JPEG,0\n")
    pairs = [make_imagefolder(tmp_path / side, num_classes=1, per_class=2, size=(8, 8), seed=2) for side in ("lo", "hi")]
    scans: dict[str, SourceScan] = {
        "imagefolder": scan_source(tree),
        "listing": scan_source(tmp_path / "list.csv"),
        "tars": scan_source(write_tar(tmp_path / "caps.tar")),
        "parquet": scan_source(write_parquet(tmp_path / "table.parquet")),
        "folders": scan_fields(pairs, store="raw"),
        "imagefolder as raw": scan_fields([tree], store="raw"),
    }
    found = {name: (scan.fields, scan.names_fields) for name, scan in scans.items()}
    assert found == {
        "imagefolder": (IMAGE_AND_LABEL, False),
        "listing": (IMAGE_AND_LABEL, False),
        "tars": (IMAGE_AND_LABEL + (CAPTION,), False),
        "parquet": (IMAGE_AND_LABEL + (RecordField("caption", "str"),), True),
        "folders": ((RecordField("lo", "raw"), RecordField("hi", "raw")), True),
        "imagefolder as raw": ((RecordField("image", "raw"), RecordField("label", "label")), True),
    }
    tar_record = scans["tars"].inputs[1]
    assert (len(tar_record.files), tar_record.values, tar_record.key) == (2, (1,), "s1")  # the image, then the member
    assert [record.values for record in scans["imagefolder"].inputs] == [(0,), (0,), (1,), (1,)]


def test_the_schema_follows_from_the_fields() -> None:
    assert record_schema(IMAGE_AND_LABEL) == IMAGE_CLASSIFICATION
    assert record_schema(IMAGE_AND_LABEL + (CAPTION,)) == tar_schema(labelled=True, members=(("txt", "str"),))  # key, then members
    assert record_schema(IMAGE_AND_LABEL[:1] + (CAPTION,)) == tar_schema(labelled=False, members=(("txt", "str"),))
    assert record_schema(IMAGE_AND_LABEL + (RecordField("caption", "str"),)).names == ("image", "label", "caption", "key")
    pixels = record_schema((RecordField("lo", "raw"), RecordField("hi", "mask")))
    assert [(f.name, f.type) for f in pixels.fields] == [("lo", "raw"), ("hi", "raw"), ("key", "str")]


def test_a_tar_source_planned_for_tar_shards_keeps_its_sample_keys_and_labels(tmp_path: Path) -> None:
    scan = scan_source(write_tar(tmp_path / "caps.tar"))
    plan = from_scan(scan, source="caps.tar", root=str(scan.root), options={"shard_size": 1 << 20}, shard_format="tar")
    assert [(r.key, r.values, r.sample_key, len(r.files)) for r in plan.records] == [(f"s{n}", (n,), f"s{n}", 2) for n in range(3)]
    assert (plan.label_index, plan.stats) == (0, {"members_not_stored": {}})


def test_one_builder_names_the_field_in_a_reject_only_when_the_fields_were_asked_for_by_name(tmp_path: Path) -> None:
    (tmp_path / "bad.jpg").write_bytes(b"not an image at all")
    (tmp_path / "good.jpg").write_bytes(jpeg_bytes(8, 8))
    records = ((0, PlannedRecord((InputFile("bad.jpg", 19, 0),), "bad", (3,))),
               (1, PlannedRecord((InputFile("good.jpg", 1, 0),), "good", (3,))))
    details = {}
    for names_fields in (False, True):
        builder = RecordBuilder(InputReader(str(tmp_path)), IMAGE_AND_LABEL, None, 90, names_fields=names_fields)
        bad, good = build_chunk(builder, Chunk(0, records))
        assert good.fields is not None and (good.fields["label"], good.fields["key"], good.reencoded) == (3, "good", (None,))
        assert bad.reject is not None and bad.reject[0] == "not-an-image"
        details[names_fields] = bad.reject[1]
    assert details[True] == f"field 'image': {details[False]}"


def test_tars_stored_as_pixels_keep_their_members_and_have_no_label_field_without_labels(tmp_path: Path) -> None:
    """Tars read for fields asked for by name (here ``store="raw"``) give the fields the tars
    have: the members stay, and unlabelled samples get no label (the old second pipeline dropped
    the members and wrote a label of -1)."""
    with tarfile.open(tmp_path / "plain.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for n in range(2):
            for ext, data in {"jpg": jpeg_bytes(8, 8, seed=n), "txt": f"caption {n}".encode()}.items():
                info = tarfile.TarInfo(f"s{n}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    labelled = convert(write_tar(tmp_path / "caps.tar"), tmp_path / "labelled", store="raw", workers=1)
    plain = convert(tmp_path / "plain.tar", tmp_path / "plain", store="raw", workers=1)
    assert labelled.manifest.schema.names == ("image", "label", "key", "txt")
    assert plain.manifest.schema.names == ("image", "key", "txt")
    with open_dataset(tmp_path / "plain") as dataset:
        assert [(dataset[n]["key"], dataset[n]["txt"], dataset[n]["image"].shape) for n in range(2)] == [
            ("s0", "caption 0", (8, 8, 3)), ("s1", "caption 1", (8, 8, 3))]
