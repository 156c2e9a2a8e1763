"""How the loader fails: its workers end with the process that started them, whatever signal ends
it, and leave nothing in /dev/shm; every death or error of a worker reaches the caller as a
`WorkerError` with the signal, shard and record it knows, from any point of the pipe protocol.

Kills are real signals; what is checked is /proc and /dev/shm, and only entries that this test's
own processes made (other loaders may be running on the machine). Waiting for a process to end
cannot be a handshake: the waits poll, and the suite's per-test timeout turns a worker that never
ends into a failure, not a timed assertion.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch

from shardfmt import DatasetWriter, ImageTransform, Loader, ManifestError, WorkerError, Workers
from shardfmt._loader.pool import WorkerPool
from shardfmt.format import IMAGE_CLASSIFICATION

REPO = Path(__file__).resolve().parents[2]
PLACEHOLDER = re.compile(r"records? \[?-1\b")
"""What the messages said when the record was unknown: "dataset record -1", "records [-1, 5]"."""
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Flat gray images whose value is 255 - record, so a step can tell records apart."""
    out = tmp_path_factory.mktemp("failures") / "ds"
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=6_000) as writer:
        for i in range(48):
            pixels = np.full((16, 16, 3), 255 - i, np.uint8)
            writer.write({"image": simplejpeg.encode_jpeg(pixels, quality=100), "label": i, "key": f"m{i}"})
    return out


def start_time(pid: int) -> int | None:
    """The start time of process `pid` (/proc/PID/stat field 22), or None once it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def wait_gone(pids: dict[int, int | None]) -> None:
    """Poll until none of `pids` (pid -> start time) runs any more (a pid reused by a newer
    process counts as gone)."""
    while any(start_time(pid) == started for pid, started in pids.items()):
        time.sleep(0.05)


def shm_names(pid: int) -> set[str]:
    prefix = f"shardfmt-{pid}-"
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)} if os.path.isdir("/dev/shm") else set()


TRAINER = """
import signal
import sys
from shardfmt import ImageTransform, Loader, Workers
for number in (signal.SIGTERM, signal.SIGHUP):  # their default action, whatever this runs under (nohup ignores SIGHUP)
    signal.signal(number, signal.SIG_DFL)
loader = Loader(sys.argv[1], batch_size=4, num_workers=2, transform=ImageTransform("resize", size=8),
                workers=Workers(start_method=sys.argv[2]))
iterator = iter(loader)
next(iterator)
print(*loader.worker_pids, flush=True)
while True:  # killed somewhere in here, mid-epoch or between epochs
    for batch in loader:
        pass
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("sig", "start_method"),
    [
        (signal.SIGKILL, "fork"),
        (signal.SIGTERM, "fork"),
        (signal.SIGHUP, "fork"),
        pytest.param(signal.SIGKILL, "spawn", marks=pytest.mark.slow),
    ],
)
def test_workers_end_with_a_killed_training_process(dataset: Path, sig: signal.Signals, start_method: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    command = [sys.executable, "-c", TRAINER, str(dataset), start_method]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) as trainer:
        try:
            assert trainer.stdout is not None
            workers = [int(pid) for pid in trainer.stdout.readline().split()]
            assert len(workers) == 2
            started = {pid: start_time(pid) for pid in workers}
            assert all(started.values())
            trainer.send_signal(sig)
            assert trainer.wait(timeout=30) == -sig
            wait_gone(started)  # before, they lived on, each blocked on a pipe whose other end it held itself
            assert shm_names(trainer.pid) == set()
        finally:
            if trainer.poll() is None:
                trainer.kill()
                trainer.wait()


def zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("victims", ["one", "both"])
def test_a_worker_killed_between_batches_is_a_worker_error(dataset: Path, victims: str) -> None:
    """The next send to the dead worker's pipe finds it first (before: BrokenPipeError in 5 of 6 runs)."""
    with Loader(dataset, batch_size=8, num_workers=2, shuffle=False, transform=ImageTransform(size=8, crop="resize")) as loader:
        iterator = iter(loader)
        next(iterator)
        pids = loader.worker_pids if victims == "both" else loader.worker_pids[:1]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        while not all(zombie(pid) for pid in pids):  # dead, not yet reaped by the loader
            time.sleep(0.02)
        with pytest.raises(
            WorkerError,
            match=r"was killed by signal 9 \(SIGKILL\) (between records|while decoding record \d+ of .+ \(dataset record \d+\))",
        ) as info:
            for _ in iterator:
                pass
    assert not PLACEHOLDER.search(str(info.value))


def test_a_send_to_a_dead_worker_is_a_worker_error(dataset: Path) -> None:
    """The loader's send finds the death first (before: BrokenPipeError, what 5 of 6 kills mid-epoch gave)."""
    with Loader(dataset, batch_size=8, num_workers=1, shuffle=False, transform=ImageTransform(size=8, crop="resize")) as loader:
        next(iter(loader))
        pool = loader.scheduler.pool
        assert isinstance(pool, WorkerPool)
        pool.drain()
        pid = loader.worker_pids[0]
        os.kill(pid, signal.SIGKILL)
        while not zombie(pid):
            time.sleep(0.02)
        with pytest.raises(WorkerError, match=r"worker 0 \(pid \d+\) was killed by signal 9 \(SIGKILL\) between records"):
            pool.feed(deque([(0, loader.scheduler.ring.serials[0], 0, 0, np.arange(4, dtype=np.int64))]))  # type: ignore[union-attr]


def kill_myself_on_record_five(sample: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if int(sample[0, 0, 0]) == 255 - 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return sample


def test_a_worker_killed_on_a_record_names_signal_shard_and_record(dataset: Path) -> None:
    with pytest.raises(WorkerError) as info:
        with Loader(
            dataset,
            batch_size=4,
            num_workers=1,
            shuffle=False,
            transform=ImageTransform(size=8, crop="resize", augment=[kill_myself_on_record_five]),
        ) as loader:
            list(loader)
    error = info.value
    assert error.record is not None and error.path is not None and error.path.endswith(".shard")
    assert "killed by signal 9 (SIGKILL) while decoding record" in error.message and "(dataset record 5)" in error.message


def stall_on_record_five(sample: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if int(sample[0, 0, 0]) == 255 - 5:
        time.sleep(3600)
    return sample


def test_a_stall_names_where_each_worker_is(dataset: Path) -> None:
    with pytest.raises(WorkerError, match="no progress for 1 s") as info:
        with Loader(
            dataset,
            batch_size=4,
            num_workers=1,
            shuffle=False,
            transform=ImageTransform(size=8, crop="resize", augment=[stall_on_record_five]),
            workers=Workers(timeout=1),
        ) as loader:
            list(loader)
    assert "worker 0 is on " in info.value.message and "(dataset record 5)" in info.value.message
    assert not PLACEHOLDER.search(info.value.message)


def broken_after_construction(dataset: Path, tmp_path: Path, *, start_method: str) -> Loader:
    """A loader whose dataset's manifest is spoilt after the loader opened it: spawned workers,
    which open the dataset anew, fail as they start; forked ones inherit the loader's."""
    broken = tmp_path / "ds"
    broken.mkdir()
    for path in dataset.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    loader = Loader(
        broken, batch_size=4, num_workers=1, transform=ImageTransform(size=8, crop="resize"), workers=Workers(start_method=start_method)
    )
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["format_version"] = "not a version"
    (broken / "manifest.json").write_text(json.dumps(manifest))
    return loader


def test_a_worker_that_cannot_start_says_so_without_a_record(dataset: Path, tmp_path: Path) -> None:
    loader = broken_after_construction(dataset, tmp_path, start_method="spawn")
    with pytest.raises(ManifestError) as info:
        next(iter(loader))
    assert isinstance(info.value, WorkerError)
    assert "failed before its first record" in info.value.message and not PLACEHOLDER.search(info.value.message)


def test_forked_workers_read_the_dataset_the_loader_opened(dataset: Path, tmp_path: Path) -> None:
    # A forked worker inherits the loader's dataset, manifest parsed, instead of parsing the
    # manifest again (at 10,000 shards, 50 ms in every worker before its first record).
    with broken_after_construction(dataset, tmp_path, start_method="fork") as loader:
        images, labels = next(iter(loader))
    assert tuple(images.shape) == (4, 3, 8, 8) and len(labels) == 4


def test_slots_larger_than_dev_shm_are_refused_before_anything_is_allocated() -> None:
    from shardfmt._loader.shm import SlotArray, SlotLayout, SlotRing, shared_memory_free

    free = shared_memory_free()
    assert free is not None
    sample = SlotArray("image", (64, 64, 3), "|u1")
    layout = SlotLayout(3, free // sample.sample_bytes + 1, (sample,))
    before = shm_names(os.getpid())
    with pytest.raises(
        MemoryError, match=rf"a batch slot needs {layout.slot_bytes} bytes of shared memory, but /dev/shm has \d+ bytes free"
    ):
        SlotRing.create(layout)
    assert shm_names(os.getpid()) == before
