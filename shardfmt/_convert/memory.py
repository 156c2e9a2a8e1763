"""Sources held in memory, made sources on disk for the one conversion entry: a
``datasets.Dataset`` is recognised by type (`is_hf_dataset`, without importing ``datasets``)
and saved with ``save_to_disk``; an iterable of records is written as image files and a
``records.jsonl`` listing (`spill_records`), each image value made encoded bytes
(`image_bytes`). A ``DatasetDict`` is recognised (`is_hf_dataset_dict`) to be refused with its
splits."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .._errors import ConvertError, RejectError
from .sources import SOURCE_KINDS
from .sources.confine import read_regular

__all__ = ["image_bytes", "is_hf_dataset", "is_hf_dataset_dict", "spill_records"]


def is_hf_dataset_dict(value: Any) -> bool:
    """True for a ``datasets.DatasetDict`` (checked by type, so ``datasets`` need not be installed)."""
    return any(cls.__module__.startswith("datasets.") and cls.__name__ in ("DatasetDict", "IterableDatasetDict")
               for cls in type(value).__mro__)


def is_hf_dataset(value: Any) -> bool:
    """True for a ``datasets.Dataset`` (checked by type, so ``datasets`` need not be installed)."""
    return any(cls.__module__.startswith("datasets.") and cls.__name__ == "Dataset" for cls in type(value).__mro__)


def spill_records(records: Iterable[Mapping[str, Any]], folder: Path, declared: list[Any]) -> tuple[list[str], list[Any]]:
    """Write records held in memory as image files and a listing ``records.jsonl`` in `folder`;
    return the listing as the source, and the declared kinds with those of its str columns."""
    lines: list[str] = []
    kinds: dict[str, str] = {}
    names: list[str] | None = None
    for number, record in enumerate(records):
        if not isinstance(record, Mapping) or "image" not in record:
            raise ConvertError(f"record {number} is not a mapping with an 'image'; a source is {SOURCE_KINDS}")
        if names is None:
            names = list(record)
        elif list(record) != names:
            raise ConvertError(f"record {number} has the fields {', '.join(record)}, record 0 has {', '.join(names)}")
        data = image_bytes(record["image"], number)
        key = record.get("key", f"{number:09d}")
        if not isinstance(key, str) or not key or key.startswith("/") or any(p in ("", ".", "..") for p in key.split("/")) or "\x00" in key:
            raise ConvertError(f"record {number}: key {key!r} is not a relative path without '.' or '..' parts")
        path = folder / "records" / (key + ".img")
        path.parent.mkdir(parents=True, exist_ok=True)
        if data is not None:  # else the listing names a file that is not there: a "missing-file" reject
            path.write_bytes(data)
        row: dict[str, Any] = {"path": f"{key}.img"}
        for name, value in record.items():
            if name in ("image", "key"):
                continue
            if isinstance(value, str) and name != "label":
                kinds[name] = "str"
            elif not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ConvertError(f"record {number}: field {name!r} is {type(value).__name__}; further values are str, int or float")
            row[name] = value
        lines.append(json.dumps(row, ensure_ascii=False))
    (folder / "records").mkdir(exist_ok=True)
    (folder / "records" / "records.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    given = {name for name, _ in declared}
    return [str(folder / "records" / "records.jsonl")], declared + [(name, kind) for name, kind in kinds.items() if name not in given]


def image_bytes(value: Any, number: int) -> bytes | None:
    """The encoded bytes of a record's image value (see `convert`); None for a path that names
    no file (the record becomes a "missing-file" reject, as a missing file of a listing does)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (str, os.PathLike)):
        try:
            return read_regular(os.fspath(value))  # a regular file within the input limit: never a FIFO or /dev/zero
        except FileNotFoundError:
            return None
        except RejectError as err:
            raise ConvertError(f"record {number}: the image file cannot be read: {err.message}", path=os.fspath(value)) from err
        except OSError as err:
            raise ConvertError(f"record {number}: the image file cannot be read: {err.strerror or err}", path=os.fspath(value)) from err
    if isinstance(value, Mapping) and ("bytes" in value or "path" in value):
        if value.get("bytes") is not None:
            return bytes(value["bytes"])
        if value.get("path") is not None:
            return image_bytes(value["path"], number)
    from PIL import Image

    if hasattr(value, "__array_interface__") and not isinstance(value, Image.Image):
        value = Image.fromarray(value)
    if isinstance(value, Image.Image):
        buffer = io.BytesIO()
        value.save(buffer, "PNG")  # lossless: the converter encodes the JPEG once
        return buffer.getvalue()
    raise ConvertError(f"record {number}: image is {type(value).__name__}; an image is bytes, a path, a PIL image, "
                       "a uint8 array or a {'bytes', 'path'} mapping")
