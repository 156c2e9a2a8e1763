"""Whether an object of the caller's reaches the loader's workers: a worker started by spawn or
forkserver receives its config pickled, so everything in it must pickle; forked workers inherit
it as it is."""

from __future__ import annotations

import pickle
from typing import Any

__all__ = ["check_sendable"]


def check_sendable(name: str, value: Any, *, workers: int, start_method: str) -> None:
    """Refuse `value` (the argument `name`) if workers started by `start_method` cannot receive
    it: with workers that are not forked, it must pickle.

    Raises:
        TypeError: it cannot be pickled, naming the argument, the start method and the fix.
    """
    if not workers or start_method == "fork":
        return
    try:
        pickle.dumps(value)
    except Exception as err:
        raise TypeError(
            f"{name} {value!r} cannot be pickled, which the {start_method!r} start method needs to send it to the workers "
            f"({type(err).__name__}: {err}); define its class at the top level of a module (not in a function)"
        ) from err
