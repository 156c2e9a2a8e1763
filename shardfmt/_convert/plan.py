"""The plan of a conversion: typed, frozen, and stored as ``.shardfmt-work/plan.json`` before any
shard is written, so that a resumed run can prove it does the same job.

A plan holds every record to write (the files it is made of, its values and key), the
rejects found while scanning, and how records are cut into shards. It is built once from a scan
(`from_scan`), whatever the source and the output, and everything after it reads only the plan.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from .._errors import ConvertError
from ..format._layout import MAX_RECORDS_PER_SHARD
from ..format._schema import Field, Schema
from .sources.results import RecordField, ScanReject, SourceScan, display_path

__all__ = ["FIELD_TYPES", "PLAN_VERSION", "ConversionPlan", "InputFile", "PlannedRecord", "ScanReject", "compare_plans", "from_scan",
           "plan_shards", "record_schema"]

PLAN_VERSION: Final = 4


@dataclass(frozen=True)
class InputFile:
    """One file a record is read from: its path relative to the plan's root ('/'-separated in a
    store), size and mtime when planned, and for the image member of a sample of a tar the
    offset of its data in the tar.

    A row of a Parquet file is addressed by (file, row group, row): `row_group` is its row
    group, `offset` its row within that group, `file_size` the size of the whole file (a store
    needs it to read the footer; with the mtime it also tells resume that the file changed),
    and `size` the row's share of its row group's image bytes."""

    path: str
    size: int
    mtime_ns: int
    offset: int | None = None
    row_group: int | None = None
    file_size: int | None = None

    def to_json(self) -> list[Any]:
        if self.row_group is not None:
            return [self.path, self.size, self.mtime_ns, self.offset, self.row_group, self.file_size]
        return [self.path, self.size, self.mtime_ns, *([self.offset] if self.offset is not None else [])]

    @classmethod
    def from_json(cls, value: Sequence[Any]) -> InputFile:
        if len(value) > 4:
            return cls(value[0], value[1], value[2], value[3], value[4], value[5])
        return cls(value[0], value[1], value[2], value[3] if len(value) > 3 else None)


@dataclass(frozen=True)
class PlannedRecord:
    """One record to write: its files (the first is the reference that names it: its images,
    then its members of a tar), its key, the values of its value fields (a label among them, as
    `ConversionPlan.label_index` says), and for a sample of a tar or a keyed row the sample's
    own key."""

    files: tuple[InputFile, ...]
    key: str
    values: tuple[Any, ...] = ()
    sample_key: str | None = None

    @property
    def path(self) -> str:
        return self.files[0].path

    @property
    def size(self) -> int:
        files = self.files
        return files[0].size if len(files) == 1 else sum(f.size for f in files)

    def to_json(self) -> list[Any]:
        item: list[Any] = [[f.to_json() for f in self.files], self.key]
        if self.values or self.sample_key is not None:
            item.append([_json_value(v) for v in self.values])
        if self.sample_key is not None:
            item.append(self.sample_key)
        return item

    @classmethod
    def from_json(cls, value: Sequence[Any]) -> PlannedRecord:
        files = tuple(InputFile.from_json(f) for f in value[0])
        values = tuple(_python_value(v) for v in value[2]) if len(value) > 2 else ()
        return cls(files, value[1], values, value[3] if len(value) > 3 else None)


@dataclass(frozen=True)
class ConversionPlan:
    """Everything a conversion will do.

    Attributes:
        kind: the source's kind, recorded in the manifest ("imagefolder", "listing", "tars", ...).
        source: how the plan names the source(s): resolved paths or URLs without credentials.
        root: what input paths are relative to: a local folder or a URL.
        shard_format: "binary" or "tar".
        schema: the records' fields.
        options: the conversion options, recorded in the manifest under ``converter.options``.
        fields: the records' fields as the scan found them (`sources.results.RecordField`).
        names_fields: the fields were asked for by name (`sources.results.SourceScan.names_fields`):
            a reject's detail names the field whose file it concerns.
        scales: per image field, its size as a multiple of the first's (None: unchecked).
        patch: the side of the square every image is cut to, or None.
        classes: class names in label order, or None.
        records: the records, in output order.
        scan_rejects: inputs refused while scanning.
        shards: [start, stop) record ranges, one per shard.
        stats: what the scan counted for the manifest's ``stats`` (members of tars not stored).
    """

    kind: str
    source: str | tuple[str, ...]
    root: str
    shard_format: str
    schema: Schema
    options: Mapping[str, Any]
    fields: tuple[RecordField, ...]
    classes: tuple[str, ...] | None
    records: tuple[PlannedRecord, ...]
    scan_rejects: tuple[ScanReject, ...]
    shards: tuple[tuple[int, int], ...]
    stats: Mapping[str, Any] = field(default_factory=dict)
    names_fields: bool = False
    scales: tuple[int | None, ...] = (1,)
    patch: int | None = None

    @property
    def input_bytes(self) -> int:
        return sum(record.size for record in self.records)

    @property
    def label_index(self) -> int | None:
        """Where a record's label (its field of kind "label") is among its values; None: the
        records have no label."""
        values = [f for f in self.fields if not f.is_image and not f.member]
        return next((n for n, f in enumerate(values) if f.kind == "label"), None)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON values (what plan.json holds)."""
        return {
            "version": PLAN_VERSION,
            "kind": self.kind,
            "source": list(self.source) if isinstance(self.source, tuple) else self.source,
            "root": self.root,
            "shard_format": self.shard_format,
            "schema": self.schema.to_json(),
            "options": dict(self.options),
            "fields": [[f.name, f.kind, *(["member"] if f.member else [])] for f in self.fields],
            "names_fields": self.names_fields,
            "scales": list(self.scales),
            "patch": self.patch,
            "classes": list(self.classes) if self.classes is not None else None,
            "records": [record.to_json() for record in self.records],
            "scan_rejects": [[r.position, r.path, r.reason, r.detail, *([r.key] if r.key is not None else [])] for r in self.scan_rejects],
            "shards": [list(span) for span in self.shards],
            "stats": dict(self.stats),
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> ConversionPlan:
        """Rebuild a plan from `to_dict`'s output.

        Raises:
            KeyError, TypeError, ValueError: `value` is not such a plan.
        """
        if value["version"] != PLAN_VERSION:
            raise ValueError(f"plan version {value['version']}, expected {PLAN_VERSION}")
        source = value["source"]
        return cls(
            kind=value["kind"],
            source=tuple(source) if isinstance(source, list) else source,
            root=value["root"],
            shard_format=value["shard_format"],
            schema=Schema.from_json(value["schema"]),
            options=value["options"],
            fields=tuple(RecordField(f[0], f[1], member=f[2:] == ["member"]) for f in value["fields"]),
            classes=tuple(value["classes"]) if value["classes"] is not None else None,
            records=tuple(PlannedRecord.from_json(r) for r in value["records"]),
            scan_rejects=tuple(ScanReject(*r) for r in value["scan_rejects"]),
            shards=tuple((s[0], s[1]) for s in value["shards"]),
            stats=value.get("stats", {}),
            names_fields=value["names_fields"],
            scales=tuple(value["scales"]),
            patch=value["patch"],
        )


def plan_shards(sizes: Sequence[int], *, shard_size: int, max_records: int = MAX_RECORDS_PER_SHARD) -> list[tuple[int, int]]:
    """Cut consecutive records into shards by their input sizes.

    Args:
        sizes: input bytes of each record, in output order.
        shard_size: a shard takes records until their sizes add up to at least this.
        max_records: and at most this many records.

    Returns:
        [start, stop) record ranges, one per shard, covering every record.
    """
    spans: list[tuple[int, int]] = []
    start = total = 0
    for i, size in enumerate(sizes):
        total += size
        if total >= shard_size or i + 1 - start >= max_records:
            spans.append((start, i + 1))
            start, total = i + 1, 0
    if start < len(sizes):
        spans.append((start, len(sizes)))
    return spans


FIELD_TYPES: Final = {"jpeg": "jpeg", "int64": "int64", "label": "int64", "float64": "float64", "str": "str", "bytes": "bytes",
                      "json": "json"}
"""Format type of each field kind; the other image kinds are "raw"."""


def record_schema(fields: Sequence[RecordField]) -> Schema:
    """The schema of records of `fields`: each in its format type, the key after every field
    but the members of tars, which follow it (spec/tar.md: image, label, key, then members)."""
    def typed(found: RecordField) -> Field:
        return Field(found.name, FIELD_TYPES.get(found.kind, "raw"))

    return Schema(tuple(typed(f) for f in fields if not f.member) + (Field("key", "str"),) + tuple(typed(f) for f in fields if f.member))


def from_scan(
    scan: SourceScan, *, source: str | tuple[str, ...], root: str, options: Mapping[str, Any], shard_format: str,
    scales: tuple[int | None, ...] = (1,), patch: int | None = None,
) -> ConversionPlan:
    """The plan of a conversion of `scan`, whatever its source and fields.

    A record's key is the scan's; a sample of a tar or a keyed row keeps its own key for a tar
    shard (exact there, where `tar.keys.tar_key` checks it; with ``\\xNN`` escapes in a binary
    shard).
    """
    records = []
    for item in scan.inputs:
        files = tuple(InputFile(f.path, f.size, f.mtime_ns, f.offset, f.row_group, f.file_size) for f in item.files)
        sample_key = item.files[0].sample_key
        key = sample_key if shard_format == "tar" and sample_key is not None else item.key
        records.append(PlannedRecord(files, key, tuple(item.values), sample_key))
    return ConversionPlan(
        kind=scan.kind,
        source=source,
        root=root,
        shard_format=shard_format,
        schema=record_schema(scan.fields),
        options=dict(options),
        fields=scan.fields,
        classes=tuple(scan.classes) if scan.classes is not None else None,
        records=tuple(records),
        scan_rejects=tuple(ScanReject(r.position, r.path, r.reason, r.detail, r.key) for r in scan.rejects),
        shards=tuple(plan_shards([r.size for r in records], shard_size=options["shard_size"])),
        stats={"members_not_stored": dict(scan.not_stored)} if scan.kind == "webdataset" else {},
        names_fields=scan.names_fields,
        scales=scales,
        patch=patch,
    )


def compare_plans(stored: Any, plan: ConversionPlan, *, where: str | os.PathLike[str]) -> None:
    """Refuse to resume when the stored plan is not `plan`, saying what changed.

    Raises:
        ConvertError: the inputs or options changed since the interrupted run started.
    """
    now = plan.to_dict()
    if stored == json.loads(plan.to_bytes()):
        return
    if not isinstance(stored, dict):
        stored = {}
    for key in ("version", "source", "kind", "shard_format", "options", "classes", "schema", "fields", "names_fields", "scales", "patch"):
        if stored.get(key) != now[key]:
            change = f"{key} changed from {_short(stored.get(key))} to {_short(now[key])}"
            break
    else:
        before = {_reference(item): item for item in stored.get("records", []) if _reference(item) is not None}
        after = {_reference(item): item for item in now["records"]}
        changed = [p for p in after if p not in before or before[p] != after[p]] + [p for p in before if p not in after]
        first = f" (first: {display_path(str(changed[0]))})" if changed else ""
        change = f"{len(changed)} input files were added, removed or modified{first}"
    raise ConvertError(f"cannot resume: {change} since the conversion started; use overwrite=True to start again", path=where)


def _reference(item: Any) -> str | None:
    try:
        return str(item[0][0][0]) + ("" if len(item) < 4 else f"#{item[3]}")
    except (TypeError, IndexError, KeyError):
        return None


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _json_value(value: Any) -> Any:
    """A value as the plan stores it: floats as their exact hex form, so that a NaN compares
    equal to itself when a resumed run checks the plan; bytes in base64; a JSON value (a list,
    a mapping, null) wrapped, so that it never reads as one of those."""
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, bytes):
        return {"bytes": base64.b64encode(value).decode("ascii")}
    if value is None or isinstance(value, (list, dict)):
        return {"json": value}
    return value


def _python_value(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if "float" in value:
        return float.fromhex(value["float"])
    if "bytes" in value:
        return base64.b64decode(value["bytes"])
    return value["json"]

