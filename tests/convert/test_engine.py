"""The local process pool behind `imap_ordered`: results in order, bounded look-ahead, a
worker's exception and a worker's death reported in this process, no worker left behind."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from shardfmt._convert.engine import WorkerDied, imap_ordered


def _square_slowly(args: dict[str, Any], item: int) -> tuple[int, int]:
    total = 0
    for n in range((item % 7) * args["spin"]):  # uneven work, so that results come out of order
        total += n
    return item * item, os.getpid()


def _echo_large(args: None, item: bytes) -> bytes:
    return item * 8


def _fail_on(args: int, item: int) -> int:
    if item == args:
        raise ValueError(f"item {item} is bad")
    return item


def _die_on(args: int, item: int) -> int:
    if item == args:
        os.kill(os.getpid(), signal.SIGKILL)
    return item


def _fill(args: None, item: int, scratch: memoryview | None = None) -> tuple[int, int]:
    """Write `item` into the scratch memory, as many bytes as it says; return what it saw there."""
    assert scratch is not None
    before = scratch[0]
    scratch[:item] = bytes([item % 256]) * item
    return before, os.getpid()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_results_come_in_order_from_every_worker_with_a_bounded_look_ahead() -> None:
    taken: list[int] = []

    def items() -> Iterator[int]:
        for item in range(200):
            taken.append(item)
            yield item

    results = []
    for number, ((square, pid), _) in enumerate(imap_ordered(_square_slowly, {"spin": 3000}, items(), engine="local", workers=2, window=6)):
        assert len(taken) <= number + 6  # at most `window` items taken beyond those yielded
        results.append((square, pid))
    assert [square for square, _ in results] == [item * item for item in range(200)]
    pids = {pid for _, pid in results}
    assert len(pids) == 2 and os.getpid() not in pids
    assert not any(_alive(pid) for pid in pids)  # every worker ended with the pool


def test_large_items_and_results_pass_both_ways_at_once() -> None:
    # items and results larger than a pipe's buffer, many in flight: neither side may wait
    # on the other forever
    items = [bytes([n]) * 200_000 for n in range(24)]
    results = [result for result, _ in imap_ordered(_echo_large, None, items, engine="local", workers=2, window=8)]
    assert results == [item * 8 for item in items]


def test_an_exception_in_a_worker_is_raised_here_with_its_traceback() -> None:
    with pytest.raises(ValueError, match="item 13 is bad") as caught:
        list(imap_ordered(_fail_on, 13, range(40), engine="local", workers=2, window=8))
    assert "_fail_on" in str(caught.value.__cause__)  # the worker's own traceback


def test_a_worker_that_dies_is_reported_with_its_item() -> None:
    with pytest.raises(WorkerDied) as caught:
        list(imap_ordered(_die_on, 5, range(40), engine="local", workers=2, window=4))
    assert caught.value.item == 5  # the results it sent before are read first; then the end of its pipe


def test_stopping_early_ends_every_worker() -> None:
    results = imap_ordered(_square_slowly, {"spin": 100}, range(1000), engine="local", workers=2, window=8)
    pids = {next(results)[0][1] for _ in range(20)}
    results.close()  # type: ignore[attr-defined]
    assert pids and not any(_alive(pid) for pid in pids)


def test_each_item_in_flight_has_scratch_memory_of_its_own_until_the_next_result() -> None:
    sizes = [1 + (n * 37_003) % 65_536 for n in range(60)]
    seen = []
    for _, scratch in imap_ordered(_fill, None, sizes, engine="local", workers=2, window=4, scratch=65_536):
        assert scratch is not None and len(scratch) == 65_536
        seen.append(bytes(scratch[: sizes[len(seen)]]))
    assert seen == [bytes([size % 256]) * size for size in sizes]  # no item wrote over another's


def test_inline_and_without_scratch_the_function_gets_two_arguments() -> None:
    inline = list(imap_ordered(_square_slowly, {"spin": 1}, range(5), engine="local", workers=1, window=4, scratch=1024))
    assert [(result[0], scratch) for result, scratch in inline] == [(n * n, None) for n in range(5)]
    pooled = list(imap_ordered(_square_slowly, {"spin": 1}, range(5), engine="local", workers=2, window=4))
    assert [(result[0], scratch) for result, scratch in pooled] == [(n * n, None) for n in range(5)]
