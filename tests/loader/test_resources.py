"""What a loader holds of the machine, and how it gives it back: `close()` unmaps the ring at once
but for the slots of batches the caller still holds; held batches at the descriptor limit give
an error that names EMFILE and the fix; `timeout` holds when the loader decodes in its own
process; a shard truncated under the loader is a typed error, never a death by SIGBUS.

What is looked at is /proc/self/maps and /proc/self/fd, only for this process's own rings
(``shardfmt-PID-...``): the segments have no name in /dev/shm, and the kernel frees one once no
process maps it or holds its descriptor. Whatever could hang runs under a pytest timeout.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch

from shardfmt import DatasetWriter, FormatError, ImageTransform, Loader, WorkerError, Workers
from shardfmt._loader.watchdog import Stalled
from shardfmt.format import IMAGE_CLASSIFICATION

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """48 flat gray images whose value is 255 - record, in shards of about 6 KB (8 records)."""
    out = tmp_path_factory.mktemp("resources") / "ds"
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=6_000) as writer:
        for i in range(48):
            pixels = np.full((16, 16, 3), 255 - i, np.uint8)
            writer.write({"image": simplejpeg.encode_jpeg(pixels, quality=100), "label": i, "key": f"m{i}"})
    return out


def ring_mappings() -> set[str]:
    """The ring segments this process maps (named after it, unlinked: ``... (deleted)``)."""
    mine = f"/shardfmt-{os.getpid()}-"
    with open("/proc/self/maps") as maps:
        return {line.split(None, 5)[5].strip() for line in maps if mine in line}


def ring_descriptors() -> set[str]:
    """The ring segments this process holds a file descriptor of."""
    mine = f"/shardfmt-{os.getpid()}-"
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the descriptor listdir itself used
            continue
        if mine in target:
            found.add(target)
    return found


def run_child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], env=env, timeout=90, capture_output=True, text=True)


# -- close() ------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_close_unmaps_the_ring_at_once_but_for_a_held_batch(dataset: Path) -> None:
    """Before, every slot stayed mapped (and its memory allocated) until the Loader object was
    garbage-collected, whatever the caller held."""
    before, descriptors = ring_mappings(), ring_descriptors()
    loader = Loader(dataset, batch_size=4, num_workers=2, shuffle=False, transform=ImageTransform(size=8, crop="resize"))
    iterator = iter(loader)
    held = next(iterator)
    next(iterator)
    next(iterator)  # `held` is still referenced: its slot is set aside and a fresh one takes its place
    expected = held[0].clone()
    assert len(ring_mappings() - before) == 4, "3 slots (prefetch + 1) and the one set aside"
    workers = loader.worker_pids
    loader.close()
    assert loader.worker_pids == [] and len(workers) == 2
    left = ring_mappings() - before
    assert len(left) == 1, "only the held batch's slot stays mapped, the iterator still alive"
    assert torch.equal(held[0], expected) and held[1].tolist() == [0, 1, 2, 3]
    assert int(held[0][0, 0, 0, 0]) == 255
    del held
    assert ring_mappings() - before == set()
    assert ring_descriptors() - descriptors == set()
    with pytest.raises(RuntimeError, match="replaced"):
        next(iterator)


@pytest.mark.timeout(60)
def test_close_unmaps_every_slot_when_no_batch_is_held(dataset: Path) -> None:
    before = ring_mappings(), ring_descriptors()
    loader = Loader(dataset, batch_size=4, num_workers=1, shuffle=False, transform=ImageTransform(size=8, crop="resize"))
    firsts = [int(labels[0]) for _, labels in loader]  # no batch outlives the comprehension
    assert firsts == list(range(0, 48, 4))
    assert len(ring_mappings() - before[0]) == 3
    loader.close()
    assert ring_mappings() - before[0] == set()
    assert ring_descriptors() - before[1] == set()


# -- file descriptors ---------------------------------------------------------------------------

HOARDER = """
import json, os, resource, sys, warnings
from shardfmt import ImageTransform, Loader

warnings.simplefilter("ignore", ResourceWarning)  # said at 16 held batches; this test holds more
loader = Loader(sys.argv[1], batch_size=1, num_workers=1, transform=ImageTransform("resize", size=8), shuffle=False)
limit = len(os.listdir("/proc/self/fd")) + 24
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    for batch in loader:
        held.append(batch)
    error = None
except OSError as err:
    error = {"errno": err.errno, "message": str(err), "class": type(err).__name__}
labels = [int(label) for _, labels in held for label in labels]
print(json.dumps({"limit": limit, "held": len(held), "labels": labels, "error": error}))
"""


@pytest.mark.timeout(120)
def test_held_batches_at_the_descriptor_limit_name_emfile_and_the_fix(dataset: Path) -> None:
    """Before, the loader took the failed send for a dead worker and killed it: "worker 0 ...
    was killed by signal 9 (SIGKILL)", EMFILE only in the chained context."""
    child = run_child(HOARDER, str(dataset))
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    assert result["labels"] == list(range(result["held"])), "every batch held stays valid"
    if sys.version_info >= (3, 13):  # a mapping keeps no descriptor: nothing runs out
        assert result["error"] is None and result["held"] == 48
        return
    error = result["error"]
    assert error is not None and 8 < result["held"] < 48
    assert error["class"] == "OSError" and error["errno"] == errno.EMFILE
    message = error["message"]
    assert message.startswith("[Errno 24] the loader could not ")
    assert f"this process has no file descriptor left (EMFILE: its limit, ulimit -n, is {result['limit']})" in message
    assert "Each batch of a Loader held past the next one keeps one descriptor" in message
    assert message.endswith(
        "Release the batches you keep (keep clones, or pass output=Output(copy=True)), or raise the limit "
        "(ulimit -n, or resource.setrlimit(resource.RLIMIT_NOFILE, ...) at start)"
    )
    assert "signal" not in message


# -- timeout with num_workers=0 -----------------------------------------------------------------


def stall_on_record_five(sample: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if int(sample[0, 0, 0]) == 255 - 5:
        time.sleep(3600)
    return sample


# pytest-timeout's own "signal" method arms the process's real-time timer, and the loader leaves
# a timer it did not arm alone (see _loader/watchdog.py): this test's limit runs in a thread
@pytest.mark.timeout(60, method="thread")
def test_a_stall_in_the_loaders_own_process_is_a_worker_error(dataset: Path) -> None:
    """Before, a step that hung with num_workers=0 hung the loop, whatever the timeout."""
    handler = signal.getsignal(signal.SIGALRM)
    with pytest.raises(WorkerError) as info:
        with Loader(
            dataset,
            batch_size=4,
            num_workers=0,
            shuffle=False,
            transform=ImageTransform(size=8, crop="resize", augment=[stall_on_record_five]),
            workers=Workers(timeout=1),
        ) as loader:
            list(loader)
    error = info.value
    shard = str(dataset / "shard-00000.shard")
    assert error.path == shard and error.record == 5
    assert error.message == (
        f"no progress for 1 s (the timeout); the loader's process (num_workers=0) is on {shard} record 5 (dataset record 5)"
    )
    assert isinstance(error.__cause__, Stalled)
    assert signal.getsignal(signal.SIGALRM) == handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.timeout(60, method="thread")
def test_the_timer_lets_steps_that_finish_in_time_run_and_puts_the_handler_back(dataset: Path) -> None:
    rang = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: rang.append(signum))
    try:
        with Loader(
            dataset, batch_size=4, num_workers=0, shuffle=False, transform=ImageTransform(size=8, crop="resize"), workers=Workers(timeout=5)
        ) as loader:
            labels = [int(label) for _, batch in loader for label in batch]
        assert labels == list(range(48))
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and rang == []
        os.kill(os.getpid(), signal.SIGALRM)  # the caller's handler is back
        assert rang == [signal.SIGALRM]
    finally:
        signal.signal(signal.SIGALRM, previous)


# -- a shard truncated under the loader ---------------------------------------------------------

TRUNCATER = """
import json, os, sys
from shardfmt import ImageTransform, Loader, Workers

fields = {"image": 8, "label": None, "key": None} if sys.argv[3] == "keys" else None  # keys: read by the loader's process
loader = Loader(sys.argv[1], batch_size=2, num_workers=int(sys.argv[2]), transform=ImageTransform("resize", size=8), shuffle=False,
                workers=Workers(prefetch=1), fields=fields)
iterator = iter(loader)
first = next(iterator)
loader.scheduler.running_pool.drain()  # batch 1 is decoded: the next one read is batch 2 (records 4 and 5)
shard = os.path.join(sys.argv[1], "shard-00000.shard")
size = os.path.getsize(shard)
os.truncate(shard, size // 3)
try:
    for batch in iterator:
        pass
    print(json.dumps(None))
except Exception as err:
    print(json.dumps({"classes": [c.__name__ for c in type(err).__mro__], "path": err.path, "record": err.record,
                      "offset": err.offset, "message": err.message, "size": size}))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_shard_truncated_under_the_loader_is_a_format_error(dataset: Path, tmp_path: Path, num_workers: int) -> None:
    """Before, the loader's process died of SIGBUS without a word with num_workers=0, and with
    workers the loader said a worker "was killed by signal 7 (SIGBUS) between records"."""
    copy = tmp_path / "ds"
    shutil.copytree(dataset, copy)
    child = run_child(TRUNCATER, str(copy), str(num_workers), "images")
    assert child.returncode == 0, f"the child ended with {child.returncode}: {child.stderr}"
    result = json.loads(child.stdout)
    shard = str(copy / "shard-00000.shard")
    assert result is not None and {"FormatError", "WorkerError"} <= set(result["classes"])
    assert result["path"] == shard and result["record"] == 4 and result["offset"] == result["size"] // 3
    who = "decoding" if num_workers == 0 else "worker 0"
    assert result["message"] == (
        f"{who} failed on dataset record 4: the shard file was truncated to {result['size'] // 3} bytes after it was opened "
        f"({result['size']} bytes then): it changed while it was being read; restore it (or convert the dataset again) and start anew"
    )


@pytest.mark.timeout(120)
def test_a_shard_truncated_under_the_values_the_loader_reads_itself_is_a_format_error(dataset: Path, tmp_path: Path) -> None:
    """Keys (str, json, bytes fields) are read in the loader's process from its own mapping: the
    batch decoded before the file was truncated (records 2 and 3) fails when its keys are read."""
    copy = tmp_path / "ds"
    shutil.copytree(dataset, copy)
    child = run_child(TRUNCATER, str(copy), "1", "keys")
    assert child.returncode == 0, f"the child ended with {child.returncode}: {child.stderr}"
    result = json.loads(child.stdout)
    assert result is not None and "FormatError" in result["classes"] and "WorkerError" not in result["classes"]
    assert (result["path"], result["record"], result["offset"]) == (str(copy / "shard-00000.shard"), 2, result["size"] // 3)
    assert result["message"].startswith(f"the shard file was truncated to {result['size'] // 3} bytes after it was opened")


def test_a_shard_replaced_by_another_file_is_read_as_it_was_opened(dataset: Path, tmp_path: Path) -> None:
    """A file renamed over the shard is not the mapped one: the mapping keeps the old file whole."""
    copy = tmp_path / "ds"
    shutil.copytree(dataset, copy)
    with Loader(
        copy, batch_size=2, num_workers=0, shuffle=False, transform=ImageTransform(size=8, crop="resize"), workers=Workers(prefetch=1)
    ) as loader:
        iterator = iter(loader)
        labels = next(iterator)[1].tolist()
        shard = copy / "shard-00000.shard"
        (copy / "new").write_bytes(shard.read_bytes()[:100])
        os.replace(copy / "new", shard)
        labels += [int(label) for _, batch in iterator for label in batch]
    assert labels == list(range(48))


def test_check_file_names_the_file_and_record(dataset: Path, tmp_path: Path) -> None:
    from shardfmt import open_dataset

    copy = tmp_path / "ds"
    shutil.copytree(dataset, copy)
    reader = open_dataset(copy)
    shard = reader.shard(1)
    shard.check_file(3)  # unchanged: nothing to say
    size = os.path.getsize(shard.path)
    os.truncate(shard.path, size - 1)
    with pytest.raises(FormatError) as info:
        shard.check_file(3)
    assert (info.value.path, info.value.offset, info.value.record) == (shard.path, size - 1, 3)
    reader.close()
