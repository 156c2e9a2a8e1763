"""Mutations of the inputs shardfmt reads, for tools/fuzz.py and tests/test_fuzz.py.

Every function takes a `random.Random` and returns new bytes (or a new JSON value) with a list of
short notes saying what it did, so that a finding can say which mutation made its input. The same
generator state gives the same mutation: the campaign seeds one generator per mutation number.

Four families:

- bytes: flips, awkward integers, truncation, extension, insertion, deletion, splices from another
  seed, copies within the file (`mutate_bytes`);
- binary shards: a header, footer or table field set to an awkward value, a column shuffled, a
  payload or the schema changed, each followed by resealing every checksum that still parses, so
  that the checks behind the checksums are reached (`mutate_binary_structure`);
- tars: a header field set and its checksum fixed, PAX records rewritten, members renamed,
  replaced, dropped, repeated or of another type, the tar rewritten in USTAR, GNU or PAX format,
  JPEG headers bent (`mutate_tar`), and member indexes rewritten row by row (`mutate_index`);
- JSON: a node retyped, set to a huge number or NaN, deleted, its key repeated, a path made to
  point elsewhere, the totals fixed up afterwards or not (`mutate_json`, `encode_json`).
"""

from __future__ import annotations

import io
import json
import random
import struct
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from shardbytes import ShardBytes

from shardfmt._checksum import checksum
from shardfmt._errors import ShardfmtError
from shardfmt.format._layout import FOOTER_DTYPE, FOOTER_SIZE, HEADER_DTYPE, HEADER_SIZE
from shardfmt.format._reader import ShardReader
from shardfmt.format._writer import ShardWriter
from shardfmt.tar._index import INDEX_SCHEMA

Notes = list[str]

INTERESTING = [
    0, 1, 2, 7, 8, 63, 64, 65, 127, 128, 255, 256, 511, 512, 513, 1023, 1024, 4095, 4096,
    65535, 65536, 1 << 24, (1 << 24) + 1, 1 << 30, (1 << 30) + 1, (1 << 31) - 1, 1 << 31,
    (1 << 32) - 1, 1 << 32, 1 << 40, (1 << 40) + 1, (1 << 53) + 1, 1 << 62, (1 << 63) - 1, 1 << 63,
    (1 << 64) - 1,
]
"""Sizes and counts near the limits of the format (spec/limits.md) and of the integer widths."""
SIGNED = INTERESTING[:-3] + [-1, -2, -512, -(1 << 31), -(1 << 63)]
"""The same for signed 64-bit columns (values that fit an int64)."""


def pick_int(rng: random.Random, *, near: Sequence[int] = ()) -> int:
    """An awkward integer: an interesting value, one next to a value of the input, or any."""
    roll = rng.random()
    if near and roll < 0.35:
        return rng.choice(near) + rng.choice([-513, -512, -64, -8, -1, 0, 1, 8, 64, 512, 513])
    if roll < 0.85:
        return rng.choice(INTERESTING)
    return rng.getrandbits(rng.choice([8, 16, 32, 64]))


# -- bytes -----------------------------------------------------------------------------------------

def _position(rng: random.Random, size: int, hot: Sequence[tuple[int, int]]) -> int:
    """A position in [0, size]: half the time inside one of the `hot` ranges (headers, fields)."""
    if hot and rng.random() < 0.5:
        start, stop = rng.choice(hot)
        return min(size, rng.randrange(start, max(start + 1, stop)))
    return rng.randrange(size + 1)


def mutate_bytes(
    rng: random.Random, data: bytes, *, donors: Sequence[bytes] = (), hot: Sequence[tuple[int, int]] = (), rounds: int = 0
) -> tuple[bytes, Notes]:
    """Apply 1 to 3 byte-level changes (or `rounds`) to `data`; `hot` ranges draw half of them."""
    buffer = bytearray(data)
    notes: Notes = []
    for _ in range(rounds or rng.choice([1, 1, 1, 2, 3])):
        size = len(buffer)
        at = _position(rng, size, hot)
        op = rng.randrange(9) if size else 3
        if op == 0:
            for _ in range(rng.randint(1, 4)):
                if buffer:
                    where = _position(rng, size - 1, hot)
                    buffer[where] ^= rng.randint(1, 255)
            notes.append(f"flip bytes near {at}")
        elif op == 1:
            width = rng.choice([1, 2, 4, 8])
            value = pick_int(rng, near=[size, at]) % (1 << (8 * width))
            order: Literal["little", "big"] = "little" if rng.random() < 0.5 else "big"
            buffer[at : at + width] = value.to_bytes(width, order)
            notes.append(f"set {width} bytes at {at} to {value} ({order}-endian)")
        elif op == 2:
            cut = rng.choice([at, at - at % 512, at - at % 64, max(0, size - rng.randint(1, 64))])
            del buffer[cut:]
            notes.append(f"truncate to {cut}")
        elif op == 3:
            tail = rng.choice([bytes(rng.randint(1, 1024)), rng.randbytes(rng.randint(1, 256)), bytes(buffer[-64:])])
            buffer += tail
            notes.append(f"append {len(tail)} bytes")
        elif op == 4:
            piece = rng.choice([rng.randbytes(rng.randint(1, 16)), bytes(rng.choice([1, 8, 64, 512]))])
            buffer[at:at] = piece
            notes.append(f"insert {len(piece)} bytes at {at}")
        elif op == 5:
            length = rng.choice([1, 8, 64, 512, rng.randint(1, 2048)])
            del buffer[at : at + length]
            notes.append(f"delete [{at}, {at + length})")
        elif op == 6 and donors:
            donor = rng.choice(donors)
            start = rng.randrange(len(donor) + 1)
            piece = donor[start : start + rng.choice([8, 64, 512, rng.randint(1, 2048)])]
            buffer[at : at + len(piece)] = piece
            notes.append(f"splice {len(piece)} donor bytes from {start} at {at}")
        elif op == 7:
            start = rng.randrange(size)
            piece = bytes(buffer[start : start + rng.choice([8, 64, 512])])
            buffer[at : at + len(piece)] = piece
            notes.append(f"copy {len(piece)} bytes from {start} to {at}")
        else:
            value = rng.choice([0x00, 0xFF, 0x7F, 0x80, 0x30, 0x37, 0x20, 0x0A, 0x2E, 0x2F])
            length = rng.choice([1, 4, 12])
            buffer[at : at + length] = bytes([value]) * length
            notes.append(f"fill {length} bytes at {at} with 0x{value:02x}")
    return bytes(buffer), notes


# -- binary shards ---------------------------------------------------------------------------------

def shard_hot_ranges(data: bytes) -> list[tuple[int, int]]:
    """Header, footer and record table of a valid shard: where a change meets a check first."""
    shard = ShardBytes(data)
    return [(0, HEADER_SIZE), (shard.table_offset, len(data))]


def _fields(dtype: np.dtype[Any]) -> list[tuple[str, int, int]]:
    """(name, offset, width) of each field of a structured dtype, checksum excluded."""
    return [(name, spec[1], spec[0].itemsize) for name, spec in (dtype.fields or {}).items() if name != "checksum"]


def field_locations(shard: ShardBytes) -> list[tuple[int, int]]:
    """(offset, width) of every header and footer field and of every table cell that parses."""
    footer = shard.footer_offset
    places = [(offset, width) for _, offset, width in _fields(HEADER_DTYPE)]
    places += [(footer + offset, width) for _, offset, width in _fields(FOOTER_DTYPE)]
    row_fields = _fields(shard.schema().record_dtype())
    row_size = shard.schema().record_dtype().itemsize
    for row in range(int(shard.footer()[0]["num_records"])):
        base = shard.table_offset + row * row_size
        places += [(base + offset, width) for _, offset, width in row_fields]
    return [(offset, min(width, 8)) for offset, width in places]


def reseal_what_parses(shard: ShardBytes) -> None:
    """Recompute every checksum whose input range still lies inside the file."""
    size = len(shard)
    if size < HEADER_SIZE + FOOTER_SIZE:
        return
    if HEADER_SIZE + shard.schema_size <= size:
        shard.reseal_header()
    table_offset, footer = shard.table_offset, shard.footer_offset
    if not table_offset <= footer:
        shard.reseal_footer()
        return
    try:
        dtype = shard.schema().record_dtype()
    except (ShardfmtError, ValueError):
        dtype = None
    num_records = int(shard.footer()[0]["num_records"])
    if dtype is not None and table_offset + num_records * dtype.itemsize <= footer:
        table = np.frombuffer(shard.data, dtype, count=num_records, offset=table_offset)
        for index in range(num_records):
            start, length = int(table["offset"][index]), int(table["size"][index])
            if start + length <= size:
                table["checksum"][index] = checksum(bytes(shard.data[start : start + length]))
        del table
    shard.reseal_table()


def mutate_binary_structure(rng: random.Random, data: bytes) -> tuple[bytes, Notes]:
    """Change one field, column, payload or the schema of a valid shard, then reseal it."""
    shard = ShardBytes(data)
    num_records = int(shard.footer()[0]["num_records"])
    table = shard.table()
    choice = rng.randrange(4) if num_records else 0
    if choice == 0:
        offset, width = rng.choice(field_locations(shard))
        value = pick_int(rng, near=[len(data), shard.table_offset]) % (1 << (8 * width))
        shard.data[offset : offset + width] = value.to_bytes(width, "little")
        notes = [f"set the {width}-byte field at {offset} to {value}"]
    elif choice == 1:
        column = rng.choice([n for n in table.dtype.names if n != "checksum"])
        order = list(range(num_records))
        rng.shuffle(order)
        table[column] = table[column][np.array(order)]
        notes = [f"permute table column {column!r} as {order}"]
    elif choice == 2:
        row = rng.randrange(num_records)
        start, size = int(table["offset"][row]), int(table["size"][row])
        payload, notes = mutate_bytes(rng, bytes(shard.data[start : start + size]), rounds=1)
        shard.data[start : start + size] = payload[:size].ljust(size, b"\0")
        notes = [f"record {row} payload: {note}" for note in notes]
    else:
        del table  # no view may outlive a change of length
        schema = json.loads(shard.schema_bytes)
        schema, notes = mutate_json(rng, schema)
        shard.replace_schema(encode_json(schema).encode())
        notes = [f"schema: {note}" for note in notes]
    reseal_what_parses(shard)
    return bytes(shard), notes + ["resealed"]


# -- tars ------------------------------------------------------------------------------------------

HEADER_FIELDS = {
    "name": (0, 100), "mode": (100, 8), "uid": (108, 8), "gid": (116, 8), "size": (124, 12),
    "mtime": (136, 12), "chksum": (148, 8), "typeflag": (156, 1), "linkname": (157, 100),
    "magic": (257, 6), "version": (263, 2), "uname": (265, 32), "gname": (297, 32),
    "devmajor": (329, 8), "devminor": (337, 8), "prefix": (345, 155),
}
_NUMERIC = ("mode", "uid", "gid", "size", "mtime", "devmajor", "devminor")
_TYPEFLAGS = b"0\x00123456789xgLKSVMDNA"
_NAMES = [
    b"", b"a/../../b.jpg", b"/abs.jpg", b"x" * 100, b"__meta__/a.jpg", b"__k__.jpg", b"a.b.c.jpg", b"\xff\xfe.jpg",
    b"README", b".jpg", b"a/.x.jpg", b"dir/", b"k\n.jpg", b"KEY.JPG", b"img.CLS", b"img.cls", b"img.jpg",
    b"a\x00b.jpg", b"./img.jpg", b"img.json", b"img.jpeg", b"dir/img.jpg",
]
_PAX_KEYWORDS = [
    "path", "size", "linkpath", "hdrcharset", "mtime", "uid", "comment", "GNU.sparse.size", "GNU.sparse.map",
    "GNU.sparse.major", "GNU.sparse.minor", "GNU.sparse.name", "GNU.sparse.realsize", "GNU.sparse.numblocks",
    "GNU.sparse.offset", "GNU.sparse.numbytes",
]
_PAX_VALUES = ["", "-1", "0", "1", "x", "\udcff", "1e10", "1.5", "0,1", "1,2,3", "99999999999999999999", "BINARY", "a.jpg", "../x.jpg"]
_LABELS = [b"", b"-1", b"1e3", b"  3 ", b"\xff", b"1_0", b"0x10", b"9" * 64, b"9" * 65, b"+2", b"1048576", b"3\n", b"\x00"]


def header_blocks(data: bytes) -> list[int]:
    """Offsets of the 512-byte blocks of `data` whose header checksum is right: every header."""
    found = []
    for offset in range(0, len(data) - 511, 512):
        block = data[offset : offset + 512]
        if not any(block):
            continue
        try:
            stored = int(block[148:156].split(b"\0")[0].strip() or b"x", 8)
        except ValueError:
            continue
        if stored == sum(block[:148]) + 256 + sum(block[156:]):
            found.append(offset)
    return found


def reseal_header(buffer: bytearray, offset: int) -> None:
    """Make the checksum of the tar header at `offset` right again."""
    block = buffer[offset : offset + 512]
    block[148:156] = b" " * 8
    buffer[offset + 148 : offset + 156] = b"%06o\0 " % (sum(block) % (1 << 18))


def _numeric_field(rng: random.Random, width: int, near: Sequence[int]) -> bytes:
    roll = rng.random()
    if roll < 0.6:
        value = pick_int(rng, near=near)
        return (b"%0*o" % (width - 1, value % (8 ** (width - 1))) + b"\0")[-width:]
    if roll < 0.8:
        value = pick_int(rng, near=near) % (1 << (8 * (width - 1)))
        return (b"\x80" if rng.random() < 0.7 else b"\xff") + value.to_bytes(width - 1, "big")
    return rng.choice([b"\xff" * width, b"0x1f", b"-1", b" " * width, bytes(width), b"8" * (width - 1) + b"\0", b"7" * width])[:width]


def _set_header_field(rng: random.Random, buffer: bytearray, offset: int, near: Sequence[int]) -> str:
    name = rng.choice(list(HEADER_FIELDS))
    start, width = HEADER_FIELDS[name]
    if name in _NUMERIC:
        value = _numeric_field(rng, width, near)
    elif name == "typeflag":
        value = bytes([rng.choice(_TYPEFLAGS)])
    elif name in ("name", "linkname", "prefix"):
        value = rng.choice(_NAMES)
    elif name == "magic":
        value = rng.choice([b"ustar\0", b"ustar ", bytes(6), b"GNUtar"])
    else:
        value = rng.randbytes(width)
    value = value[:width].ljust(width, b"\0")
    buffer[offset + start : offset + start + width] = value
    resealed = name != "chksum" and rng.random() < 0.9
    if resealed:
        reseal_header(buffer, offset)
    return f"header at {offset}: {name} = {value!r}{' (resealed)' if resealed else ''}"


def _pax_record(keyword: str, value: str, *, length: str | None = None) -> bytes:
    body = f" {keyword}={value}\n".encode("utf-8", "surrogateescape")
    size = len(body) + 1
    while len(body) + len(str(size)) != size:
        size = len(body) + len(str(size))
    return (length if length is not None else str(size)).encode() + body


def _rewrite_pax(rng: random.Random, buffer: bytearray, offset: int, near: Sequence[int]) -> str:
    """Replace the data of the extended header at `offset` and fix its size field."""
    old_size = int(bytes(buffer[offset + 124 : offset + 136]).split(b"\0")[0] or b"0", 8)
    records = b""
    for _ in range(rng.randint(1, 3)):
        keyword = rng.choice(_PAX_KEYWORDS)
        value = str(pick_int(rng, near=near)) if rng.random() < 0.4 else rng.choice(_PAX_VALUES)
        length = None if rng.random() < 0.8 else rng.choice(["0", "1", "999", "abc", "-5", ""])
        records += _pax_record(keyword, value, length=length)
    padded = -(-len(records) // 512) * 512
    buffer[offset + 512 : offset + 512 + -(-old_size // 512) * 512] = records + bytes(padded - len(records))
    buffer[offset + 124 : offset + 136] = b"%011o\0" % len(records)
    reseal_header(buffer, offset)
    return f"PAX header at {offset}: records {records!r}"


def _jpeg_variant(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """Bend the headers of a JPEG: its frame header, a segment length, a truncation at a marker."""
    buffer = bytearray(data)
    markers = [i for i in range(2, min(len(data) - 1, 2048)) if data[i] == 0xFF and data[i + 1] not in (0x00, 0xFF)]
    roll = rng.randrange(4)
    if roll == 0 and markers:
        at = rng.choice(markers)
        buffer[at + 2 : at + 4] = (pick_int(rng, near=[len(data)]) % 65536).to_bytes(2, "big")
        return bytes(buffer), f"segment length at {at} changed"
    if roll == 1:
        sof = next((i for i in markers if 0xC0 <= data[i + 1] <= 0xCF and data[i + 1] not in (0xC4, 0xC8, 0xCC)), None)
        if sof is not None:
            precision, height, width = rng.choice([8, 12, 16, 0]), rng.choice([0, 1, 65535]), rng.choice([0, 1, 65535])
            values = struct.pack(">BHHB", precision, height, width, rng.choice([0, 1, 2, 3, 4, 255]))
            buffer[sof + 4 : sof + 10] = values
            buffer[sof + 1] = rng.choice([0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xCF, data[sof + 1]])
            return bytes(buffer), f"frame header at {sof} set to {values.hex()}"
    if roll == 2 and markers:
        at = rng.choice(markers)
        return bytes(buffer[: at + rng.randint(0, 4)]), f"cut at the marker at {at}"
    changed, notes = mutate_bytes(rng, bytes(buffer[:600]), rounds=1)
    return changed + bytes(buffer[600:]), f"JPEG head: {notes[0]}"


def _members(data: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:", encoding="utf-8", errors="surrogateescape") as archive:
        return [(info, archive.extractfile(info).read() if info.isreg() else b"") for info in archive]  # type: ignore[union-attr]


def _write_members(members: list[tuple[tarfile.TarInfo, bytes]], fmt: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


def _rewrite_members(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """Change the member list (rename, replace, drop, repeat, retype) and write the tar anew."""
    members = _members(data)
    regular = [i for i, (info, _) in enumerate(members) if info.isreg()]
    roll = rng.randrange(7)
    i = rng.choice(regular)
    info, payload = members[i]
    info = tarfile.TarInfo(info.name)
    info.size, info.mtime, info.mode = len(payload), 0, 0o644
    if roll == 0:
        info.name = rng.choice(_NAMES).decode("utf-8", "surrogateescape") or "x"
        note = f"member {i} renamed {info.name!r}"
    elif roll == 1:
        stem = info.name.rpartition(".")[0]
        label = rng.choice(_LABELS)
        info, payload = tarfile.TarInfo(stem + ".cls"), label
        note = f"member {i} replaced by a label {label!r}"
    elif roll == 2 and payload.startswith(b"\xff\xd8"):
        payload, note = _jpeg_variant(rng, payload)
        note = f"member {i}: {note}"
    elif roll == 3:
        del members[i]
        members.insert(rng.randrange(len(members) + 1), (info, payload))
        note = f"member {i} moved"
    elif roll == 4:
        members.insert(rng.randrange(len(members) + 1), (info, payload))
        note = f"member {i} repeated"
    elif roll == 5:
        del members[i]
        info = None  # type: ignore[assignment]
        note = f"member {i} dropped"
    else:
        info.type = rng.choice([tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE])
        info.linkname, payload = rng.choice(["a.jpg", "../../etc/passwd", "/dev/zero", ""]), b""
        note = f"member {i} made of type {info.type!r}"
    if info is not None:
        info.size = len(payload) if info.isreg() else 0
        if roll not in (3, 4):
            members[i] = (info, payload)
    fmt = rng.choice([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
    try:
        return _write_members(members, fmt), f"{note}; rewritten in format {fmt}"
    except ValueError:  # a name USTAR cannot hold
        return _write_members(members, tarfile.PAX_FORMAT), f"{note}; rewritten in PAX format"


def mutate_tar(rng: random.Random, data: bytes, *, donors: Sequence[bytes] = ()) -> tuple[bytes, Notes]:
    """Change a valid tar: a header field, PAX records, the member list, or its bytes."""
    headers = header_blocks(data)
    near = [len(data), *headers]
    roll = rng.random()
    if roll < 0.3 and headers:
        buffer = bytearray(data)
        notes = [_set_header_field(rng, buffer, rng.choice(headers), near) for _ in range(rng.choice([1, 1, 2]))]
        return bytes(buffer), notes
    if roll < 0.4:
        pax = [offset for offset in headers if data[offset + 156 : offset + 157] in (b"x", b"g")]
        if pax:
            buffer = bytearray(data)
            note = _rewrite_pax(rng, buffer, rng.choice(pax), near)
            return bytes(buffer), [note]
    if roll < 0.7:
        changed, note = _rewrite_members(rng, data)
        return changed, [note]
    hot = [(offset, offset + 512) for offset in headers] + [(offset + 512, offset + 1100) for offset in headers]
    return mutate_bytes(rng, data, donors=donors, hot=hot)


# -- member indexes --------------------------------------------------------------------------------

_MEMBER_SPANS: list[Any] = [
    {},
    [],
    None,
    1,
    "jpg",
    {"jpg": [0, 1]},
    {"jpg": [-1, 10]},
    {"jpg": [1 << 63, 1]},
    {"jpg": "x"},
    {"jpg": [1.5, 2]},
    {"jpg": [True, 1]},
    {"cls": [512, 10**30]},
    {"jpg": [0]},
    {"jpg": [0, 1, 2]},
    {"jpg": [512, 1, -1]},
    {"jpg": [512, 1, 0, 0]},
    {"jpg": [512, 1, 1.0]},
    {"": [0, 0]},
    {"jpg": None},
    {"jpg": [[0], [1]]},
    {"jpg": {"a": 1}},
    [[[[[[[[[[[]]]]]]]]]]],
]
_KEYS = [b"", b"\xff\xfe", b"a" * 5000, b"../x", b"a\x00b", b"\xed\xa0\x80", b"k.jpg", b"__meta__"]


def index_records(data: bytes) -> list[dict[str, Any]]:
    """The rows of a valid member index, as `ShardWriter.write` takes them."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "seed.idx"
        path.write_bytes(data)
        with ShardReader(path) as reader:
            return [
                {name: (bytes(value) if isinstance(value, memoryview) else value) for name, value in record.items()} for record in reader
            ]


def write_index(rows: Sequence[dict[str, Any]], folder: Path) -> bytes:
    """The bytes `ShardWriter` writes for a member index of `rows`."""
    path = folder / "rewritten.idx"
    with ShardWriter(path, schema=INDEX_SCHEMA) as writer:
        for row in rows:
            writer.write(row)
    data = path.read_bytes()
    path.unlink()
    return data


def mutate_index(rng: random.Random, data: bytes, rows: list[dict[str, Any]], *, folder: Path, tar_size: int) -> tuple[bytes, Notes]:
    """Change a member index: rewrite its rows with one awkward value, reorder them, change a
    field and reseal, or change its bytes."""
    roll = rng.random()
    if roll < 0.5 and rows:
        rows = [dict(row) for row in rows]
        r = rng.randrange(len(rows))
        column = rng.choice([name for name in INDEX_SCHEMA.names])
        if column == "key":
            rows[r]["key"] = rng.choice(_KEYS + [rows[rng.randrange(len(rows))]["key"]])
        elif column == "members":
            spans = rows[rng.randrange(len(rows))]["members"]
            rows[r]["members"] = rng.choice(_MEMBER_SPANS + [spans, {**spans, "jpg": [tar_size - 1, 2]}])
        else:
            near = [int(row[column]) for row in rows] + [tar_size]
            value = rng.choice(SIGNED) if rng.random() < 0.5 else pick_int(rng, near=near)
            rows[r][column] = min(max(value, -(1 << 63)), (1 << 63) - 1)
        notes = [f"row {r}: {column} = {rows[r][column]!r}"]
    elif roll < 0.6 and rows:
        rows = list(rows)
        how = rng.choice(["drop", "repeat", "reverse", "shuffle"])
        r = rng.randrange(len(rows))
        if how == "drop":
            del rows[r]
        elif how == "repeat":
            rows.insert(rng.randrange(len(rows) + 1), rows[r])
        elif how == "reverse":
            rows.reverse()
        else:
            rng.shuffle(rows)
        notes = [f"rows: {how} ({r})"]
    elif roll < 0.8:
        return mutate_binary_structure(rng, data)
    else:
        return mutate_bytes(rng, data, hot=shard_hot_ranges(data))
    try:
        return write_index(rows, folder), notes + ["index rewritten"]
    except ShardfmtError as err:  # a value the writer refuses: change the bytes instead
        changed, more = mutate_bytes(rng, data, hot=shard_hot_ranges(data))
        return changed, notes + [f"not writable ({err.message})"] + more


# -- JSON ------------------------------------------------------------------------------------------


class Pairs:
    """A JSON object written with its pairs as they are, so that a key can appear twice."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


class Raw:
    """JSON text written as it is: nesting deeper than the encoder could recurse through."""

    def __init__(self, text: str) -> None:
        self.text = text


def encode_json(value: Any) -> str:
    """JSON text for `value`: `Pairs` keep repeated keys, `Raw` is inlined, floats may be NaN or
    Infinity, strings may hold lone surrogates (written as escapes)."""
    try:
        return json.dumps(value)
    except TypeError:  # a Pairs or Raw inside
        pass
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, (dict, Pairs)):
        pairs = value.items() if isinstance(value, dict) else value.pairs
        return "{" + ",".join(json.dumps(str(k)) + ":" + encode_json(v) for k, v in pairs) + "}"
    if isinstance(value, list):
        return "[" + ",".join(encode_json(v) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__}")


def _nodes(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _nodes(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _nodes(item, path + (i,))
    return found


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """Put `new` at `path` and return the document (`new` itself for the root)."""
    if not path:
        return new
    _get(value, path[:-1])[path[-1]] = new
    return value


_WRONG_TYPES: list[Any] = [None, True, False, 0, -1, 1.5, "", "x", [], {}, [1], {"a": 1}, "12", [None]]
_NUMBERS: list[Any] = [
    float("nan"),
    float("inf"),
    float("-inf"),
    -0.0,
    1e308,
    1e-300,
    2**63,
    2**64,
    -(2**63) - 1,
    10**30,
    10**400,
    -1,
    0,
    1 << 40,
]
PATH_TRICKS = [
    "../outside.shard",
    "../outside.tar",
    "../outside.tar.idx",
    "sub/../../outside.shard",
    "./../outside.shard",
    "..//outside.shard",
    "%2e%2e/outside.shard",
    "..\\outside.shard",
    "...",
    ".../outside.shard",
    "/dev/zero",
    "/etc/hostname",
    "//server/share/x",
    "C:/x",
    "file:///etc/hostname",
    "~/x",
    "",
    ".",
    "/",
    "manifest.json",
    "shard-00000.shard/",
    "shard-00000.shard/x",
    "a" * 300,
    ("a" * 200 + "/") * 30 + "x",
    "\ud800",
    "\udcff.shard",
    "shard-00000.shard\x00",
    " shard-00000.shard",
    "SHARD-00000.SHARD",
    "shard-00000.tar.idx",
    "shard-00000.tar",
    "rejects.jsonl",
    "nul",
    "con:",
    "a:b",
]
"""Paths that must be refused or not found, never reach a file outside the dataset root. The
datasets lie beside a valid shard, tar and index named ``outside.*`` (see tools/fuzz.py): reading
one of their records through a manifest proves that a path escaped the root."""


def mutate_json(rng: random.Random, value: Any, *, totals: bool = False) -> tuple[Any, Notes]:
    """Change one node of a parsed JSON document: retype it, make it a huge number or NaN, delete
    it, repeat its key, add a key, repeat, drop or nest list items, nest it deeply, make it
    large, or (a string) make it a path trick. With `totals`, "num_records" and "num_bytes" are
    then recomputed from "shards" most times, so that the checks behind the totals are reached."""
    value = json.loads(json.dumps(value))
    path = rng.choice(_nodes(value)[1:] or [()])
    node = _get(value, path)
    parent = _get(value, path[:-1]) if path else None
    where = "/".join(map(str, path)) or "the document"
    roll = rng.randrange(10)
    if roll == 0:
        new = rng.choice(_WRONG_TYPES)
        value, note = _replace(value, path, new), f"{where} = {new!r}"
    elif roll in (1, 2) and not (roll == 2 and isinstance(node, str)):
        is_int = isinstance(node, int) and not isinstance(node, bool)
        new = rng.choice(_NUMBERS) if rng.random() < 0.5 else pick_int(rng, near=[node] if is_int else [])
        value, note = _replace(value, path, new), f"{where} = {new!r}"
    elif roll == 2:
        new = (
            rng.choice(PATH_TRICKS) if rng.random() < 0.7 else rng.choice([node * 2, node.upper(), node + "\n", node[:-1], "\u00e9" + node])
        )
        value, note = _replace(value, path, new), f"{where} = {new!r}"
    elif roll == 3 and path:
        del _get(value, path[:-1])[path[-1]]
        note = f"delete {where}"
    elif roll == 4 and isinstance(parent, dict):
        pairs = Pairs(list(parent.items()))
        repeated = rng.choice(_WRONG_TYPES + [node])
        pairs.pairs.insert(rng.choice([0, len(pairs.pairs)]), (path[-1], repeated))
        value, note = _replace(value, path[:-1], pairs), f"repeat key {where} with {repeated!r}"
    elif roll == 5 and isinstance(node, dict):
        key = rng.choice(["extra", "path", "index", "size", "", "__proto__"])
        node[key] = rng.choice(_WRONG_TYPES)
        note = f"{where}/{key} = {node[key]!r}"
    elif roll == 6 and isinstance(node, list) and node:
        note = _mutate_list(rng, node, where)
    elif roll == 7:
        depth = rng.choice([64, 1000, 100_000])
        value, note = _replace(value, path, Raw("[" * depth + "]" * depth)), f"{where} = {depth} nested lists"
    else:
        new = rng.choice(["x" * 70_000, "\u202e" * 3, [""] * 10_000, {str(i): i for i in range(2_000)}])
        value, note = _replace(value, path, new), f"{where} = a large {type(new).__name__}"
    notes = [note]
    if totals and rng.random() < 0.7:
        _fix_totals(value, notes)
    return value, notes


def _mutate_list(rng: random.Random, node: list[Any], where: str) -> str:
    """Repeat, drop or nest one item of a non-empty list, or reverse it, in place; return the note."""
    i = rng.randrange(len(node))
    how = rng.choice(["repeat", "drop", "reverse", "nest"])
    if how == "repeat":
        node.insert(rng.randrange(len(node) + 1), node[i])
    elif how == "drop":
        del node[i]
    elif how == "reverse":
        node.reverse()
    else:
        node[i] = [node[i]] * 2
    return f"{how} item {i} of {where}"


def _fix_totals(value: Any, notes: Notes) -> None:
    if not isinstance(value, dict) or not isinstance(value.get("shards"), list):
        return
    try:
        records = sum(shard["num_records"] for shard in value["shards"])
        size = sum(shard["size"] for shard in value["shards"])
    except (TypeError, KeyError, IndexError):
        return
    if isinstance(records, int) and isinstance(size, int):
        value["num_records"], value["num_bytes"] = records, size
        notes.append("totals recomputed")


def mutate_paths(rng: random.Random, value: Any, *, names: Sequence[str]) -> tuple[Any, Notes]:
    """Point a "path" or "report" of a manifest at a path trick or at another file of the
    dataset (`names`), or give a shard another shard's checksum, size or record count."""
    value = json.loads(json.dumps(value))
    places = [path for path in _nodes(value) if path and path[-1] in ("path", "report", "checksum", "size", "num_records")]
    if not places:
        return value, ["no path to change"]
    path = rng.choice(places)
    if path[-1] in ("path", "report"):
        new = rng.choice(PATH_TRICKS) if rng.random() < 0.5 else rng.choice(list(names))
    else:
        same = [p for p in places if p[-1] == path[-1]]
        new = _get(value, rng.choice(same))
    _replace(value, path, new)
    notes = [f"{'/'.join(map(str, path))} = {new!r}"]
    _fix_totals(value, notes)
    return value, notes
