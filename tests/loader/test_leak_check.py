"""The leak check of tests/leaks.py (the `no_leaks` fixture) finds what a test leaves behind: a
Loader kept open, a mapping of a deleted shared-memory segment, a descriptor, a drop of free
/dev/shm. Each case leaks on purpose, asserts the report, then cleans up and asserts that the
report is empty again."""

from __future__ import annotations

import mmap
import os
import uuid
from pathlib import Path

import leaks
import pytest
from conftest import jpeg_bytes

from shardfmt import DatasetWriter, ImageTransform, Loader, Workers
from shardfmt.format import IMAGE_CLASSIFICATION

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads Linux's /proc")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("leaks") / "ds"
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=12_000) as writer:
        for i in range(16):
            writer.write({"image": jpeg_bytes(40, 48, seed=i), "label": i, "key": f"r{i}"})
    return out


def ring_mappings(pid: int) -> set[str]:
    """The deleted /dev/shm segments process `pid` maps, as `leaks` names them."""
    with open(f"/proc/{pid}/maps") as maps:
        return {
            f"{parts[5].strip()} (inode {parts[4]})"
            for parts in (line.split(None, 5) for line in maps)
            if len(parts) == 6 and parts[5].startswith("/dev/shm/shardfmt-") and parts[5].rstrip().endswith("(deleted)")
        }


def test_a_loader_kept_open_is_reported_by_its_workers_mappings_and_descriptors(dataset: Path) -> None:
    before = leaks.snapshot()
    loader = Loader(dataset, batch_size=4, num_workers=2, transform=ImageTransform(size=16), workers=Workers(start_method="fork"))
    try:
        next(iter(loader))
        found = leaks.leaks_between(before, leaks.snapshot(), shm_tolerance=leaks.SHARED_MACHINE_SHM_TOLERANCE)
        assert [child.split()[0] for child in found.children] == [str(pid) for pid in sorted(loader.worker_pids)]
        ring = ring_mappings(os.getpid())
        assert len(ring) == 3  # the ring's slots: prefetch + 1, a segment each
        assert ring <= set(found.mappings)  # beside the loader's semaphores and shared counters
        assert found.descriptors, "the pipes to the workers are open"
        assert found
    finally:
        loader.close()
    del loader
    assert not leaks.leaks_between(before, leaks.snapshot(), shm_tolerance=leaks.SHARED_MACHINE_SHM_TOLERANCE)


def test_a_mapping_of_a_deleted_segment_and_its_descriptor_are_reported() -> None:
    before = leaks.snapshot()
    path = f"/dev/shm/shardfmt-leak-check-{os.getpid()}-{uuid.uuid4().hex}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(path)  # as the ring does: the name is gone at once, the memory lives on
    try:
        os.ftruncate(fd, 1 << 20)
        segment = mmap.mmap(fd, 1 << 20)
        segment[:] = b"\x01" * (1 << 20)  # touched: the pages are taken from /dev/shm
        inode = os.fstat(fd).st_ino
        found = leaks.leaks_between(before, leaks.snapshot(), shm_tolerance=leaks.SHARED_MACHINE_SHM_TOLERANCE)
        assert found.mappings == [f"{path} (deleted) (inode {inode})"]
        # the descriptor, and the duplicate mmap keeps of it
        assert [d.partition(" -> ")[2] for d in found.descriptors] == [f"{path} (deleted)"] * 2
        assert f"{fd} -> {path} (deleted)" in found.descriptors
        assert found.children == []
        segment.close()
    finally:
        os.close(fd)
    assert not leaks.leaks_between(before, leaks.snapshot(), shm_tolerance=leaks.SHARED_MACHINE_SHM_TOLERANCE)


def resources(shm_free: int) -> leaks.Resources:
    return leaks.Resources(frozenset(), {}, {}, shm_free)


@pytest.mark.parametrize(
    ("free_after", "tolerance", "dropped"), [(9 << 20, 0, 1 << 20), (9 << 20, 1 << 20, 0), (6 << 20, 1 << 20, 3 << 20), (11 << 20, 0, 0)]
)
def test_a_drop_of_free_shared_memory_beyond_the_tolerance_is_reported(free_after: int, tolerance: int, dropped: int) -> None:
    found = leaks.leaks_between(resources(10 << 20), resources(free_after), shm_tolerance=tolerance)
    assert found.shm_dropped == dropped
    assert bool(found) == bool(dropped)


def test_the_growth_of_multiprocessings_shared_heap_is_no_drop() -> None:
    before = leaks.Resources(frozenset(), {}, {}, 10 << 20, arena_bytes=4096)
    after = leaks.Resources(frozenset(), {}, {}, (10 << 20) - 3 * 4096, arena_bytes=3 * 4096)
    assert leaks.leaks_between(before, after, shm_tolerance=0).shm_dropped == 4096


def test_the_tolerance_for_free_shared_memory_is_smaller_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHARDFMT_TEST_SHM_TOLERANCE", raising=False)
    monkeypatch.setenv("CI", "1")
    assert leaks.shm_tolerance() == 64 * 1024 * 1024
    monkeypatch.setenv("SHARDFMT_TEST_SHM_TOLERANCE", "65536")
    assert leaks.shm_tolerance() == 65536
    monkeypatch.delenv("SHARDFMT_TEST_SHM_TOLERANCE")
    monkeypatch.delenv("CI")
    assert leaks.shm_tolerance() == leaks.SHARED_MACHINE_SHM_TOLERANCE


def test_the_fixture_fails_a_test_that_leaves_a_descriptor_open(pytester: pytest.Pytester) -> None:
    tests = str(Path(__file__).resolve().parents[1])
    pytester.makeconftest(f"import sys\nsys.path.insert(0, {tests!r})\nfrom leaks import no_leaks\n")
    pytester.makepyfile(
        """
        import os
        kept = []

        def test_leaks(no_leaks):
            kept.append(os.open(os.devnull, os.O_RDONLY))

        def test_cleans_up(no_leaks):
            os.close(os.open(os.devnull, os.O_RDONLY))
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*the test left behind:*", "*descriptor * -> /dev/null*"])
