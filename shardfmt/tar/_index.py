"""The member index: a binary shard beside each tar that makes the tar readable like a binary shard
(spec/tar.md, "The member index"), and `index_tar`, which writes one for an existing tar."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .._checksum import Hasher, checksum
from .._storage import ByteSource, open_source
from ..format._fieldtypes import JpegType
from ..format._jpeg import is_jpeg, read_jpeg_info
from ..format._layout import MAX_CLASSES, MAX_FIELD_SIZE
from ..format._schema import Schema
from ..format._writer import ShardInfo, ShardWriter
from ._keys import (
    ANY_IMAGE_EXTENSIONS,
    IMAGE_EXTENSIONS,
    INDEX_SUFFIX,
    LABEL_EXTENSION,
    MAX_LABEL_SIZE,
    MAX_MEMBER_SIZE,
    display_key,
)
from ._scan import TarMember, TarSample, scan_members

INDEX_SCHEMA: Final = Schema.of(
    key="bytes",
    image_offset="int64",
    image_size="int64",
    image_height="int64",
    image_width="int64",
    image_channels="int64",
    image_checksum="int64",
    label="int64",
    members="json",
)
"""The schema of a member index: one record per sample, in the order samples first appear.

`label` is -1 in a tar whose samples have no label member (an unlabelled tar).

`key` holds the key's bytes as they are in the member names; `image_offset` and `image_size` the
span of the image member's data in the tar; `image_checksum` its XXH3-64 as a two's-complement
int64; `members` every member of the sample as ``{extension: [data offset, size, XXH3-64]}``, the
checksum as an unsigned integer (an index written before member checksums has
``[data offset, size]`` spans, read with those members unchecked)."""


def index_path_for(tar_path: str | os.PathLike[str]) -> Path:
    """Return where the member index of `tar_path` lies by default: ``NAME.tar.idx`` beside it."""
    tar_path = Path(tar_path)
    return tar_path.with_name(tar_path.name + INDEX_SUFFIX)


@dataclass(frozen=True)
class TarReject:
    """A sample of a tar that the index leaves out, and why (reason codes in spec/tar.md)."""

    path: str
    key: str
    reason: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "key": display_key(self.key), "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True)
class TarIndexInfo:
    """What `index_tar` found: the tar (size, whole-file XXH3-64, records), the index written,
    the samples left out, the largest label (-1 without records), the members skipped (no key,
    or webdataset metadata), whether the samples are labelled, and how many kept samples have a
    member of each extension besides their image and label (the candidates for fields)."""

    tar: ShardInfo
    index: ShardInfo
    rejects: tuple[TarReject, ...]
    max_label: int
    skipped_members: int
    labelled: bool = True
    member_counts: tuple[tuple[str, int], ...] = ()
    has_labels: bool = True
    """Whether any sample of the tar has a label member (whatever `labelled` was asked)."""


def _image_problem(data: memoryview) -> tuple[str, str] | tuple[int, int, int]:
    """Return (height, width, channels) of a storable JPEG, or (reason, detail)."""
    if len(data) == 0:
        return ("empty", "the image member is empty")
    if len(data) > MAX_FIELD_SIZE:
        return ("too-large", f"the image member is {len(data)} bytes, over the limit of {MAX_FIELD_SIZE}")
    if not is_jpeg(data):
        return ("not-a-jpeg", "the image member does not start with a JPEG start-of-image marker")
    try:
        info = read_jpeg_info(data)
    except ValueError as err:
        return ("corrupt", str(err))
    problem = JpegType.unstorable(info)
    if problem is not None:
        return ("unsupported-jpeg", problem)
    return (info.height, info.width, info.components)


def parse_label(data: memoryview) -> int | tuple[str, str]:
    """Return the label a ``.cls`` member holds (Python int() of its bytes, as webdataset decodes
    it), or (reason, detail)."""
    if len(data) > MAX_LABEL_SIZE:
        return ("bad-label", f"the label member is {len(data)} bytes, over {MAX_LABEL_SIZE}")
    try:
        value = int(bytes(data))
    except ValueError:
        return ("bad-label", f"{bytes(data)!r} is not a decimal integer")
    if not 0 <= value < MAX_CLASSES:
        return ("bad-label", f"label {value} is outside [0, {MAX_CLASSES})")
    return value


def _member_problem(sample: TarSample, image_ext: str | None, image_extensions: tuple[str, ...]) -> tuple[str, str] | None:
    """Why a sample's members cannot make a record (before any byte is read), or None."""
    if sample.duplicate is not None:
        return "duplicate-member", f"two members with extension {display_key(sample.duplicate.extension)!r}"
    if len({display_key(ext) for ext in sample.members}) < len(sample.members):
        return "duplicate-member", "two extensions that read the same once bytes that are not UTF-8 are written as \\xNN"
    if image_ext is not None:
        large = next((m for ext, m in sample.members.items() if ext != image_ext and m.size > MAX_MEMBER_SIZE), None)
        if large is not None:
            return (
                "too-large",
                f"the member .{display_key(large.extension)} is {large.size} bytes, over the member limit of {MAX_MEMBER_SIZE}",
            )
    if image_ext is None:
        other = next((ext for ext in ANY_IMAGE_EXTENSIONS if ext in sample.members), None)
        if other is None:
            return "no-image", f"no member with extension {' or '.join(image_extensions)}"
        return (
            "not-a-jpeg",
            f"the image member is .{other}: a tar read in place serves JPEGs; convert the tars (shardfmt convert) to store it",
        )
    return None


_Digests = dict[tuple[int, str], int]
"""The XXH3-64 of each member of the samples read, by (sample number, extension)."""


def _read_members(
    source: ByteSource, roles: list[tuple[TarMember, int, str]]
) -> tuple[dict[int, tuple[TarMember, tuple[str, str] | tuple[int, int, int], int]], dict[int, int | tuple[str, str]], _Digests, Hasher]:
    """One sequential pass over the tar: hash all of it and, on the way, each member of a sample
    that may make a record (its XXH3-64), its image (JPEG header or problem) and label member."""
    images: dict[int, tuple[TarMember, tuple[str, str] | tuple[int, int, int], int]] = {}
    labels: dict[int, int | tuple[str, str]] = {}
    digests: _Digests = {}
    hasher = Hasher()
    hashed = 0
    for member, number, role in sorted(roles, key=lambda role: role[0].data_offset):  # in file order
        stop = member.data_offset + member.size
        hasher.update(source.read(hashed, stop))
        hashed = stop
        data = source.read(member.data_offset, stop)
        digest = digests[number, member.extension] = checksum(data)
        if role == "label":
            labels[number] = parse_label(data)
        elif role == "image":
            images[number] = (member, _image_problem(data), digest)
    hasher.update(source.read(hashed, source.size))
    return images, labels, digests, hasher


def _record_problem(
    image: tuple[str, str] | tuple[int, int, int], label: int | tuple[str, str] | None, label_extension: str, *, labelled: bool
) -> tuple[str, str] | None:
    """Why a sample's image and label members cannot make a record, the image's problem first."""
    if isinstance(image[0], str):
        return str(image[0]), str(image[1])
    if not labelled:
        return None
    if label is None:
        return "no-label", f"no member with extension {label_extension!r}"
    if not isinstance(label, int):
        return label
    return None


_Kept = tuple[TarMember, tuple[int, int, int], int, int]
"""A sample that makes a record: its image member, (height, width, channels), checksum and label."""


def _choose_members(
    samples: Sequence[TarSample], image_extensions: tuple[str, ...], label_extension: str, *, labelled: bool
) -> tuple[dict[int, tuple[str, str]], dict[int, str], list[tuple[TarMember, int, str]]]:
    """Each sample's problem with its members, or its image extension and the members to read (image, label)."""
    problems: dict[int, tuple[str, str]] = {}
    chosen: dict[int, str] = {}
    roles: list[tuple[TarMember, int, str]] = []
    for number, sample in enumerate(samples):
        image_ext = next((ext for ext in image_extensions if ext in sample.members), None)
        problem = _member_problem(sample, image_ext, image_extensions)
        if problem is not None:
            problems[number] = problem
        elif image_ext is not None:  # always so when there is no problem
            chosen[number] = image_ext
            for ext, member in sample.members.items():
                role = "image" if ext == image_ext else "label" if labelled and ext == label_extension else "member"
                roles.append((member, number, role))
    return problems, chosen, roles


def _judge_records(
    images: dict[int, tuple[TarMember, tuple[str, str] | tuple[int, int, int], int]],
    labels: dict[int, int | tuple[str, str]],
    label_extension: str,
    *,
    labelled: bool,
    problems: dict[int, tuple[str, str]],
) -> dict[int, _Kept]:
    """Add to `problems` the samples whose image or label member is bad; return the others."""
    kept: dict[int, _Kept] = {}
    for number, (member, found, digest) in images.items():  # image problems come before label problems
        label = labels.get(number)
        problem = _record_problem(found, label, label_extension, labelled=labelled)
        if problem is not None:
            problems[number] = problem
        elif len(found) == 3:  # always so when there is no problem, as is an int label when labelled
            kept[number] = (member, found, digest, label if labelled and isinstance(label, int) else -1)
    return kept


def _write_index(
    index_path: Path,
    samples: Sequence[TarSample],
    kept: dict[int, _Kept],
    chosen: dict[int, str],
    digests: _Digests,
    label_extension: str,
    *,
    labelled: bool,
) -> tuple[ShardInfo, int, dict[str, int]]:
    """Write a record per kept sample; return the index written, the largest label and the other members' counts."""
    max_label = -1
    counts: dict[str, int] = {}
    with ShardWriter(index_path, schema=INDEX_SCHEMA) as writer:
        for number, sample in enumerate(samples):
            if number not in kept:
                continue
            image, (height, width, channels), digest, label = kept[number]
            max_label = max(max_label, label)
            for ext in sample.members:
                if ext != chosen[number] and not (labelled and ext == label_extension):
                    counts[display_key(ext)] = counts.get(display_key(ext), 0) + 1
            writer.write(
                {
                    "key": sample.key.encode("utf-8", "surrogateescape"),
                    "image_offset": image.data_offset,
                    "image_size": image.size,
                    "image_height": height,
                    "image_width": width,
                    "image_channels": channels,
                    "image_checksum": digest - (1 << 64) if digest >= 1 << 63 else digest,
                    "label": label,
                    # the index's JSON is UTF-8: an extension's bytes that are not are written as \xNN
                    "members": {display_key(ext): [m.data_offset, m.size, digests[number, ext]] for ext, m in sample.members.items()},
                }
            )
        index_info = writer.close()
    return index_info, max_label, counts


def index_tar(
    path: str | os.PathLike[str],
    *,
    index: str | os.PathLike[str] | None = None,
    name: str | None = None,
    image_extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
    label_extension: str = LABEL_EXTENSION,
    labelled: bool | None = None,
) -> TarIndexInfo:
    """Build the member index of a tar (ours or anyone's), reading every byte of it once.

    The headers are parsed first (USTAR, PAX and GNU long names, through Python's tarfile, on a
    memory map: nothing is extracted); then one sequential pass hashes the whole file and, on the
    way, every member of each sample (XXH3-64), its image member's JPEG header and its label.

    A sample is left out, as a `TarReject`, when it has two members with one extension
    ("duplicate-member"), no member with an extension of `image_extensions` ("no-image"), a
    member besides the image over MAX_MEMBER_SIZE ("too-large"), an image member that is empty,
    too large, not a JPEG, damaged in its headers or not storable
    ("empty", "too-large", "not-a-jpeg", "corrupt", "unsupported-jpeg"; an image of another
    format, such as ``KEY.png``, is "not-a-jpeg": convert such tars), or, in a labelled tar, no
    valid label member ("no-label", "bad-label"). A tar is labelled when any of its samples has a
    label member (or as `labelled` says); an unlabelled tar's index holds label -1.

    Args:
        path: the tar file, uncompressed.
        index: where to write the index; default ``NAME.tar.idx`` beside the tar.
        name: how rejects name the tar (default: `path` as given).
        image_extensions: image member extensions, lower-case, in order of preference.
        label_extension: the label member's extension, lower-case.
        labelled: whether samples must have a label; None: if any sample has a label member.

    Returns:
        A `TarIndexInfo`.

    Raises:
        ShardNotFoundError: the tar does not exist.
        FormatError: the tar is malformed: not a tar, compressed, a bad header, a member past the
            end of the file, or non-zero bytes after the end-of-archive blocks.
        LimitError: the tar is over MAX_SHARD_SIZE or has over MAX_RECORDS_PER_SHARD samples.
    """
    source = open_source(os.fspath(path))
    try:
        scan = scan_members(source)
        shown = source.path if name is None else name
        has_labels = any(label_extension in sample.members for sample in scan.samples)
        if labelled is None:
            labelled = has_labels
        problems, chosen, roles = _choose_members(scan.samples, image_extensions, label_extension, labelled=labelled)
        images, labels, digests, hasher = _read_members(source, roles)
        kept = _judge_records(images, labels, label_extension, labelled=labelled, problems=problems)
        index_path = index_path_for(path) if index is None else Path(index)
        index_info, max_label, counts = _write_index(index_path, scan.samples, kept, chosen, digests, label_extension, labelled=labelled)
        tar = ShardInfo(Path(source.path), index_info.num_records, source.size, hasher.intdigest())
        rejects = tuple(TarReject(shown, scan.samples[n].key, *problems[n]) for n in sorted(problems))
        return TarIndexInfo(tar, index_info, rejects, max_label, scan.skipped, labelled, tuple(sorted(counts.items())), has_labels)
    finally:
        source.close()
