"""The package's layers: every import, at module level or inside a function, points down or
sideways within its own layer, and no set of modules imports itself in a circle.

The layers, lowest first::

    base (_errors, _arguments, _checksum, _forks, _jsontext, _sampling/, _version, _synthetic)
    < _storage < format < tar < _dataset < {_convert, ops}
    ops < _loader
    _cli, _demo, _preview, __main__ and the top package's __init__ over everything

convert and ops are separate branches over dataset: neither imports the other, and convert and
loader never import each other. The imports are read with `ast` from the source files, so an
import inside a function counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "shardfmt"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

LAYER_OF_PACKAGE = {
    "_sampling": "base",
    "_storage": "storage",
    "format": "format",
    "tar": "tar",
    "_dataset": "dataset",
    "_convert": "convert",
    "ops": "ops",
    "_loader": "loader",
}
"""Subpackage -> layer; every module of a subpackage lies in that subpackage's layer."""
BASE_MODULES = frozenset({"_errors", "_arguments", "_checksum", "_forks", "_jsontext", "_version", "_synthetic"})
TOP_MODULES = frozenset({"", "_cli", "_demo", "_preview", "__main__"})
"""Modules directly in the package that may import any layer ("" is the package itself)."""

MAY_IMPORT = {
    "base": {"base"},
    "storage": {"base", "storage"},
    "format": {"base", "storage", "format"},
    "tar": {"base", "storage", "format", "tar"},
    "dataset": {"base", "storage", "format", "tar", "dataset"},
    "convert": {"base", "storage", "format", "tar", "dataset", "convert"},
    "ops": {"base", "storage", "format", "tar", "dataset", "ops"},
    "loader": {"base", "storage", "format", "tar", "dataset", "ops", "loader"},
    "top": {"base", "storage", "format", "tar", "dataset", "convert", "ops", "loader", "top"},
}
"""Layer -> the layers its modules may import from."""


def module_name(path: Path) -> str:
    """Return the dotted name of the module in `path` ("shardfmt.format._reader")."""
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def layer(module: str) -> str:
    """Return the layer of a module of the package."""
    parts = module.split(".")[1:]
    if parts and parts[0] in LAYER_OF_PACKAGE:
        return LAYER_OF_PACKAGE[parts[0]]
    name = parts[0] if parts else ""
    if name in BASE_MODULES:
        return "base"
    if name in TOP_MODULES:
        return "top"
    raise AssertionError(f"module {module} lies in no layer: add it to test_layers.py")


def imported_modules(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """Yield (module of the package imported, line) for every import in `path`, at any depth."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    yield _known(alias.name), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = module.split(".")
                if not is_package:
                    anchor.pop()
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base != PACKAGE and not base.startswith(PACKAGE + "."):
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield (submodule if submodule in MODULES else _known(base)), node.lineno


def _known(name: str) -> str:
    if name not in MODULES:
        raise AssertionError(f"import of {name}, which is no module of the package")
    return name


def import_graph() -> dict[str, dict[str, int]]:
    """Return module -> {imported module: first line that imports it}."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in MODULES.items():
        edges: dict[str, int] = {}
        for target, line in imported_modules(module, path):
            if target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


GRAPH = import_graph()


def checked_edges() -> dict[str, dict[str, int]]:
    """The import graph every rule is checked on: all of it, without exceptions."""
    return GRAPH


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Return the strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_every_module_lies_in_a_layer() -> None:
    assert {module: layer(module) for module in MODULES}  # raises, naming a module outside the layers
    assert layer("shardfmt.format._reader") == "format" and layer("shardfmt") == "top"


def test_the_walk_sees_imports_inside_functions_and_relative_ones() -> None:
    # storage/__init__.py imports FsspecStore inside `open_store`; tar/reader.py imports relatively
    # from two levels up; the top package imports the loader inside `__getattr__`.
    assert "shardfmt._storage.remote" in GRAPH["shardfmt._storage"]
    assert "shardfmt.format._reader" in GRAPH["shardfmt.tar._reader"]
    assert "shardfmt._loader" in GRAPH["shardfmt"]


def test_no_import_from_a_higher_layer() -> None:
    broken = [
        f"{module} (line {line}, layer {layer(module)}) imports {target} (layer {layer(target)})"
        for module, edges in checked_edges().items()
        for target, line in edges.items()
        if layer(target) not in MAY_IMPORT[layer(module)]
    ]
    assert broken == []


def test_no_import_cycle() -> None:
    graph = checked_edges()
    described = [
        " -> ".join(f"{module} (imports {', '.join(t for t in graph[module] if t in cycle)})" for module in cycle)
        for cycle in cycles(graph)
    ]
    assert described == []


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 9}, "d": {"a": 1}}
    assert cycles(graph) == [["a", "b", "c"]]


TORCH_LAYERS = frozenset({"ops", "loader"})
"""The layers whose modules may import torch (the ``shardfmt[torch]`` extra): converting, reading
and verifying import none of them, so they work without torch (tests/test_torchless.py runs them)."""


def torch_imports(path: Path) -> list[int]:
    """Return the lines of `path` that import torch or a module of it, at any depth."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name == "torch" or name.startswith("torch.") for name in names):
            lines.append(node.lineno)
    return lines


def test_only_the_torch_layers_import_torch() -> None:
    # The top package names torch only in `__getattr__`, through the loader, never importing it.
    found = {module: torch_imports(path) for module, path in MODULES.items()}
    assert {module: lines for module, lines in found.items() if lines and layer(module) not in TORCH_LAYERS} == {}
    assert found["shardfmt.ops"] != [] and found["shardfmt._loader.core"] != []
