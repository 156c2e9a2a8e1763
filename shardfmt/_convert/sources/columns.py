"""The columns of a Parquet or Arrow source other than its image: which one is the label, and
how every further column is kept as a field of its kind.

The label (`choose_label`): the column named with ``--label-column`` (``label_column=``);
``"none"`` (`NO_LABEL`) for records without a label; else the one ``ClassLabel`` column of the
Hugging Face features, else a column named ``label``. Without any of these, integer columns
could be labels: the source is refused with their names, never converted with labels of 0. A
source with none of them has records without a label.

Every further column (`further_columns`) is a field of the kind its values have (`column_kind`):
text ``str``, integers ``int64``, floating point ``float64``, binary ``bytes``, and anything else
(lists, structs, booleans) ``json``, with dates, times and decimals as text and an image (a
struct with ``bytes``) as its bytes; a column with a null value is ``json`` (where null is a
value) unless declared, and bytes within a list or struct must be dropped. ``--field NAME=KIND``
(``fields=``) declares a column's kind, and a value that does not fit it rejects its record as
"bad-value" (a null as "null-value"); ``--drop-column NAME`` (``drop_columns=``) leaves a column
out. What was kept and dropped is in the manifest (``converter.options``, ``stats``) and the
summary.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Final

from ..._errors import ConvertError

__all__ = [
    "COLUMN_KINDS", "NO_LABEL", "choose_label", "class_label_columns", "column_kind", "column_value", "further_columns", "value_problem",
]

NO_LABEL: Final = "none"
"""The label column that says: the records have no label (``--label-column none``)."""
COLUMN_KINDS: Final = ("str", "int64", "float64", "bytes", "json")
"""The kinds a further column is stored as."""
_INT64: Final = (-(1 << 63), 1 << 63)


def class_label_columns(features: dict[str, Any] | None, names: Sequence[str]) -> list[str]:
    """The columns of `names` that the Hugging Face `features` declare as a ``ClassLabel``."""
    if not features:
        return []
    return [name for name in names if isinstance(features.get(name), dict) and features[name].get("_type") == "ClassLabel"]


def choose_label(pa: Any, schema: Any, *, chosen: str | None, image: str, key: str | None, class_labels: list[str],
                 where: str) -> str | None:
    """The label column of a file (see the module docstring), or None for records without one.

    Raises:
        ConvertError: several ``ClassLabel`` columns, or integer columns and none chosen (the
            message lists them and names the option).
    """
    if chosen == NO_LABEL:
        return None
    if chosen is not None:
        return chosen
    fix = "pass --label-column NAME (label_column='NAME'), or --label-column none (label_column='none') for records without a label"
    if len(class_labels) > 1:
        listed = ", ".join(class_labels)
        raise ConvertError(f"the features name {len(class_labels)} ClassLabel columns ({listed}): which is the label? {fix}", path=where)
    if class_labels:
        return class_labels[0]
    if "label" in schema.names:
        return "label"
    candidates = [name for name in schema.names if name not in (image, key) and _is_integer(pa, schema.field(name).type)]
    if candidates:
        raise ConvertError(f"no label column chosen, and integer columns could be one ({', '.join(candidates)}): {fix}", path=where)
    return None


def further_columns(schema: Any, *, used: Sequence[str | None], drop: Sequence[str], declared: Sequence[str], where: str) -> list[str]:
    """The columns of a file kept as fields: all but the image, label and key columns and those dropped.

    Raises:
        ConvertError: a dropped or declared column that the file does not have, or one that is
            the image, label or key.
    """
    for name in (*drop, *declared):
        if name not in schema.names:
            raise ConvertError(f"no column {name!r} (--drop-column, --field); the file's columns are {', '.join(schema.names)}", path=where)
        if name in used:
            raise ConvertError(f"column {name!r} is the image, label or key column: it cannot be dropped or declared", path=where)
    both = set(drop) & set(declared)
    if both:
        raise ConvertError(f"column {sorted(both)[0]!r} is both dropped and declared", path=where)
    return [name for name in schema.names if name not in used and name not in drop]


def column_kind(pa: Any, kind: Any, *, declared: str | None, has_null: bool, name: str, where: str) -> str:
    """The kind a further column is stored as: `declared`, else its values' (see the module docstring).

    Raises:
        ConvertError: `declared` is none of `COLUMN_KINDS`, or a binary column holds nulls and
            is not declared.
    """
    if declared is not None:
        if declared not in COLUMN_KINDS:
            allowed = ", ".join(COLUMN_KINDS)
            raise ConvertError(f"field {name!r}: a column of a Parquet or Arrow source is stored as {allowed}, not {declared!r}")
        return declared
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    found = ("str" if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_temporal(kind)
             or pa.types.is_decimal(kind)
             else "int64" if _is_integer(pa, kind)
             else "float64" if pa.types.is_floating(kind)
             else "bytes" if _is_binary(pa, kind) or _is_image(pa, kind)
             else "json")
    if found == "json" and _holds_binary(pa, kind):
        raise ConvertError(f"column {name!r} holds {kind}, bytes inside a list or struct, which no field kind holds: leave it "
                           f"out with --drop-column {name} (drop_columns=)", path=where)
    if has_null and found == "bytes":
        raise ConvertError(f"column {name!r} holds bytes and nulls, which no field kind holds both: leave it out with "
                           f"--drop-column {name} (drop_columns=)", path=where)
    return "json" if has_null else found


def column_value(value: Any, kind: str) -> Any:
    """A further column's value as its kind stores it: a float from an integer, the ``bytes``
    of an image struct, the ISO text of a date or time and the text of a decimal."""
    if value is None:
        return None
    if kind == "float64" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind == "bytes" and isinstance(value, dict):
        return value.get("bytes")
    if kind == "str" and not isinstance(value, str) and (hasattr(value, "isoformat") or type(value).__name__ == "Decimal"):
        return value.isoformat() if hasattr(value, "isoformat") else str(value)
    return value


def value_problem(value: Any, kind: str, name: str) -> tuple[str, str] | None:
    """(reason, detail) if `value` cannot be stored as `kind`, else None."""
    if value is None and kind != "json":
        return "null-value", f"column {name!r} is null, and is stored as {kind}"
    fits = {
        "str": lambda v: isinstance(v, str),
        "int64": lambda v: isinstance(v, int) and not isinstance(v, bool) and _INT64[0] <= v < _INT64[1],
        "float64": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "bytes": lambda v: isinstance(v, bytes),
        "json": _is_json,
    }[kind]
    if fits(value):
        return None
    return "bad-value", f"column {name!r} holds {_shown(value)}, which is not a {kind} value"


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return not _has_big_int(value)


def _has_big_int(value: Any) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return not _INT64[0] <= value < _INT64[1]
    if isinstance(value, list):
        return any(_has_big_int(item) for item in value)
    if isinstance(value, dict):
        return any(_has_big_int(item) for item in value.values())
    return isinstance(value, float) and not math.isfinite(value)


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _is_binary(pa: Any, kind: Any) -> bool:
    return bool(pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind))


def _is_image(pa: Any, kind: Any) -> bool:
    """A struct with a binary ``bytes`` field: an image as the Hugging Face features store it."""
    return bool(pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0 and _is_binary(pa, kind.field("bytes").type))


def _holds_binary(pa: Any, kind: Any) -> bool:
    if _is_binary(pa, kind):
        return True
    if pa.types.is_struct(kind):
        return any(_holds_binary(pa, kind.field(n).type) for n in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _holds_binary(pa, kind.value_type)
    if pa.types.is_map(kind):
        return _holds_binary(pa, kind.key_type) or _holds_binary(pa, kind.item_type)
    return False


def _is_integer(pa: Any, kind: Any) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return bool(pa.types.is_integer(kind))
