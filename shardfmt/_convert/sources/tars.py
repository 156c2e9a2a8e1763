"""WebDataset tars as the source of a conversion: which locations name tars, and their samples
as inputs.

Tars are a ``.tar`` file, a brace pattern such as ``shards-{000..009}.tar``, or a folder that
holds ``.tar`` files and no sub-folders (hidden entries aside). Each tar's headers are read
(nothing is extracted) and its members grouped into samples as `tar.scan.scan_samples` does; a
sample's image is its first member with an extension of `TAR_IMAGE_EXTENSIONS` (its content
decides later, as for files), its label the integer in its ``.cls`` member, and its key the
sample key. Classes are the labels in decimal, "0" to the largest. Found here and reported as
rejects instead of inputs: "duplicate-member", "no-image", "no-label", "bad-label"
(spec/tar.md, section 6) for a sample, "corrupt" for a tar that cannot be read as one,
"unreadable" for one the operating system refuses.

Tars are read in place with ``pread``, so they must be local: `TARS_BY_URL` is the refusal of
tars given by URL.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from ..._dataset.tars import tar_sources
from ..._errors import ConvertError, FormatError, ShardNotFoundError
from ...tar._index import parse_label
from ...tar._keys import LABEL_EXTENSION, MAX_LABEL_SIZE, display_key
from ...tar._scan import scan_samples
from .results import ScanReject, SourceFile, SourceScan, describe_os_error, display_path
from .trees import Tree

__all__ = ["TARS_BY_URL", "TAR_IMAGE_EXTENSIONS", "local_tars", "names_tars", "scan_tars", "tars_in_folder"]

TAR_IMAGE_EXTENSIONS: Final = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "pbm", "pnm")
"""Extensions of a tar sample's image member, in order of preference."""
TARS_BY_URL: Final = (
    "WebDataset tars given by URL cannot be a conversion source: tars are read in place with pread, "
    "so copy them to a local folder first (a folder or listing of images may be a URL)"
)


def names_tars(location: str) -> bool:
    """True if `location` (a path or URL, without a query string) names tars: it ends in ``.tar``."""
    return location.rstrip("/").endswith(".tar")


def local_tars(location: str) -> list[Path] | None:
    """The tars a local path or brace pattern names, or None if it names none.

    Raises:
        ConvertError: the pattern names too many tars.
    """
    try:
        return tar_sources(location)
    except ValueError as err:
        raise ConvertError(str(err), path=location) from err


def tars_in_folder(tree: Tree) -> list[str]:
    """The ``.tar`` files of a folder that holds no sub-folders (hidden entries aside), sorted by
    name; empty if it holds a sub-folder or no tar."""
    entries = sorted((entry for entry in tree.entries(None) if not entry.name.startswith(".")), key=lambda entry: entry.name)
    if any(entry.is_dir for entry in entries):
        return []
    return [entry.path for entry in entries if entry.name.endswith(".tar")]


def scan_tars(tars: list[Path]) -> SourceScan:
    """Find the samples of local tars, in tar order (see the module docstring).

    Raises:
        ConvertError: a tar does not exist.
    """
    root = Path(os.path.commonpath([os.path.dirname(os.path.abspath(tar)) for tar in tars]))
    inputs: list[SourceFile] = []
    rejects: list[ScanReject] = []
    max_label = -1
    for tar in tars:
        rel = os.path.relpath(os.path.abspath(tar), root)
        try:
            mtime_ns = os.stat(tar).st_mtime_ns
            samples = scan_samples(tar)
            fd = os.open(tar, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except (ShardNotFoundError, FileNotFoundError) as err:
            raise ConvertError("the tar does not exist", path=tar) from err
        except OSError as err:
            rejects.append(ScanReject(len(inputs), display_path(rel), "unreadable", describe_os_error(err)))
            continue
        except FormatError as err:
            where = f"byte {err.offset}: " if err.offset is not None else ""
            rejects.append(ScanReject(len(inputs), display_path(rel), "corrupt", f"not a readable tar: {where}{err.message}"))
            continue
        try:
            for sample in samples:
                image = next((sample.members[ext] for ext in TAR_IMAGE_EXTENSIONS if ext in sample.members), None)
                label_member = sample.members.get(LABEL_EXTENSION)
                found: int | tuple[str, str]
                if sample.duplicate is not None:
                    found = ("duplicate-member", f"two members with extension {sample.duplicate.extension!r}")
                elif image is None:
                    found = ("no-image", "no member with an image extension (" + ", ".join(TAR_IMAGE_EXTENSIONS) + ")")
                elif label_member is None:
                    found = ("no-label", f"no member with extension {LABEL_EXTENSION!r}")
                else:
                    data = os.pread(fd, min(label_member.size, MAX_LABEL_SIZE + 1), label_member.data_offset)
                    found = parse_label(memoryview(data))
                if image is None or isinstance(found, tuple):
                    reason, detail = found if isinstance(found, tuple) else ("no-image", "")
                    rejects.append(ScanReject(len(inputs), display_path(rel), reason, detail, key=display_key(sample.key)))
                    continue
                max_label = max(max_label, found)
                inputs.append(SourceFile(rel, found, image.size, mtime_ns, offset=image.data_offset, sample_key=sample.key))
        finally:
            os.close(fd)
    classes = tuple(str(label) for label in range(max_label + 1))
    return SourceScan(root, "webdataset", classes, tuple(inputs), tuple(rejects))
