"""What a dataset holds, from its manifest and record tables alone (no payload is read), local
or by URL (two range reads per shard)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ManifestError
from .._storage import RemoteOptions
from ..format._layout import column_name
from .locate import locate_dataset
from .reader import open_located_shard

__all__ = ["DatasetSummary", "summarise_dataset"]


@dataclass(frozen=True)
class DatasetSummary:
    """Counts and image-size distribution of a dataset.

    Attributes:
        path: the dataset root (for a URL: the URL, without credentials).
        num_records, num_shards, num_bytes: from the manifest.
        classes: class names, or None.
        height, width: (min, median, max) of the first image field, or None without records.
        channels: number of images per channel count.
        records_per_class: (min, median, max) records of a class, or None without classes.
        rejects: rejected inputs per reason, as the converter counted them.
        stats: the converter's statistics from the manifest (pass-through, re-encodes, members
            of tars not stored, per extension, ...).
        fields: (name, type) of each field of the schema.
    """

    path: Path | str
    num_records: int
    num_shards: int
    num_bytes: int
    classes: list[str] | None
    height: tuple[int, float, int] | None
    width: tuple[int, float, int] | None
    channels: dict[int, int]
    records_per_class: tuple[int, float, int] | None
    rejects: dict[str, int] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    fields: tuple[tuple[str, str], ...] = ()


def summarise_dataset(path: str | os.PathLike[str], *, remote: RemoteOptions | None = None) -> DatasetSummary:
    """Summarise a dataset from its manifest and the record table of each shard.

    Args:
        path: the dataset root or its manifest.json, a local path or a URL (``s3://...``).
        remote: credentials and retries for a URL.

    Returns:
        A `DatasetSummary`.

    Raises:
        DatasetNotFoundError, ManifestError: no valid manifest, or a shard's schema differs from it.
        FormatError, ShardNotFoundError: a shard is missing or breaks a structural rule.
        RemoteError: the store failed.
    """
    location = locate_dataset(path, remote=remote)
    manifest = location.load_manifest()
    image = next((f.name for f in manifest.schema.fields if f.kind.is_image), None)
    columns: dict[str, list[np.ndarray[Any, Any]]] = {"height": [], "width": [], "channels": [], "label": []}
    for entry in manifest.shards:
        with open_located_shard(location, entry, manifest.schema, verify=False) as reader:
            if reader.schema != manifest.schema:
                raise ManifestError(f"shard {entry.path} has a schema that differs from the manifest's", path=location.manifest_path)
            reader.check_all()
            if image is not None:
                for name in ("height", "width", "channels"):
                    columns[name].append(np.array(reader.table[column_name(image, name)]))
            if "label" in reader.schema.names:
                columns["label"].append(np.array(reader.table["label"]))
    joined = {name: np.concatenate(parts) if parts else np.zeros(0, np.int64) for name, parts in columns.items()}
    channels, counts = np.unique(joined["channels"], return_counts=True)
    per_class = None
    if manifest.classes:
        labels = joined["label"]
        valid = labels[(labels >= 0) & (labels < len(manifest.classes))].astype(np.int64)
        per_class = _spread(np.bincount(valid, minlength=len(manifest.classes)))
    by_reason = manifest.rejects.get("by_reason")
    return DatasetSummary(
        path=location.root,
        num_records=manifest.num_records,
        num_shards=len(manifest.shards),
        num_bytes=manifest.num_bytes,
        classes=manifest.classes,
        height=_spread(joined["height"]),
        width=_spread(joined["width"]),
        channels={int(c): int(n) for c, n in zip(channels, counts, strict=True)},
        records_per_class=per_class,
        rejects=dict(by_reason) if isinstance(by_reason, dict) else {},
        stats=dict(manifest.stats),
        fields=tuple((field.name, field.spec) for field in manifest.schema.fields),
    )


def _spread(values: np.ndarray[Any, Any]) -> tuple[int, float, int] | None:
    if not len(values):
        return None
    return int(values.min()), float(np.median(values)), int(values.max())
