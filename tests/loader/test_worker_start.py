"""What makes a worker start fast and its first epoch as fast as the next: the heap frozen while
it is forked (`forks.frozen_heap`) and the slot mapping populated when a worker attaches it."""

from __future__ import annotations

import gc
import os
import resource
import sys
from pathlib import Path

import pytest

from shardfmt import ImageTransform, Loader, Output, open_dataset
from shardfmt._forks import frozen_heap
from shardfmt._loader.shm import SlotArray, SlotLayout, SlotRing, map_segment, slot_arrays
from shardfmt._storage import LocalFile


def test_the_heap_is_frozen_only_while_forking() -> None:
    assert gc.get_freeze_count() == 0
    with frozen_heap("fork"):
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    for method in ("spawn", "forkserver", None):
        with frozen_heap(method):
            assert gc.get_freeze_count() == 0


def _kernel() -> tuple[int, ...]:
    release = os.uname().release.split("-")[0].split(".")
    return tuple(int(part) for part in release[:2] if part.isdigit())


@pytest.mark.skipif(not sys.platform.startswith("linux") or _kernel() < (5, 14), reason="MADV_POPULATE_WRITE is Linux's, from 5.14")
def test_an_attached_ring_is_mapped_before_its_first_write() -> None:
    layout = SlotLayout(2, 64, (SlotArray("image", (64, 64, 3), "|u1"),))  # 1.5 MiB
    ring = SlotRing.create(layout)
    try:
        attached = [slot_arrays(map_segment(slot.handle, layout), layout) for slot in ring.slots]  # type: ignore[arg-type]
        pages = layout.total_bytes // 4096
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for slot in attached:
            slot["image"][:] = 7
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        assert faults < pages // 10, f"{faults} page faults writing {pages} pages"
        assert int(ring.arrays[1]["image"][63, 63, 63, 2]) == 7  # the creator sees the workers' writes
    finally:
        ring.unlink()


def test_a_chunk_asks_for_its_records_bytes_before_it_reads_the_first(small_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # From a cold page cache the records of a chunk are read from the disk together, not one
    # page fault after another: the chunk names every span to the kernel first.
    asked: list[tuple[int, int]] = []
    prefetch = LocalFile.prefetch

    def spy(self: LocalFile, ranges: list[tuple[int, int]]) -> None:
        asked.extend(ranges)
        prefetch(self, ranges)

    monkeypatch.setattr(LocalFile, "prefetch", spy)
    with Loader(
        small_dataset, batch_size=4, num_workers=0, seed=5, transform=ImageTransform(size=8), output=Output(return_indices=True)
    ) as loader:
        _images, _labels, indices = next(iter(loader))
    with open_dataset(small_dataset) as dataset:
        spans = []
        for index in indices.tolist():
            shard, record = dataset.locate(index)
            row = dataset.shard(shard).table[record]
            spans.append((int(row["offset"]), int(row["offset"]) + int(row["size"])))
    assert len(spans) == 4 and set(spans) <= set(asked)
