"""Parquet files as the source of a conversion: one record per row, the encoded image in a column.

The layout is the Hugging Face Hub's: an image column that is binary, or a struct whose ``bytes``
field is binary (``{"bytes": ..., "path": ...}``), and a label column. Files are one ``.parquet``
file, a glob pattern of them (``data/train-*.parquet``; by URL, the pattern is in the file name),
or several files; they are read in the order of their paths, rows in file order. Local files are
read memory-mapped, stored ones through the store's range reads.

Columns (`ParquetColumns`): ``image`` by default; the label column as `columns.choose_label`
decides (records may have none); the key is the file's path without ``.parquet`` and the row
number in the file (``train-00000-of-00002/17``), or the value of a key column. Every further
column is kept as a field (`columns.further_columns`): then the scan names its fields
(`SourceScan.names_fields`).

Labels: an integer column gives the labels as they are; its class names come from the Hugging
Face features stored in the schema metadata (``huggingface``: a ``ClassLabel`` with ``names``)
where present, and a label outside them is "bad-label"; metadata that is there but malformed is
a `ConvertError` (its names cannot be told). Without such names the dataset has no class names.
A string column gives class names, sorted as plain strings, label = index.

Found while scanning and reported as rejects, never fatal: "no-label" (a null label, or -1
where the files name classes), "bad-label" (an empty class name, or an integer that names no
class), "null-value" and "bad-value" (a further column's value that does not fit its kind), "bad-key" (a null or
empty key), "corrupt" (a file that is not readable as Parquet). Found when the row is built:
"no-image" (a null image, or a struct without bytes), then every rule of an image file.
A missing column, or a column of the wrong type, is a `ConvertError`: it is the command that
is wrong, not a row.

Rows are planned without reading the images: a row's size is its share of its row group's
image column bytes, from the file's metadata; in a local row group whose every image is a path
(null ``bytes`` by the column statistics), the size of the file it names, from ``stat``, so
that shards are cut by the bytes read. A record is addressed by (file, row group, row);
a conversion reads one row group's images at a time (`rowgroups.RowGroupReader`), so row groups are the
unit of parallel reading. pyarrow is an optional dependency (``shardfmt[parquet]``).
"""

from __future__ import annotations

import bisect
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..._errors import ConvertError
from . import tablefiles
from .columns import choose_label, class_label_columns, column_kind, column_value, further_columns, value_problem
from .results import (
    IMAGE_AND_LABEL,
    RecordField,
    ScannedRecord,
    ScanReject,
    SourceFile,
    SourceScan,
    display_path,
    is_field_name,
    record_key,
)
from .tablefiles import ArrowBatch, ArrowFile, open_table, require_pyarrow
from .trees import Entry, LocalTree, Tree

__all__ = ["ParquetColumns", "scan_parquet"]


@dataclass(frozen=True)
class ParquetColumns:
    """Which columns of the Parquet files make a record.

    Attributes:
        image: the encoded image: binary, or a struct with a binary ``bytes`` field.
        label: an integer or string column; ``"none"`` (`columns.NO_LABEL`): no label; None:
            as `columns.choose_label` says.
        key: a column whose values are the record keys; None: file name and row number.
        image_root: the folder that relative image paths are resolved against (a row whose
            image is a ``path`` without ``bytes``); None: the folder of the row's file.
        fields: (column, kind or None) of further columns whose kind is declared.
        drop: further columns left out.
    """

    image: str = "image"
    label: str | None = None
    key: str | None = None
    image_root: str | None = None
    fields: tuple[tuple[str, str | None], ...] = ()
    drop: tuple[str, ...] = ()

    def to_options(self) -> dict[str, Any]:
        """How the manifest's ``converter.options`` records the columns (and the image root,
        declared kinds and dropped columns, if given)."""
        options: dict[str, Any] = {"image_column": self.image, "label_column": self.label, "key_column": self.key}
        if self.image_root is not None:
            options["image_root"] = self.image_root
        if self.fields:
            options["declared_fields"] = [list(item) for item in self.fields]
        if self.drop:
            options["drop_columns"] = list(self.drop)
        return options


def scan_parquet(tree: Tree, names: Sequence[str], *, columns: ParquetColumns) -> SourceScan:
    """Find the rows of Parquet files `names` (relative to `tree`), in order (see the module
    docstring): records of an image, a label if any, and each further column kept
    (`columns.further_columns`).

    Raises:
        ConvertError: pyarrow is missing; a file does not exist; a column is missing or of a
            type that cannot be an image, a label or a key; no label column is chosen among
            candidates; the files disagree on the label column's kind, its class names or
            their further columns.
    """
    require_pyarrow()
    rows: list[_Row] = []
    rejects: list[ScanReject] = []
    agreed = _Agreement()
    for name in names:
        entry = tree.lookup(name)
        where = tree.describe(name)
        if entry.reject is not None:
            raise ConvertError(f"cannot read the Parquet file: {entry.reject[1]}", path=where)
        try:
            parquet = open_table(tree, entry)
            schema = parquet.schema_arrow
        except (OSError, tablefiles.pa.ArrowException) as err:
            rejects.append(ScanReject(len(rows), display_path(name), "corrupt", f"not a readable Parquet file: {err}"))
            continue
        features = _features(schema, where)
        label = choose_label(tablefiles.pa, schema, chosen=columns.label, image=columns.image, key=columns.key,
                             class_labels=class_label_columns(features, schema.names), where=where)
        _check_columns(schema, columns, label, where)
        further = further_columns(schema, used=(columns.image, label, columns.key), drop=columns.drop,
                                  declared=[column for column, _ in columns.fields], where=where)
        agreed.check(schema, label, further, features, has_rows=bool(rows), where=where)
        local = os.fspath(tree.root) if isinstance(tree, LocalTree) else None
        _read_rows(parquet, name, entry, label=label, further=further, columns=columns, rows=rows, rejects=rejects, root=local)
    scan, values = _labelled(tree, rows, rejects, agreed)
    if not agreed.further:
        return scan
    return _field_scan(scan, values, agreed, columns)


_Row = tuple[SourceFile, Any, Any, str, tuple[Any, ...]]
"""A row found: (input without its label, label value, key value, where, values of further columns)."""


class _Agreement:
    """What the files of a source must agree on: the label column's kind and class names, and
    the further columns; and which further columns hold a null."""

    def __init__(self) -> None:
        self.label: tuple[str, str] | None = None  # (kind, the file that decided it)
        self.names: tuple[tuple[str, ...], str] | None = None
        self.further: list[str] = []
        self.types: dict[str, Any] = {}
        self.nulls: set[str] = set()
        self.further_from: str | None = None

    def check(self, schema: Any, label: str | None, further: list[str], features: dict[str, Any] | None, *, has_rows: bool,
              where: str) -> None:
        if label is None and self.label is not None:
            raise ConvertError(f"no label column, but {self.label[1]} has one", path=where)
        if label is not None and self.label is None and has_rows:
            raise ConvertError(f"column {label!r} holds labels here, but the files before have no label column", path=where)
        if self.further_from is not None and further != self.further:
            raise ConvertError(f"the further columns here are {', '.join(further) or 'none'}, in {self.further_from} "
                               f"{', '.join(self.further) or 'none'}: give files of one layout, or --drop-column", path=where)
        self.further, self.further_from = further, where
        self.types.update((column, schema.field(column).type) for column in further)
        if label is None:
            return
        kind = _label_kind(schema.field(label).type, label, where)
        if self.label is not None and kind != self.label[0]:
            raise ConvertError(f"column {label!r} holds {kind} labels here, {self.label[0]} labels in {self.label[1]}", path=where)
        self.label = (kind, where)
        hf_names = _class_names(features, label, where)
        if hf_names is not None:
            if self.names is not None and hf_names != self.names[0]:
                raise ConvertError(f"the class names of column {label!r} differ from those of {self.names[1]}", path=where)
            self.names = (hf_names, where)


def _read_rows(
    parquet: Any, name: str, entry: Entry, *, label: str | None, further: list[str], columns: ParquetColumns,
    rows: list[_Row], rejects: list[ScanReject], root: str | None,
) -> None:
    """Append each row of one file, row group by row group, with its label, key and further
    values (not yet checked); a row group that cannot be read is one reject. A row group whose
    every image is a path (`root`: the local folder the files lie in) is sized by the files."""
    wanted = [column for column in (label, columns.key, *further) if column is not None]
    metadata = parquet.metadata
    base = columns.image_root if columns.image_root is not None else os.path.dirname(os.path.join(root, name)) if root else None
    row = 0
    for group in range(metadata.num_row_groups):
        count = metadata.row_group(group).num_rows
        sizes = _row_sizes(metadata.row_group(group), columns.image, count)
        if base is not None and _all_paths(parquet, metadata.row_group(group), columns.image, count):
            sizes = _path_sizes(parquet, group, columns.image, base)
        try:
            table = parquet.read_row_group(group, columns=wanted) if wanted else None
        except (OSError, tablefiles.pa.ArrowException) as err:
            detail = f"row group {group} (rows {row} to {row + count - 1}) cannot be read: {err}"
            rejects.append(ScanReject(len(rows), display_path(name), "corrupt", detail))
            row += count
            continue
        labels = table.column(label).to_pylist() if table is not None and label is not None else [0] * count
        keys = table.column(columns.key).to_pylist() if table is not None and columns.key is not None else [None] * count
        columns_read = [table.column(column).to_pylist() for column in further] if table is not None else []
        values = list(zip(*columns_read, strict=True)) if columns_read else [()] * count
        for n in range(count):
            key = keys[n] if columns.key is not None else f"{record_key(name)}/{row + n}"
            item = SourceFile(name, sizes[n], entry.version, offset=n, sample_key=None if key is None else str(key),
                              row_group=group, file_size=entry.size)
            rows.append((item, labels[n], key, f"row {row + n} (row group {group})", tuple(values[n])))
        row += count


def _labelled(tree: Tree, rows: list[_Row], found: list[ScanReject], agreed: _Agreement) -> tuple[SourceScan, list[tuple[Any, ...]]]:
    """Give each row its label (or reject it), merging the rejects found on the way in input
    order; and the further values of each input."""
    kind = agreed.label[0] if agreed.label is not None else None
    classes: tuple[str, ...] | None = agreed.names[0] if agreed.names is not None else None
    hub_names = classes is not None
    if kind == "string":
        classes = tuple(sorted({value for _, value, _, _, _ in rows if isinstance(value, str) and value}))
    index = {name: n for n, name in enumerate(classes)} if kind == "string" and classes is not None else {}
    inputs: list[ScannedRecord] = []
    values: list[tuple[Any, ...]] = []
    rejects: list[ScanReject] = []
    pending = iter(found)
    upcoming = next(pending, None)
    for position, (item, value, key, where, further) in enumerate(rows):
        while upcoming is not None and upcoming.position <= position:
            rejects.append(ScanReject(len(inputs), upcoming.path, upcoming.reason, upcoming.detail, upcoming.key))
            upcoming = next(pending, None)
        shown = display_path(item.sample_key) if item.sample_key is not None else None
        problem = _row_problem(item, value, key, where, kind=kind, classes=classes, hub_names=hub_names)
        if problem is None and kind == "string":
            value = index[value]
        if problem is not None:
            rejects.append(ScanReject(len(inputs), display_path(item.path), *problem, key=shown))
            continue
        inputs.append(ScannedRecord((item,), (int(value),) if kind is not None else (), item.key))
        values.append(further)
    while upcoming is not None:
        rejects.append(ScanReject(len(inputs), upcoming.path, upcoming.reason, upcoming.detail, upcoming.key))
        upcoming = next(pending, None)
    fields = IMAGE_AND_LABEL if kind is not None else IMAGE_AND_LABEL[:1]
    scan = SourceScan(tree.root, "parquet", fields, classes, tuple(inputs), tuple(rejects))
    return scan, values


def _row_problem(item: SourceFile, value: Any, key: Any, where: str, *, kind: str | None, classes: tuple[str, ...] | None,
                 hub_names: bool) -> tuple[str, str] | None:
    """(reason, detail) if a row cannot be a record for its key or label, else None."""
    if item.sample_key is None or item.sample_key == "":
        return "bad-key", f"{where}: the key is {'null' if key is None else 'empty'}"
    if kind is None:
        return None
    if value is None:
        return "no-label", f"{where}: the label is null"
    if kind == "string":
        return ("bad-label", f"{where}: the class name is empty") if value == "" else None
    if hub_names and value == -1:
        return "no-label", (f"{where}: the label is -1, the Hugging Face mark of an example without a label; "
                            "--label-column none (label_column='none') converts the records without labels")
    if classes is not None and not 0 <= value < len(classes):
        return "bad-label", f"{where}: label {value} names no class (the files name {len(classes)} classes)"
    if not -(1 << 63) <= value < 1 << 63:
        return "bad-label", f"{where}: label {value} does not fit in int64"
    return None


def _field_scan(scan: SourceScan, values: list[tuple[Any, ...]], agreed: _Agreement, columns: ParquetColumns) -> SourceScan:
    """The records of a scan with further columns: the image, the label if any, then each
    further column as a field of its kind (`columns.column_kind`); a value that does not fit
    its kind rejects its record."""
    declared = dict(columns.fields)
    nulls = {column for n, column in enumerate(agreed.further) if any(row[n] is None for row in values)}
    kinds = [column_kind(tablefiles.pa, agreed.types[column], declared=declared.get(column), has_null=column in nulls, name=column,
                         where=agreed.further_from or "") for column in agreed.further]
    fields = scan.fields + tuple(RecordField(column, kind) for column, kind in zip(agreed.further, kinds, strict=True))
    taken = ("image", "label", "key")  # a column named label is never a field of another meaning
    clash = next((column for column in agreed.further if column in taken or not is_field_name(column)), None)
    if clash is not None:
        use = f"take it as the keys with --key-column {clash} (key_column=), or " if clash == "key" else ""
        raise ConvertError(f"column {clash!r} cannot be a field (a name taken by the record, or not an identifier of 1 to 64 "
                           f"characters): {use}leave it out with --drop-column {clash} (drop_columns=)", path=agreed.further_from)
    inputs: list[ScannedRecord] = []
    found: list[tuple[float, ScanReject]] = []  # (place among the inputs, reject)
    for position, (record, found_row) in enumerate(zip(scan.inputs, values, strict=True)):
        row = tuple(column_value(v, k) for v, k in zip(found_row, kinds, strict=True))
        problem = next((found for found in (value_problem(v, k, c) for v, k, c in zip(row, kinds, agreed.further, strict=True))
                        if found is not None), None)
        if problem is not None:
            found.append((position, ScanReject(0, display_path(record.files[0].path), *problem, key=record.key)))
            continue
        inputs.append(ScannedRecord(record.files, record.values + row, record.key))
    found.extend((reject.position - 0.5, reject) for reject in scan.rejects)
    dropped = sorted(place for place, reject in found if place == int(place))
    rejects = [ScanReject(math.ceil(place) - bisect.bisect_left(dropped, place), r.path, r.reason, r.detail, r.key)
               for place, r in sorted(found, key=lambda pair: pair[0])]
    return SourceScan(scan.root, "parquet", fields, scan.classes, tuple(inputs), tuple(rejects), names_fields=True)


def _check_columns(schema: Any, columns: ParquetColumns, label: str | None, where: str) -> None:
    types = tablefiles.pa.types
    for role, column in (("image", columns.image), ("label", label), ("key", columns.key)):
        if column is not None and column not in schema.names:
            raise ConvertError(f"no {role} column {column!r}; the file's columns are {', '.join(schema.names)}", path=where)
    kind = schema.field(columns.image).type
    if not (_is_binary(kind) or (types.is_struct(kind) and kind.get_field_index("bytes") >= 0 and _is_binary(kind.field("bytes").type))):
        raise ConvertError(
            f"column {columns.image!r} holds {kind}; an image column is binary, or a struct with a binary "
            "'bytes' field (as Hugging Face writes it)",
            path=where,
        )
    if columns.key is not None:
        key_type = schema.field(columns.key).type
        if not (types.is_string(key_type) or types.is_large_string(key_type) or types.is_integer(key_type)):
            raise ConvertError(f"key column {columns.key!r} holds {key_type}; a key column holds strings or integers", path=where)


def _is_binary(kind: Any) -> bool:
    return bool(tablefiles.pa.types.is_binary(kind) or tablefiles.pa.types.is_large_binary(kind))


def _label_kind(kind: Any, column: str, where: str) -> str:
    """ "integer" or "string": what the label column holds (a dictionary column by its values)."""
    if tablefiles.pa.types.is_dictionary(kind):
        kind = kind.value_type
    if tablefiles.pa.types.is_integer(kind):
        return "integer"
    if tablefiles.pa.types.is_string(kind) or tablefiles.pa.types.is_large_string(kind):
        return "string"
    raise ConvertError(f"label column {column!r} holds {kind}; a label column holds integers or strings (class names)", path=where)


def _features(schema: Any, where: str) -> dict[str, Any] | None:
    """The Hugging Face features in the schema metadata (``huggingface``), or None without any.

    Raises:
        ConvertError: the metadata is there but malformed (not JSON, or no mapping of features).
    """
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return None
    try:
        info = json.loads(raw)
    except ValueError as err:
        raise ConvertError(f"the Hugging Face metadata (schema metadata 'huggingface') is not JSON ({err}): {_FIX}", path=where) from None
    features = info.get("info", {}).get("features", {}) if isinstance(info, dict) and isinstance(info.get("info", {}), dict) else None
    if not isinstance(features, dict):
        raise ConvertError(f"the Hugging Face metadata holds no mapping of features: {_FIX}", path=where)
    return features


_FIX = "fix the metadata, or write the files without it to take the labels as plain integers"


def _class_names(features: dict[str, Any] | None, column: str, where: str) -> tuple[str, ...] | None:
    """The class names the Hugging Face features give `column`, if any.

    Raises:
        ConvertError: a ``ClassLabel`` whose ``names`` are not a list of distinct non-empty
            strings: without its names, labels outside them would be taken as they are.
    """
    feature = (features or {}).get(column)
    if not isinstance(feature, dict) or feature.get("_type") != "ClassLabel":
        return None
    names = feature.get("names")
    if (
        not isinstance(names, list)
        or not names
        or not all(isinstance(name, str) and name for name in names)
        or len(set(names)) != len(names)
    ):
        raise ConvertError(
            f"the Hugging Face ClassLabel of column {column!r} has names {names!r}, not a list of distinct non-empty strings: {_FIX}",
            path=where,
        )
    return tuple(names)


def _row_sizes(group: Any, image: str, count: int) -> list[int]:
    """Each row's share of the image column's bytes in row group `group` (from metadata only)."""
    total = 0
    if isinstance(group, ArrowBatch):
        total = group.image_bytes(image)
    for n in range(0 if isinstance(group, ArrowBatch) else group.num_columns):
        chunk = group.column(n)
        if chunk.path_in_schema in (image, f"{image}.bytes"):
            total += int(chunk.total_uncompressed_size)
    share, extra = divmod(total, max(count, 1))
    return [share + (1 if n < extra else 0) for n in range(count)]


def _all_paths(parquet: Any, group: Any, image: str, count: int) -> bool:
    """True if every image of a row group is a struct whose bytes are null (a path names it),
    from the metadata: the statistics' null count of the column's ``bytes`` child, or an Arrow batch's."""
    field = parquet.schema_arrow.field(image)
    if not tablefiles.pa.types.is_struct(field.type) or field.type.get_field_index("path") < 0 or count == 0:
        return False
    if isinstance(group, ArrowBatch):
        column = group.batch.column(image)
        return bool(column.null_count == 0 and column.field("bytes").null_count == count)
    for n in range(group.num_columns):
        chunk = group.column(n)
        if chunk.path_in_schema == f"{image}.bytes":
            stats = chunk.statistics
            return bool(stats is not None and stats.has_null_count and stats.null_count == count)
    return False


def _path_sizes(parquet: Any, group: int, image: str, base: str) -> list[int]:
    """The size of the file each row's path names, resolved against `base` (0 where there is
    none: the row is rejected when built). Reads only the path strings."""
    if isinstance(parquet, ArrowFile):
        paths = parquet.row_group(group).batch.column(image).field("path").to_pylist()
    else:
        paths = parquet.read_row_group(group, columns=[f"{image}.path"]).column(image).combine_chunks().field("path").to_pylist()
    sizes = []
    for path in paths:
        try:
            sizes.append(os.stat(os.path.join(base, path)).st_size if isinstance(path, str) and "\x00" not in path else 0)
        except OSError:
            sizes.append(0)
    return sizes


