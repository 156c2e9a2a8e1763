"""Where a loader's dataset is (`loader_path`) and how its workers may start to read it
(`worker_start_method`)."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from pathlib import Path

from .._arguments import check_path
from .._dataset.locate import classify_location
from .._sampling.mixture import Mixture
from .._storage import expand_user
from .._storage.remote import forks_safely

__all__ = ["loader_path", "worker_start_method"]


def loader_path(path: Mixture | str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Mixture | str | Path | list[str]:
    """A list of tars as strings, a URL as given, a local path as a `Path` (``file://`` stripped,
    ``~`` expanded).

    Raises:
        TypeError: `path` is none of these (a str, an `os.PathLike`, a list or tuple, a `Mixture`).
        ValueError: a path longer than `_arguments.MAX_PATH_LENGTH` bytes or with a part
            longer than `_arguments.MAX_NAME_LENGTH`.
    """
    if isinstance(path, Mixture):
        return path
    path = expand_user(path)
    if isinstance(path, (list, tuple)):
        for item in path:
            if not isinstance(item, (str, os.PathLike)):
                raise TypeError(f"path must be a str or os.PathLike, a list or tuple of them, or a Mixture, got a list holding {item!r}")
            check_path("path", item)
        return [os.fspath(p) for p in path]
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, a list or tuple of them, or a Mixture, got {type(path).__name__}")
    check_path("path", path)
    where = classify_location(path)
    return where.url if where.url is not None else Path(where.path or where.text)


def worker_start_method(path: Mixture | str | Path | list[str], start_method: str | None) -> str | None:
    """The start method of the workers: `start_method` as given, except for a dataset that a
    forked worker cannot read (`forks_safely`: ``gs://`` through gcsfs's gRPC): there the
    platform's default of fork becomes forkserver (spawn where there is none).

    Raises:
        ValueError: `start_method` is ``"fork"`` for such a dataset.
    """
    paths = path.paths if isinstance(path, Mixture) else [path]
    locations = [os.fspath(p) for item in paths for p in (item if isinstance(item, (list, tuple)) else [item])]
    unsafe = next((location for location in locations if not forks_safely(location)), None)
    if unsafe is None:
        return start_method
    if start_method == "fork":
        raise ValueError(
            f"start_method='fork' cannot read {unsafe}: gcsfs reads it over gRPC, whose state does not "
            "survive fork (the workers would abort or hang); pass 'forkserver' or 'spawn', or None to have forkserver"
        )
    if start_method is None and multiprocessing.get_start_method(allow_none=False) == "fork":
        return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    return start_method
