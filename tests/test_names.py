"""Every dotted name written in backticks names something that exists.

What is checked: each ``a.b`` or ``a.b.c`` (identifiers joined by dots, optionally followed by
``()``) inside single or double backticks, in every docstring of the package (modules, classes,
functions and the string that follows an assignment) and in the inline code of ``docs/**/*.md``
(fenced blocks are code, run by their own tests); and every ``path: function`` hop of the maps in
docs/internals.md (the file exists and defines that function or ``Class.method``).

The resolution rule. The first component is looked up, in this order:

1. in a docstring, ``self`` is the class the docstring lies in;
2. in a docstring, a name the module defines or imports (``Cursor.set_epoch`` in a module that
   imports `Cursor`), imports under ``TYPE_CHECKING`` included;
3. in a docstring, a module or package beside the module, then one beside each enclosing package up
   to ``shardfmt`` itself (``cursor.Cursor`` in ``shardfmt/_loader/`` is
   ``shardfmt._loader.cursor.Cursor``; ``tar.keys.tar_key`` in ``shardfmt/_convert/`` is
   ``shardfmt.tar._keys.tar_key``; ``Loader.state_dict`` anywhere is ``shardfmt.Loader.state_dict``);
   in docs/, the name ``shardfmt`` and the names of the top package;
4. a module outside the package, imported by that name or by a conventional alias (`ALIASES`);
5. an instance named as the codebase names it (`INSTANCES`: ``loader.sampler`` is read on `Loader`).

A module may be written with or without its leading underscore, as the codebase writes them
(``tar.keys`` and ``tar._keys`` both name ``shardfmt.tar._keys``); every other component must be
an attribute: of a module (or one of its submodules), or of a class, where an attribute set on
``self`` in a method, an annotated field or a slot counts as the class's, and a property leads
to the class its return annotation names (``loader.dataset.classes``). Names in the libraries of
`NOT_IMPORTED` are recognised by their first component only, each for the reason given there.
Not names, and skipped:
file names (the last component a file suffix, `FILE_SUFFIXES`: ``manifest.json``, ``trees.py``),
member-name patterns whose first component is a capitalised placeholder (``KEY.jpg``,
``NAME.tar.idx``), and the few written in `NOT_NAMES` with the reason each is not a name.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "shardfmt"
IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
REFERENCE = re.compile(r"(?<!`)(``?)(" + IDENTIFIER + r"(?:\." + IDENTIFIER + r")+)(?:\(\))?\1(?!`)")
"""A dotted name in single or double backticks (not the edge of a triple-backtick fence)."""

FILE_SUFFIXES = frozenset({"py", "json", "jsonl", "md", "idx", "tar", "shard", "csv", "parquet", "jpg", "png", "cls", "txt"})
PLACEHOLDERS = frozenset({"KEY", "NAME"})
"""Capitalised placeholders of member and file names (``KEY.jpg``: any key with that extension)."""

ALIASES = {"np": "numpy", "wds": "webdataset", "T": "torchvision.transforms"}
"""Conventional import aliases the text uses (``T`` as in ``import torchvision.transforms as T``)."""

INSTANCES = {
    "loader": "shardfmt.Loader",
    "ds": "shardfmt.DatasetReader",
    "fs": "fsspec.AbstractFileSystem",
    "accelerator": "accelerate.Accelerator",
}
"""Instances the text names by their usual variable name -> the class their attributes are read on."""

NOT_NAMES = {
    "converter.options": "a key of manifest.json (the conversion's options), not a Python name",
    "dataset.classes": "torchvision's ImageFolder's attribute, in the migration table's torchvision column",
    "dataset.class_to_idx": "torchvision's ImageFolder's attribute, in the migration table's torchvision column",
    "stats.members_not_stored": "a key of manifest.json's stats object, not a Python name",
    "stats.empty_classes": "a key of manifest.json's stats object, not a Python name",
    "key.offset": "a field of a tar index entry (spec/tar.md), not a Python name",
    "key.size": "a field of a tar index entry (spec/tar.md), not a Python name",
    "image.reserved": "a field of a tar index entry (spec/tar.md), not a Python name",
    "bench_steps.albumentations_equivalents": "a function of tools/bench_steps.py, a script outside the package",
    "beta.ppf": "scipy.stats.beta's quantile function, named as the text around it introduces it",
}
"""References that are not names of an object, each with the reason."""

NOT_IMPORTED = {
    "torchvision": "not installed by the test extra",
    "torchdata": "not installed by the test extra",
    "ffcv": "not installed by the test extra",
    "lightning": "its import takes about 15 s",
    "accelerate": "its import takes about 5 s",
}
"""Libraries the text compares with whose names are not resolved (a name in one of them is only
recognised by its first component), each with the reason."""


@dataclass(frozen=True)
class Reference:
    where: str  # "shardfmt/_loader/core.py:12" or "docs/loading.md:40"
    text: str
    module: str | None  # the module whose docstring holds it; None in docs/
    cls: str | None  # the qualified name of the class the docstring lies in


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _docstrings(tree: ast.Module) -> Iterator[tuple[ast.Constant, str | None]]:
    """Yield (docstring node, qualified name of the enclosing class or None)."""

    def visit(node: ast.AST, cls: str | None) -> Iterator[tuple[ast.Constant, str | None]]:
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for statement in body:
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) and isinstance(statement.value.value, str):
                    yield statement.value, cls
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield from visit(child, f"{cls}.{child.name}" if cls else child.name)
            else:
                yield from visit(child, cls)

    yield from visit(tree, None)


def package_references() -> Iterator[Reference]:
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        name = module_name(path)
        for node, cls in _docstrings(tree):
            for match in REFERENCE.finditer(node.value):
                line = node.lineno + node.value.count("\n", 0, match.start())
                yield Reference(f"{path.relative_to(ROOT)}:{line}", match.group(2), name, cls)


def docs_references() -> Iterator[Reference]:
    for path in sorted((ROOT / "docs").rglob("*.md")):
        fenced = False
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if not fenced:
                for match in REFERENCE.finditer(line):
                    yield Reference(f"{path.relative_to(ROOT)}:{number}", match.group(2), None, None)


@functools.cache
def imported_names(module: str) -> dict[str, str]:
    """Return name -> dotted origin for every name `module` defines or imports, at any depth."""
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    is_package = not path.exists()
    if is_package:
        path = PACKAGE.parent / module.replace(".", "/") / "__init__.py"
    names: dict[str, str] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            anchor = module.split(".")
            if node.level:
                if not is_package:
                    anchor.pop()
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    names.setdefault(alias.name.split(".")[0], alias.name.split(".")[0])
    return names


@functools.cache
def _import(name: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is not None and (name == error.name or name.startswith(error.name + ".")):
            return None
        raise


@functools.cache
def _instance_attributes(cls: type) -> set[str]:
    """Names set on ``self`` in the methods of `cls` and its bases, its annotations and slots."""
    found: set[str] = set()
    for klass in cls.__mro__:
        if klass is object or klass.__module__ == "builtins":
            continue
        found.update(getattr(klass, "__annotations__", {}))
        slots = klass.__dict__.get("__slots__", ())
        found.update([slots] if isinstance(slots, str) else slots)
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        tree = ast.parse(inspect.cleandoc("\n" + source) if source[:1].isspace() else source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id == "self":
                    found.add(node.attr)
    return found


def _child(obj: Any, part: str) -> Any:
    """The attribute `part` of `obj` (a submodule, with or without a leading underscore, for a
    module), or None."""
    if isinstance(obj, types.ModuleType):
        if part in vars(obj) or hasattr(obj, part):
            return getattr(obj, part)
        if hasattr(obj, "__path__"):
            for candidate in (part, "_" + part):
                found = _import(f"{obj.__name__}.{candidate}")
                if found is not None:
                    return found
        return None
    if inspect.isclass(obj):
        if hasattr(obj, part):
            return getattr(obj, part)
        return _Named(part) if part in _instance_attributes(obj) else None
    if isinstance(obj, _Named):
        return None  # an instance attribute's own attributes are not followed
    if isinstance(obj, property):
        returned = _returned_class(obj)
        return None if returned is None else _child(returned, part)
    return getattr(obj, part, None)


def _returned_class(prop: property) -> type | None:
    """The class a property's return annotation names, where it names one class."""
    try:
        returned = typing.get_type_hints(prop.fget).get("return")
    except (NameError, TypeError):
        return None
    return returned if inspect.isclass(returned) else None


class _Named:
    """An attribute known only by name (set on ``self``): found, with nothing to follow."""

    def __init__(self, name: str) -> None:
        self.name = name


def _follow(start: Any, parts: list[str]) -> bool:
    obj = start
    for part in parts:
        obj = _child(obj, part)
        if obj is None:
            return False
    return True


def _dotted(name: str) -> Any:
    """The object a fully dotted name ("shardfmt._loader.cursor.Cursor") names, or None."""
    parts = name.split(".")
    top = _import(parts[0])
    if top is None:
        return None
    obj: Any = top
    for part in parts[1:]:
        obj = _child(obj, part)
        if obj is None:
            return None
    return obj


def _starts(ref: Reference) -> Iterator[Any]:
    """The objects the first component of `ref` may name, by the rule of the module docstring."""
    first = ref.text.split(".")[0]
    if ref.module is not None:
        if first == "self" and ref.cls is not None:
            yield _dotted(f"{ref.module}.{ref.cls}")
        origin = imported_names(ref.module).get(first)
        if origin is not None:
            yield _dotted(origin)
        own = _dotted(ref.module)
        if own is not None and hasattr(own, first) and not isinstance(getattr(own, first), types.ModuleType):
            yield getattr(own, first)
        package = ref.module.split(".")
        if not hasattr(_dotted(ref.module), "__path__"):
            package.pop()
        while package:
            yield _child(_dotted(".".join(package)), first)
            package.pop()
    yield _import("shardfmt") if first == "shardfmt" else _child(_import("shardfmt"), first)
    yield _import(ALIASES.get(first, first))
    if first in INSTANCES:
        yield _dotted(INSTANCES[first])


def skipped(text: str) -> str | None:
    """Why `text` is not a name to resolve, or None."""
    parts = text.split(".")
    if parts[0] in PLACEHOLDERS:
        return "a member-name pattern"
    if parts[-1] in FILE_SUFFIXES:
        return "a file name"
    if text in NOT_NAMES:
        return NOT_NAMES[text]
    library = (ALIASES.get(parts[0]) or INSTANCES.get(parts[0]) or parts[0]).split(".")[0]
    if library in NOT_IMPORTED:
        return f"a name in {library}, which the test does not import: {NOT_IMPORTED[library]}"
    return None


def resolves(ref: Reference) -> bool:
    rest = ref.text.split(".")[1:]
    return any(start is not None and _follow(start, rest) for start in _starts(ref))


REFERENCES = list(package_references()) + list(docs_references())


@pytest.mark.slow  # about 12 s alone: it imports torch, datasets and pyarrow to resolve their names
def test_every_backticked_dotted_name_resolves() -> None:
    checked = [ref for ref in REFERENCES if skipped(ref.text) is None]
    broken = [f"{ref.where}: `{ref.text}`" for ref in checked if not resolves(ref)]
    assert broken == []
    assert len(checked) >= 300  # the walk finds the references (305 when this test was written)


@pytest.mark.parametrize(
    ("text", "module", "expected"),
    [
        ("cursor.Cursor", "shardfmt._loader.core", True),  # a sibling module
        ("tar.keys.tar_key", "shardfmt._convert.records", True),  # beside an enclosing package, no underscore
        ("tar._keys.tar_key", "shardfmt._convert.records", True),  # the same with its underscore
        ("Loader.state_dict", "shardfmt._sampling.orders", True),  # a name of the top package
        ("loader.sampler", None, True),  # an instance, read on its class
        ("torch.utils.data.DataLoader", None, True),
        ("sampling.sample_batches", "shardfmt._loader.core", False),  # a module the renames removed
        ("cursor.Cursor.no_such_method", "shardfmt._loader.core", False),
        ("shardfmt.ops.NoSuchStep", None, False),
    ],
)
def test_the_rule(text: str, module: str | None, expected: bool) -> None:
    assert resolves(Reference("here", text, module, None)) is expected


def test_the_skipped_are_not_names() -> None:
    assert [skipped(text) for text in ("manifest.json", "KEY.jpg", "NAME.tar.idx", "T.ToTensor", "shardfmt.Loader")] == [
        "a file name", "a member-name pattern", "a member-name pattern",
        "a name in torchvision, which the test does not import: not installed by the test extra", None]
    assert not any(name in dir(builtins) for name in INSTANCES)


HOP = re.compile(r"`(shardfmt/[A-Za-z0-9_/]+\.py): (" + IDENTIFIER + r"(?:\." + IDENTIFIER + r")*)`")
"""A hop of the maps in docs/internals.md: ``path/to/module.py: function`` or ``: Class.method``."""
INTERNALS = ROOT / "docs" / "internals.md"


def defines(path: Path, qualified: str) -> bool:
    """Whether the module at `path` defines `qualified` (a function or class at its top level, or
    a method or class nested in such a class)."""
    body: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    for part in qualified.split("."):
        found = [node for node in body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == part]
        if not found:
            return False
        body = found[0].body
    return True


def section(title: str) -> str:
    text = INTERNALS.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_every_hop_of_the_maps_is_defined_where_it_says() -> None:
    hops = HOP.findall(INTERNALS.read_text(encoding="utf-8"))
    broken = [f"{path}: {name}" for path, name in hops if not (ROOT / path).is_file() or not defines(ROOT / path, name)]
    assert broken == []
    assert len(hops) >= 30  # the walk finds the hops (31 when this test was written)


def test_a_batch_is_followed_in_at_most_eight_hops() -> None:
    steps = [HOP.search(line) for line in section("Life of a batch").splitlines() if re.match(r"\d+\. ", line)]
    assert [(step.group(1), step.group(2)) for step in steps if step is not None][0] == ("shardfmt/_loader/core.py", "Loader.__iter__")
    assert len(steps) == 8 and all(steps)
    conversion = [line for line in section("Life of a conversion").splitlines() if re.match(r"\d+\. ", line)]
    assert conversion[0].startswith("1. `shardfmt/_cli.py: convert_command`")
    assert conversion[-1].startswith("9. `shardfmt/_convert/destination.py: Output.finish`")


def test_the_hop_check_fails_on_a_missing_method() -> None:
    assert defines(ROOT / "shardfmt/_loader/scheduler.py", "Scheduler.hand_out")
    assert not defines(ROOT / "shardfmt/_loader/scheduler.py", "Scheduler.no_such_method")
    assert not defines(ROOT / "shardfmt/_loader/scheduler.py", "hand_out")  # a method, not a function of the module
