"""`SlotLender` on its own: a slot comes back once nothing the caller holds views it, the one
handed out last is looked at twice, a slot still held is set aside (a fresh one takes its place)
and many set aside warn once; a slot copied to a device comes back once its copy is over."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from shardfmt._loader.lending import KEPT_WARNING, SlotLender
from shardfmt._loader.shm import SlotArray, SlotLayout, SlotRing


@pytest.fixture
def ring() -> SlotRing:
    return SlotRing.in_process(SlotLayout(3, 2, (SlotArray("image", (4, 4, 3), "|u1"),)))


def view(ring: SlotRing, slot: int) -> tuple[torch.Tensor, StorageWeakRef]:
    tensor = torch.from_numpy(ring.arrays[slot]["image"])
    return tensor, StorageWeakRef(tensor.untyped_storage())


def test_a_slot_no_longer_viewed_comes_back_at_once(ring: SlotRing) -> None:
    lender = SlotLender()
    tensor, ref = view(ring, 1)
    lender.lend(1, [ref])
    del tensor
    assert lender.take_back(ring) == [1]
    assert not lender.lent(1) and lender.kept == [] and ring.serials == [0, 1, 2]


def test_the_slot_handed_out_last_is_looked_at_again_then_set_aside(ring: SlotRing) -> None:
    lender = SlotLender()
    tensor, ref = view(ring, 2)
    tensor[0, 0, 0, 0] = 7
    lender.lend(2, [ref])
    assert lender.take_back(ring) == []  # a for loop still holds the batch it was handed last
    assert lender.lent(2)
    assert lender.take_back(ring) == [2]  # still held at the request after: left to the caller
    assert ring.serials == [0, 1, 3]  # a fresh segment took its place
    assert len(lender.kept) == 1 and lender.kept[0][1] == ring.layout.slot_bytes
    ring.arrays[2]["image"][:] = 0  # the fresh slot is refilled; the caller's view is not touched
    assert int(tensor[0, 0, 0, 0]) == 7


def test_everything_sets_aside_even_the_slot_handed_out_last(ring: SlotRing) -> None:
    lender = SlotLender()
    tensor, ref = view(ring, 0)
    lender.lend(0, [ref])
    assert lender.take_back(ring, everything=True) == [0]
    assert ring.serials == [3, 1, 2] and len(lender.kept) == 1
    del tensor


def test_a_slot_copied_to_a_device_comes_back_once_its_copy_is_over(ring: SlotRing) -> None:
    class Copy:
        synchronized = 0

        def synchronize(self) -> None:
            self.synchronized += 1

    lender, done = SlotLender(), Copy()
    lender.lend(0, [], done=done)
    assert lender.take_back(ring) == [0]
    assert done.synchronized == 1 and ring.serials == [0, 1, 2]


def test_holding_more_than_the_warning_count_warns_once(ring: SlotRing) -> None:
    lender = SlotLender()
    held = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(KEPT_WARNING + 3):
            tensor, ref = view(ring, 0)
            held.append(tensor)
            lender.lend(0, [ref])
            lender.take_back(ring, everything=True)
    assert [str(w.message).split(" (")[0] for w in caught] == [f"the caller holds {KEPT_WARNING + 1} batches of this Loader"]
    assert caught[0].category is ResourceWarning


def test_slots_the_caller_let_go_are_no_longer_counted_as_kept(ring: SlotRing) -> None:
    lender = SlotLender()
    for _ in range(3):
        tensor, ref = view(ring, 1)
        lender.lend(1, [ref])
        lender.take_back(ring, everything=True)
        del tensor
    assert len(lender.kept) == 1  # pruned as each new one is set aside: only the last is counted


def test_setting_aside_without_a_ring_says_the_loader_is_closed(ring: SlotRing) -> None:
    lender = SlotLender()
    tensor, ref = view(ring, 0)
    lender.lend(0, [ref])
    with pytest.raises(RuntimeError, match="closed"):
        lender.take_back(None, everything=True)
    del tensor


def test_forget_drops_every_loan(ring: SlotRing) -> None:
    lender = SlotLender()
    tensor, ref = view(ring, 0)
    lender.lend(0, [ref])
    lender.forget()
    assert not lender.lent(0) and lender.take_back(ring) == []
    del tensor
