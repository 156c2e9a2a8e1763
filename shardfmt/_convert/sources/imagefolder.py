"""The ImageFolder rules, applied once to any `Tree` (a local walk or a store listing).

Every sub-folder of the root is a class; classes are sorted by name as plain strings and
numbered from 0, as torchvision's ``find_classes`` does. Files are found recursively in each
class folder in the order of torchvision's ``make_dataset``: folders sorted by their path, the
entries of each sorted by name. Every regular file is a candidate; its content, not its name,
decides later whether it is an image. Found here and reported as rejects instead of inputs:

- "hidden": a file or folder whose name starts with "." (a hidden folder is not entered and a
  hidden folder at the root is not a class);
- "no-class": a file directly in the root, which belongs to no class;
- what the tree itself reports ("symlink-loop", "not-a-regular-file", "unreadable": see
  `trees.py`; links are followed, so a linked file elsewhere is read), and a folder
  below the root that cannot be listed ("unreadable").

A class folder with no images keeps its class, so labels stay those torchvision would give.
`scan_folder` walks a folder that holds one field of each record rather than classes, with the
same order and rejects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .results import (
    IMAGE_AND_LABEL,
    RecordField,
    ScannedRecord,
    ScanReject,
    SourceFile,
    SourceScan,
    describe_os_error,
    display_path,
    record_key,
)
from .trees import Entry, Tree

__all__ = ["scan_folder", "scan_imagefolder"]

_HIDDEN = ("hidden", "hidden files and folders are skipped")


def scan_imagefolder(tree: Tree) -> SourceScan:
    """Find the inputs of an ImageFolder tree (see the module docstring).

    Raises:
        ConvertError: the root cannot be listed.
    """
    return _scan(tree, classes=True)


def scan_folder(tree: Tree) -> SourceScan:
    """Find every file of `tree`, recursively, with the order and rejects of an ImageFolder class
    folder: the root's own files first (as ``os.walk`` lists them), then each sub-folder in name
    order: records of one image field.

    Raises:
        ConvertError: the root cannot be listed.
    """
    return _scan(tree, classes=False)


def _scan(tree: Tree, *, classes: bool) -> SourceScan:
    """The root's entries in name order: with `classes`, each folder is a class walked in turn
    and a file is "no-class"; without, the files are inputs and the folders are walked last."""
    walk = _Walk(tree, labelled=classes)
    names: list[str] = []
    folders: list[Entry] = []
    for entry in sorted(tree.entries(None), key=lambda entry: entry.name):
        if _is_hidden(entry):
            walk.reject(entry.path, *_HIDDEN)
        elif entry.is_dir and classes:
            walk.walk(entry, label=len(names))
            names.append(display_path(entry.name))
        elif entry.is_dir:
            folders.append(entry)
        elif classes and entry.reject is None:
            walk.reject(entry.path, "no-class", "a file in the root folder belongs to no class")
        else:
            walk.emit(entry, label=0)
    for entry in folders:
        walk.walk(entry, label=0)
    if classes:
        return SourceScan(tree.root, "imagefolder", IMAGE_AND_LABEL, tuple(names), tuple(walk.inputs), tuple(walk.rejects))
    return SourceScan(tree.root, "folder", (RecordField("image", "jpeg"),), None, tuple(walk.inputs), tuple(walk.rejects))


def _is_hidden(entry: Entry) -> bool:
    return entry.name.startswith(".")


@dataclass
class _Walk:
    tree: Tree
    labelled: bool
    inputs: list[ScannedRecord] = field(default_factory=list)
    rejects: list[ScanReject] = field(default_factory=list)

    def reject(self, path: str, reason: str, detail: str) -> None:
        self.rejects.append(ScanReject(len(self.inputs), display_path(path), reason, detail))

    def emit(self, entry: Entry, *, label: int) -> None:
        if entry.reject is not None:
            self.reject(entry.path, *entry.reject)
        else:
            values = (label,) if self.labelled else ()
            self.inputs.append(ScannedRecord((SourceFile(entry.path, entry.size, entry.version),), values, record_key(entry.path)))

    def walk(self, top: Entry, *, label: int) -> None:
        """Emit the files under folder `top` in torchvision's order: folders sorted by path,
        the entries of each by name."""
        found: list[tuple[str, list[Entry]]] = []
        pending: list[Entry] = []
        if top.reject is None:
            pending.append(top)
        else:
            found.append((top.path, [top]))
        while pending:
            folder = pending.pop()
            try:
                children = self.tree.entries(folder)
            except OSError as err:
                reject = ("unreadable", f"cannot list the folder: {describe_os_error(err)}")
                found.append((folder.path, [Entry(folder.path, folder.path, reject=reject)]))
                continue
            items: list[Entry] = []
            for child in children:
                if _is_hidden(child):
                    items.append(Entry(child.name, child.path, reject=_HIDDEN))
                elif child.is_dir and child.reject is None:
                    pending.append(child)
                else:
                    items.append(child)
            items.sort(key=lambda item: item.name)
            found.append((folder.path, items))
        found.sort(key=lambda pair: pair[0])
        for _, items in found:
            for item in items:
                self.emit(item, label=label)
