"""Build binary shards in memory and patch them field by field, for golden vectors and tests.

`ShardBytes` holds a shard in a bytearray and hands out numpy views of its header, footer and
record table in the dtypes of `shardfmt.format._layout`. To break exactly one rule of the format, change
one value through a view, then `reseal` the checksums that should still hold::

    shard = ShardBytes(build_shard(schema, records))
    shard.table()["offset"][1] += 64          # break contiguity of record 1 ...
    shard.reseal_table()                      # ... but keep table and footer checksums valid

Views are made on demand and must not outlive a change of length (`truncate`, `extend`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from shardfmt._checksum import checksum
from shardfmt.format._layout import (
    FOOTER_CHECKED_BYTES,
    FOOTER_DTYPE,
    FOOTER_SIZE,
    HEADER_CHECKED_BYTES,
    HEADER_DTYPE,
    HEADER_SIZE,
    TABLE_BLOCKS,
    table_blocks,
)
from shardfmt.format._schema import Schema
from shardfmt.format._writer import ShardWriter, block_checksums

__all__ = ["ShardBytes", "build_shard"]


def build_shard(schema: Schema, records: Iterable[Mapping[str, Any]], *, alignment: int = 64) -> bytes:
    """Return the bytes of a shard that `ShardWriter` writes for `records`."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "shard.shard"
        with ShardWriter(path, schema=schema, alignment=alignment) as writer:
            for record in records:
                writer.write(record)
        return path.read_bytes()


class ShardBytes:
    """A shard's bytes, patchable through views of the layout dtypes."""

    def __init__(self, data: bytes | bytearray) -> None:
        self.data = bytearray(data)

    def __bytes__(self) -> bytes:
        return bytes(self.data)

    def __len__(self) -> int:
        return len(self.data)

    # Views. Each is a one-element (header, footer) or n-row (table) array over `self.data`.
    def header(self) -> np.ndarray[Any, Any]:
        return np.frombuffer(self.data, HEADER_DTYPE, count=1)

    def footer(self) -> np.ndarray[Any, Any]:
        return np.frombuffer(self.data, FOOTER_DTYPE, count=1, offset=self.footer_offset)

    def table(self) -> np.ndarray[Any, Any]:
        """The record table, as the footer and the schema describe it."""
        footer = self.footer()[0]
        return np.frombuffer(
            self.data, self.schema().record_dtype(), count=int(footer["num_records"]), offset=int(footer["table_offset"])
        )

    def u64(self, offset: int) -> np.ndarray[Any, Any]:
        """A one-element little-endian u64 view at `offset`, for patching a single column."""
        return np.frombuffer(self.data, "<u8", count=1, offset=offset)

    @property
    def footer_offset(self) -> int:
        return len(self.data) - FOOTER_SIZE

    @property
    def schema_size(self) -> int:
        return int(self.header()[0]["schema_size"])

    @property
    def schema_bytes(self) -> bytes:
        return bytes(self.data[HEADER_SIZE : HEADER_SIZE + self.schema_size])

    def schema(self) -> Schema:
        return Schema.from_bytes(self.schema_bytes)

    @property
    def table_offset(self) -> int:
        return int(self.footer()[0]["table_offset"])

    def column_offset(self, record: int, column: str) -> int:
        """The file offset of `column` of table row `record`."""
        dtype = self.schema().record_dtype()
        return self.table_offset + record * dtype.itemsize + dtype.fields[column][1]  # type: ignore[index]

    # Checksums, in the order a full reseal needs them: records, then table, then footer.
    def reseal_header(self) -> None:
        """Recompute the header checksum over header bytes [0, 56) and the schema."""
        value = checksum(bytes(self.data[:HEADER_CHECKED_BYTES]) + self.schema_bytes)
        self.header()["checksum"] = value

    def reseal_record(self, index: int) -> None:
        """Recompute record `index`'s payload checksum, then the table and footer checksums."""
        row = self.table()[index]
        start, size = int(row["offset"]), int(row["size"])
        self.table()["checksum"][index] = checksum(bytes(self.data[start : start + size]))
        self.reseal_table()

    @property
    def flagged(self) -> bool:
        """The header has flag TABLE_BLOCKS: block checksums follow the table."""
        return bool(int(self.header()[0]["flags"]) & TABLE_BLOCKS)

    @property
    def rows_end(self) -> int:
        """Where the table's rows end: the block checksums start there (if flagged)."""
        footer = self.footer()[0]
        return int(footer["table_offset"]) + int(footer["num_records"]) * int(footer["record_size"])

    def block_sums(self) -> np.ndarray[Any, Any]:
        """The block checksums of a flagged shard, as the footer places them (one u64 a block)."""
        count = table_blocks(int(self.footer()[0]["num_records"]))
        return np.frombuffer(self.data, "<u8", count=count, offset=self.rows_end)

    def reseal_table(self) -> None:
        """Recompute the table checksum in the footer (of a flagged shard: the block checksums
        first, then the footer's checksum of them), then the footer checksum."""
        if self.flagged:
            record_size = int(self.footer()[0]["record_size"])
            sums = block_checksums(bytes(self.data[self.table_offset : self.rows_end]), record_size)
            start = self.rows_end
            stop = min(start + len(sums), len(self.data))  # a footer patched to lie: never a change of length
            if start < stop:
                self.data[start:stop] = sums[: stop - start]
            self.footer()["table_checksum"] = checksum(sums)
        else:
            self.footer()["table_checksum"] = checksum(bytes(self.data[self.table_offset : self.footer_offset]))
        self.reseal_footer()

    def drop_table_blocks(self) -> None:
        """Turn a flagged shard into the layout of 1.0 and 1.1: no block checksums, flag and
        footer `reserved0` 0, one checksum of the whole table (the header keeps its minor)."""
        if not self.flagged:
            return
        del self.data[self.rows_end : self.footer_offset]
        self.header()["flags"] = int(self.header()[0]["flags"]) & ~TABLE_BLOCKS
        self.footer()["reserved0"] = 0
        self.reseal_header()
        self.reseal_table()

    def reseal_footer(self) -> None:
        """Recompute the footer checksum over footer bytes [0, 48)."""
        start = self.footer_offset
        self.footer()["checksum"] = checksum(bytes(self.data[start : start + FOOTER_CHECKED_BYTES]))

    def reseal(self) -> None:
        """Make every checksum match the bytes as they are now (header, records, table, footer)."""
        self.reseal_header()
        for index in range(len(self.table())):
            self.reseal_record(index)
        self.reseal_table()

    # Changes of length.
    def truncate(self, size: int) -> None:
        del self.data[size:]

    def extend(self, data: bytes) -> None:
        self.data += data

    def replace_schema(self, schema_bytes: bytes) -> None:
        """Swap in other schema bytes, moving everything after the header; offsets are fixed up."""
        alignment = int(self.header()[0]["alignment"])  # no view may outlive a change of length
        old_header_size = int(self.header()[0]["header_size"])
        new_header_size = -(-(HEADER_SIZE + len(schema_bytes)) // alignment) * alignment
        shift = new_header_size - old_header_size
        rows = self.table().copy() if shift else None
        body = self.data[old_header_size:]
        self.data[HEADER_SIZE:] = schema_bytes + bytes(new_header_size - HEADER_SIZE - len(schema_bytes)) + body
        self.header()["schema_size"] = len(schema_bytes)
        self.header()["header_size"] = new_header_size
        if rows is not None:
            for name in rows.dtype.names:
                if name == "offset" or name.endswith(".offset"):
                    rows[name] = (rows[name].astype(np.int64) + shift).astype(np.uint64)
            self.footer()["table_offset"] = int(self.footer()[0]["table_offset"]) + shift
            self.data[self.table_offset : self.footer_offset] = rows.tobytes()
        self.reseal_header()
        self.reseal_table()
