"""The WebDataset naming rule: how a member name splits into key and extension, how a record
key becomes a tar key, and the limits and names every tar module shares (spec/tar.md §2)."""

from __future__ import annotations

import re
from typing import Any, Final

from .._errors import SchemaError

BLOCK_SIZE: Final = 512
"""Tar headers and member data start on multiples of this."""
RECORD_SIZE: Final = 20 * BLOCK_SIZE
"""The writer pads a finished tar to a multiple of this, as tar and Python's tarfile do."""
INDEX_SUFFIX: Final = ".idx"
COMPRESSED_SUFFIXES: Final = (".tar.gz", ".tgz")
"""Names of gzip-compressed tars: a conversion reads them (decompressed as a stream), nothing
reads them in place."""
COMPRESSED_ADVICE: Final = (
    "a compressed tar (.tar.gz, .tgz) cannot be read in place (its members are not byte ranges of the file): "
    "convert it (shardfmt convert SRC OUT, which streams it) or decompress it first (gunzip)"
)
IMAGE_EXTENSIONS: Final = ("jpg", "jpeg")
"""Extensions of the image member, in order of preference, compared after lower-casing."""
ANY_IMAGE_EXTENSIONS: Final = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "pbm", "pnm")
"""Extensions of a sample's image member when it is converted (any image Pillow reads), in order
of preference; a tar read in place serves only `IMAGE_EXTENSIONS`."""
LABEL_EXTENSION: Final = "cls"
META_EXTENSION: Final = "json"
TEXT_EXTENSIONS: Final = ("txt", "text", "caption")
"""Members read as text (a ``str`` field) unless declared otherwise; ``json`` is JSON, the rest bytes."""
_RESERVED_FIELDS: Final = frozenset({"image", "label", "key", "offset", "size", "checksum"})
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,63}\Z")
MAX_LABEL_SIZE: Final = 64
"""A ``.cls`` member longer than this is not a label (an int64 needs at most 20 characters)."""
MAX_MEMBER_SIZE: Final = 1 << 26
"""The largest member of a sample other than its image (64 MiB): a member field is read whole
(decoded as text or JSON, copied as bytes), so this bounds that allocation; the image member is
bounded by ``MAX_FIELD_SIZE`` as a binary shard's image is (spec/tar.md, section 10)."""
REJECT_REASONS: Final = (
    "duplicate-member",
    "no-image",
    "empty",
    "too-large",
    "not-a-jpeg",
    "corrupt",
    "unsupported-jpeg",
    "no-label",
    "bad-label",
)
"""Why `index_tar` leaves a sample out, in the order the checks run (spec/tar.md, section 6)."""
_META_NAME = re.compile(r"__[^/]*__($|/)")
"""Member names webdataset skips as metadata (its ``tar_file_iterator`` ``skip_meta``)."""
def split_key(name: str) -> tuple[str, str] | None:
    """Split a member name into (key, extension) exactly as webdataset's ``base_plus_ext`` does.

    The extension is everything after the first dot of the base name (the part after the last
    "/"), further dots included; the key is everything before that dot, directories included:
    ``a/b.c.d.jpg`` -> ``("a/b", "c.d.jpg")``. Case is kept: webdataset lower-cases extensions
    only when it groups members into samples. A name has no key when its base name has no dot, or
    when the text just before that dot, back to the start or to an earlier "/" (one that is not
    the character right before the dot, and that no newline precedes), is empty or holds a dot:
    ``README``, ``.x.jpg`` and ``a.b/.x.jpg`` have no key, while ``a/.x.jpg`` gives
    ``("a/", "x.jpg")`` because webdataset's pattern lets a key end in "/".

    Returns:
        (key, extension), or None if the name is not a sample member (webdataset skips it).
    """
    dot = name.find(".", name.rfind("/") + 1)
    if dot <= 0:
        return None
    newline = name.find("\n")
    stop = dot - 1 if newline < 0 else min(dot - 1, newline)
    start = name.rfind("/", 0, stop) + 1
    if "." in name[start:dot]:
        return None
    return name[:dot], name[dot + 1 :]


def display_key(key: str) -> str:
    """Return `key` printable: bytes that were not UTF-8 in the tar appear as ``\\xNN``."""
    return key.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_meta(name: str) -> bool:
    return _META_NAME.match(name) is not None


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def key_problem(key: str) -> str | None:
    """Why `key` cannot be the key of a record that shardfmt writes, or None: the one rule of every
    output of a conversion (binary and tar) and of `TarShardWriter` (spec/conversion.md, "Key").

    A key is a relative, "/"-separated path: not empty, no empty, "." or ".." part (so no leading
    "/"), and no control character (U+0000 to U+001F and U+007F: NUL, a newline, a tab, ...),
    which would break the lines of tar listings and the paths that tools make of keys.
    """
    if not key or any(part in ("", ".", "..") for part in key.split("/")):
        return f"key {display_key(key)!r} must be a relative path without empty, '.' or '..' parts"
    control = _CONTROL.search(key)
    if control is not None:
        return f"key {display_key(key)!r} holds the control character U+{ord(control.group()):04X} at position {control.start()}"
    return None


def encode_key(key: Any) -> bytes:
    """Check that a writer key obeys `key_problem`'s rule and survives the round trip through a
    member name; return its bytes."""
    if not isinstance(key, str):
        raise SchemaError(f"a key must be a str, got {type(key).__name__}")
    try:
        raw = key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as err:
        raise SchemaError(f"key {key!r} cannot be encoded: {err}") from err
    problem = key_problem(key)
    if problem is not None:
        raise SchemaError(problem)
    if split_key(key + ".jpg") != (key, "jpg") or is_meta(key + ".jpg"):
        raise SchemaError(
            f"key {display_key(key)!r} would not read back: its last part must not start with or contain a "
            "'.', and a first part like '__x__' marks webdataset metadata"
        )
    return raw


def tar_key(name: str) -> str:
    """Return `name` as a key that reads back from a tar: each dot of its last part becomes "_"
    (``n01/img.001`` -> ``n01/img_001``), since there a dot would start the extension.

    Raises:
        SchemaError: the name cannot be a key even so (`key_problem`, or a first part that
            marks webdataset metadata).
    """
    head, slash, last = name.rpartition("/")
    key = head + slash + last.replace(".", "_")
    encode_key(key)
    return key




def member_field(extension: str) -> str | None:
    """Return the field name of members with `extension` (lower-cased): the extension with each
    "." and "-" made "_" and a leading digit prefixed with "_" (``seg.png`` -> ``seg_png``,
    ``0.jpg`` -> ``_0_jpg``), or None if that is no identifier of 1 to 64 characters or is
    image, label, key, offset, size or checksum (such members are counted, not stored)."""
    name = extension.lower().replace(".", "_").replace("-", "_")
    if name[:1].isdigit():
        name = "_" + name
    if not _IDENTIFIER.match(name) or name in _RESERVED_FIELDS:
        return None
    return name


def member_kind(extension: str) -> str:
    """The field type a member with `extension` is stored as unless declared: "str" for text
    (`TEXT_EXTENSIONS`), "json" for ``json``, "bytes" for anything else."""
    extension = extension.lower()
    return "str" if extension in TEXT_EXTENSIONS else "json" if extension == META_EXTENSION else "bytes"
