"""Griffe extension for the API page: a docstring entry that documents several parameters at once
("store, scale, patch: how images are stored") becomes one entry per parameter, each with the
type and default of its signature.

The docstrings name related arguments together (the house style); mkdocstrings matches a
documented name to the signature one for one, so a grouped entry matched nothing and its
parameters were shown as "required" with no type.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

GROUPED = re.compile(r"^\s+\w+(?:, \w+)+:", re.MULTILINE)
"""A docstring line that starts an entry for several names."""


class SplitGroupedParameters(griffe.Extension):
    """Split "a, b: text" entries of Parameters sections, once the package is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[str] = set()
        for obj in _walk(pkg, seen):
            _split(obj)


def _walk(obj: griffe.Object, seen: set[str]) -> Any:
    if obj.path in seen:
        return
    seen.add(obj.path)
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member, seen)  # type: ignore[arg-type]


def _split(obj: griffe.Object) -> None:
    parameters = getattr(obj, "parameters", None)
    if obj.docstring is None or parameters is None or not GROUPED.search(obj.docstring.value):
        return  # parsed only where there is something to split: mkdocstrings parses what it renders
    for section in obj.docstring.parsed:
        if section.kind is not griffe.DocstringSectionKind.parameters:
            continue
        entries: list[griffe.DocstringParameter] = []
        for entry in section.value:
            names = [name.strip() for name in entry.name.split(",")]
            if len(names) == 1:
                entries.append(entry)
                continue
            for name in names:
                signature = parameters[name] if name in parameters else None
                entries.append(griffe.DocstringParameter(
                    name, description=entry.description,
                    annotation=signature.annotation if signature is not None else entry.annotation,
                    value=signature.default if signature is not None else None,
                ))
        section.value = entries
