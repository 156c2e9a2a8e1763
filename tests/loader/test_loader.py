"""shardfmt.Loader: exact epochs, resume, failures surfaced, shared memory cleaned, pixels right."""

from __future__ import annotations

import io
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import jpeg_bytes
from PIL import Image

from shardfmt import DatasetWriter, ImageTransform, Loader, Output, Sampling, WorkerError, Workers, open_dataset
from shardfmt._sampling.keys import AUGMENT_STREAM, record_keys
from shardfmt.format import IMAGE_CLASSIFICATION
from shardfmt.ops import CenterCrop, RandomResizedCrop

NUM_RECORDS = 103


@pytest.fixture(scope="module")
def indexed_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """103 records whose label is their index, in several shards."""
    out = tmp_path_factory.mktemp("indexed") / "ds"
    rng = np.random.default_rng(11)
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=60_000) as writer:
        for i in range(NUM_RECORDS):
            h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
            writer.write({"image": jpeg_bytes(h, w, seed=i), "label": i, "key": f"r{i}"})
    return out


def collect(loader: Loader, *, limit: int | None = None) -> tuple[list[list[int]], list[bytes]]:
    labels, images = [], []
    for batch, label in itertools.islice(loader, limit):
        labels.append(label.tolist())
        images.append(bytes(batch.numpy().tobytes()))
    return labels, images


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_record_once_per_epoch_and_epochs_differ(indexed_dataset: Path, num_workers: int) -> None:
    with Loader(indexed_dataset, batch_size=16, num_workers=num_workers, seed=3, transform=ImageTransform(size=32)) as loader:
        assert len(loader) == 7
        first, _ = collect(loader)
        second, _ = collect(loader)
    for epoch in (first, second):
        assert sorted(x for batch in epoch for x in batch) == list(range(NUM_RECORDS))
        assert [len(b) for b in epoch] == [16] * 6 + [7]
    assert first != second
    with Loader(indexed_dataset, batch_size=16, num_workers=num_workers, seed=3, transform=ImageTransform(size=32)) as again:
        assert collect(again)[0] == first


def test_batches_are_uint8_nhwc_or_channels_last_nchw(indexed_dataset: Path) -> None:
    with Loader(
        indexed_dataset, batch_size=8, num_workers=1, shuffle=False, transform=ImageTransform(size=(24, 40)), output=Output(layout="NCHW")
    ) as loader:
        images, labels = next(iter(loader))
        assert images.shape == (8, 3, 24, 40) and images.dtype == torch.uint8
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert labels.dtype == torch.int64 and labels.tolist() == list(range(8))
    with Loader(
        indexed_dataset, batch_size=8, num_workers=0, transform=ImageTransform(size=24), output=Output(copy=True, layout="NHWC")
    ) as loader:
        images, _ = next(iter(loader))
        assert images.shape == (8, 24, 24, 3) and images.is_contiguous()


@pytest.mark.parametrize("stop", [0, 3, 7])
def test_resume_gives_the_identical_remaining_stream(indexed_dataset: Path, stop: int) -> None:
    settings = dict(batch_size=16, num_workers=2, seed=5, transform=ImageTransform(size=32))
    with Loader(indexed_dataset, **settings) as reference:
        collect(reference)  # epoch 0
        expected_labels, expected_images = collect(reference)  # epoch 1
        following_labels, following_images = collect(reference)  # epoch 2
    with Loader(indexed_dataset, **settings) as first:
        collect(first)
        iterator = iter(first)
        for _ in range(stop):
            next(iterator)
        state = first.state_dict()
    with Loader(indexed_dataset, **settings) as resumed:
        resumed.load_state_dict(state)
        labels, images = collect(resumed)
        if stop < 7:
            assert labels == expected_labels[stop:]
            assert images == expected_images[stop:]
            assert resumed.epoch == 2
        else:  # taken after the last batch of epoch 1: the resumed iteration is epoch 2
            assert labels == following_labels
            assert images == following_images
            assert resumed.epoch == 3


def test_resume_refuses_other_settings(indexed_dataset: Path) -> None:
    with Loader(indexed_dataset, batch_size=16, num_workers=0, seed=5, transform=ImageTransform(size=32)) as loader:
        state = loader.state_dict()
    with Loader(indexed_dataset, batch_size=8, num_workers=0, seed=5, transform=ImageTransform(size=32)) as other:
        with pytest.raises(ValueError, match="batch_size"):
            other.load_state_dict(state)


def test_unordered_delivery_covers_the_epoch_and_resumes(indexed_dataset: Path) -> None:
    with Loader(indexed_dataset, batch_size=8, num_workers=2, transform=ImageTransform(size=32), workers=Workers(ordered=False)) as loader:
        labels, _ = collect(loader)
        assert sorted(x for b in labels for x in b) == list(range(NUM_RECORDS))
        iterator = iter(loader)
        seen = [next(iterator)[1].tolist() for _ in range(5)]
        state = loader.state_dict()
    with Loader(indexed_dataset, batch_size=8, num_workers=2, transform=ImageTransform(size=32), workers=Workers(ordered=False)) as resumed:
        resumed.load_state_dict(state)
        rest, _ = collect(resumed)
    assert sorted(x for b in seen + rest for x in b) == list(range(NUM_RECORDS))


@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 8])
def test_ranks_disjoint_equal_and_covering(indexed_dataset: Path, world_size: int) -> None:
    per_rank = []
    for rank in range(world_size):
        with Loader(
            indexed_dataset,
            batch_size=4,
            num_workers=0,
            transform=ImageTransform(size=16),
            sampling=Sampling(rank=rank, world_size=world_size),
        ) as loader:
            labels, _ = collect(loader)
            assert len(labels) == len(loader)
            per_rank.append(labels)
    assert len({len(labels) for labels in per_rank}) == 1
    flat = [x for labels in per_rank for batch in labels for x in batch]
    assert sorted(flat) == list(range(NUM_RECORDS))


@pytest.mark.slow
def test_two_process_gloo_run_splits_the_epoch(indexed_dataset: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import json, sys, torch.distributed as dist
        from shardfmt import ImageTransform, Loader
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="file://{tmp_path}/rendezvous", rank=rank, world_size=2)
        with Loader({str(indexed_dataset)!r}, batch_size=8, num_workers=1, transform=ImageTransform(size=16)) as loader:
            assert (loader.rank, loader.world_size) == (rank, 2)
            labels = [b.tolist() for _, b in loader]
        dist.barrier()
        dist.destroy_process_group()
        open("{tmp_path}/rank%d.json" % rank, "w").write(json.dumps(labels))
        """
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(rank)], env=env) for rank in range(2)]
    assert [p.wait(timeout=90) for p in procs] == [0, 0]
    import json

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1])
    flat = [x for labels in ranks for batch in labels for x in batch]
    assert sorted(flat) == list(range(NUM_RECORDS))


def reference_crop(data: bytes, top: int, left: int, height: int, width: int, flip: bool, size: tuple[int, int]) -> np.ndarray:
    image = (
        Image.open(io.BytesIO(data)).convert("RGB").resize((size[1], size[0]), Image.BILINEAR, box=(left, top, left + width, top + height))
    )
    if flip:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(image)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.mark.parametrize("fast_decode, floor", [(False, 50.0), (True, 40.0)])
@pytest.mark.parametrize("pipeline", [RandomResizedCrop((32, 32)), CenterCrop((32, 32), resize=36)])
def test_pixels_match_pil_on_the_same_boxes(indexed_dataset: Path, pipeline: object, fast_decode: bool, floor: float) -> None:
    """Crops match PIL's Image.resize(BILINEAR, box=...) on the same boxes, and an eval crop PIL's
    resize of the whole image then the centred crop: mean PSNR above `floor`."""
    reader = open_dataset(indexed_dataset)
    scores = []
    with Loader(
        indexed_dataset,
        batch_size=16,
        num_workers=0,
        seed=9,
        shuffle=False,
        transform=ImageTransform(crop=pipeline, fast_decode=fast_decode),
        output=Output(layout="NHWC"),
    ) as loader:
        for images, labels in loader:
            indices = labels.numpy()
            infos = [reader[int(i)].image_info() for i in indices]
            heights = np.array([info.height for info in infos])
            widths = np.array([info.width for info in infos])
            plan = pipeline.plan(heights, widths, record_keys(9, AUGMENT_STREAM, 0, indices.astype(np.uint64)))  # type: ignore[attr-defined]
            for k, index in enumerate(indices):
                data = bytes(reader[int(index)]["image"])
                if isinstance(pipeline, CenterCrop):  # torchvision's Resize + CenterCrop, PIL's resize of the whole image
                    resized_h, resized_w, top, left = pipeline.resized_crop(int(heights[k]), int(widths[k]))
                    whole = Image.open(io.BytesIO(data)).convert("RGB").resize((resized_w, resized_h), Image.BILINEAR)
                    scores.append(psnr(images[k].numpy(), np.asarray(whole)[top : top + 32, left : left + 32]))
                    continue
                expected = reference_crop(
                    data,
                    int(plan.top[k]),
                    int(plan.left[k]),
                    int(plan.height[k]),
                    int(plan.width[k]),
                    bool(plan.flip[k]),
                    (32, 32),
                )
                scores.append(psnr(images[k].numpy(), expected))
    assert np.mean(scores) >= floor
    assert np.percentile(scores, 5) >= 30.0


@pytest.mark.usefixtures("no_leaks")
def test_a_corrupt_record_is_named(indexed_dataset: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(indexed_dataset, broken)
    reader = open_dataset(broken)
    shard_index, local = reader.locate(40)
    shard = reader.shard(shard_index)
    offset = int(shard.table[local]["image.offset"]) + 200
    path = shard.path
    reader.close()
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(WorkerError) as info:
        with Loader(broken, batch_size=8, num_workers=2, shuffle=False, transform=ImageTransform(size=16)) as loader:
            collect(loader)
    assert info.value.path == path and info.value.record == local
    assert "checksum" in str(info.value)


@pytest.mark.parametrize(("verify", "checks_per_record"), [(True, 1), ("always", 3), (False, 0)])
def test_local_records_are_checked_once_per_loader_by_default(
    indexed_dataset: Path, monkeypatch: pytest.MonkeyPatch, verify: object, checks_per_record: int
) -> None:
    from shardfmt.format._reader import ShardReader

    checked: list[tuple[str, int]] = []
    original = ShardReader.verify_record

    def counting(self: ShardReader, index: int) -> None:
        checked.append((self.path, index))
        original(self, index)

    monkeypatch.setattr(ShardReader, "verify_record", counting)
    with Loader(indexed_dataset, batch_size=16, num_workers=0, verify=verify, transform=ImageTransform(size=16)) as loader:
        for _ in range(3):
            collect(loader)
    # "always" may also check the batches decoded ahead for the next epoch
    assert checks_per_record * NUM_RECORDS <= len(checked) <= checks_per_record * (NUM_RECORDS + 2 * 16)
    assert len(set(checked)) == (NUM_RECORDS if checks_per_record else 0)


def test_workers_share_the_checked_records(indexed_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over three epochs on two forked workers each record is checked once, by one worker or
    the other (a rare lost bit may cost one extra check)."""
    from shardfmt.format._reader import ShardReader

    log = tmp_path / "checks.log"
    original = ShardReader.verify_record

    def logging_check(self: ShardReader, index: int) -> None:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {self.path} {index}\n")
        original(self, index)

    monkeypatch.setattr(ShardReader, "verify_record", logging_check)
    with Loader(
        indexed_dataset, batch_size=8, num_workers=2, transform=ImageTransform(size=16), workers=Workers(start_method="fork")
    ) as loader:
        for _ in range(3):
            collect(loader)
    lines = log.read_text().splitlines()
    assert len({line.split(" ", 1)[1] for line in lines}) == NUM_RECORDS
    assert len(lines) <= NUM_RECORDS + 8
    assert len({line.split(" ", 1)[0] for line in lines}) == 2, "both workers checked records"


def test_verify_takes_only_its_three_values(indexed_dataset: Path) -> None:
    with pytest.raises(ValueError, match="verify must be"):
        Loader(indexed_dataset, batch_size=8, num_workers=0, verify="sometimes")


def unlinked_rings(pid: int | str = "self") -> list[str]:
    """The slot rings a process maps whose names are gone from /dev/shm (Linux's /proc)."""
    with open(f"/proc/{pid}/maps") as maps:
        return sorted({line.split(None, 5)[5].strip() for line in maps if "/shardfmt-" in line and line.rstrip().endswith("(deleted)")})


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
@pytest.mark.usefixtures("no_leaks")
def test_dev_shm_holds_no_name_while_running_after_close_and_after_an_error(indexed_dataset: Path) -> None:
    mapped = set(unlinked_rings())
    loader = Loader(indexed_dataset, batch_size=8, num_workers=2, transform=ImageTransform(size=16))
    next(iter(loader))
    ring = set(unlinked_rings()) - mapped  # mappings of deleted files: the names are gone already
    assert len(ring) == 3, "the ring's slots (prefetch + 1, a segment each) live on through their mappings"
    assert not {os.path.basename(name.removesuffix(" (deleted)")) for name in ring} & set(os.listdir("/dev/shm"))
    assert all(ring <= set(unlinked_rings(pid)) for pid in loader.worker_pids)
    loader.close()
    with pytest.raises(RuntimeError, match="training step failed"):
        with Loader(indexed_dataset, batch_size=8, num_workers=2, transform=ImageTransform(size=16)) as loader:
            for _ in loader:
                raise RuntimeError("training step failed")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
@pytest.mark.slow
def test_an_unhandled_error_leaves_nothing_in_dev_shm(indexed_dataset: Path) -> None:
    # The ring is named after the process that makes it: the child prints the rings it maps.
    script = (
        "import os\nfrom shardfmt import ImageTransform, Loader\n"
        f"for batch in Loader({str(indexed_dataset)!r}, batch_size=8, num_workers=2, transform=ImageTransform(size=16)):\n"
        "    print(*sorted({line.split()[5] for line in open('/proc/self/maps') if f'/shardfmt-{os.getpid()}-' in line}))\n"
        "    raise SystemExit(3)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    child = subprocess.run([sys.executable, "-c", script], env=env, timeout=60, capture_output=True, text=True)
    assert child.returncode == 3, child.stderr
    made = child.stdout.split()
    assert len(made) == 3, "the child's loader mapped its ring's three slots (prefetch + 1, a segment each)"
    assert not {os.path.basename(name) for name in made} & set(os.listdir("/dev/shm"))


@pytest.mark.usefixtures("no_leaks")
def test_a_killed_worker_is_reported_not_waited_for(indexed_dataset: Path) -> None:
    """The loader raises with the signal instead of waiting for the dead worker's chunk (a hang
    fails the suite's per-test timeout, pyproject's ``timeout = 120``, not a timed assertion)."""
    loader = Loader(indexed_dataset, batch_size=8, num_workers=2, transform=ImageTransform(size=16))
    iterator = iter(loader)
    next(iterator)
    os.kill(loader.worker_pids[0], signal.SIGKILL)
    with pytest.raises(WorkerError, match="killed by signal 9"):
        for _ in range(100):
            next(iterator)
        list(loader)
    loader.close()


@pytest.mark.slow
def test_spawn_start_method_works(indexed_dataset: Path) -> None:
    with Loader(
        indexed_dataset,
        batch_size=32,
        num_workers=1,
        shuffle=False,
        transform=ImageTransform(size=16),
        workers=Workers(start_method="spawn"),
    ) as loader:
        labels, _ = collect(loader)
    assert sorted(x for b in labels for x in b) == list(range(NUM_RECORDS))


def test_dataset_in_a_torch_dataloader(indexed_dataset: Path) -> None:
    from shardfmt import Dataset

    dataset = Dataset(indexed_dataset, transform=ImageTransform(crop="eval", size=24))
    assert len(dataset) == NUM_RECORDS
    loader = torch.utils.data.DataLoader(dataset, batch_size=10, num_workers=2, shuffle=True)
    labels = []
    for images, label in loader:
        assert images.shape[1:] == (3, 24, 24) and images.dtype == torch.uint8
        labels.extend(label.tolist())
    assert sorted(labels) == list(range(NUM_RECORDS))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_delivery_normalises_on_the_device(indexed_dataset: Path) -> None:
    mean, std = (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)
    with Loader(
        indexed_dataset,
        batch_size=16,
        num_workers=2,
        shuffle=False,
        transform=ImageTransform(size=32, fast_decode=False),
        output=Output(layout="NHWC"),
    ) as cpu:
        expected = [(images.clone(), labels.clone()) for images, labels in cpu]
    with Loader(
        indexed_dataset,
        batch_size=16,
        num_workers=2,
        shuffle=False,
        device="cuda",
        transform=ImageTransform(size=32, fast_decode=False, mean=mean, std=std),
        output=Output(layout="NCHW"),
    ) as gpu:
        for (images, labels), (cpu_images, cpu_labels) in zip(gpu, expected, strict=True):
            assert images.device.type == "cuda" and images.dtype == torch.float32
            reference = (cpu_images.float() - torch.tensor(mean)) / torch.tensor(std)
            torch.testing.assert_close(images.cpu(), reference.permute(0, 3, 1, 2))
            assert torch.equal(labels.cpu(), cpu_labels)


def test_breaking_out_then_iterating_again_starts_the_next_epoch(indexed_dataset: Path) -> None:
    """As with torch's DataLoader, every iter() is an epoch of its own: an epoch left early is
    not continued; batches prefetched across a finished epoch's end are kept."""
    with Loader(indexed_dataset, batch_size=16, num_workers=2, seed=4, transform=ImageTransform(size=32)) as reference:
        epochs = [collect(reference)[0] for _ in range(3)]
    with Loader(indexed_dataset, batch_size=16, num_workers=2, seed=4, transform=ImageTransform(size=32)) as loader:
        head, _ = collect(loader, limit=3)
        assert head == epochs[0][:3]
        assert collect(loader)[0] == epochs[1]  # the whole of epoch 1, not the rest of epoch 0
        assert collect(loader)[0] == epochs[2]  # after batches prefetched across the epoch boundary
        loader.set_epoch(1)  # a jump discards whatever was prefetched
        assert collect(loader)[0] == epochs[1]


@pytest.mark.usefixtures("no_leaks")
def test_too_little_shared_memory_is_a_clear_error(indexed_dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space, raising=False)
    loader = Loader(indexed_dataset, batch_size=8, num_workers=1, transform=ImageTransform(size=16))
    with pytest.raises(MemoryError, match="--shm-size"):
        next(iter(loader))


@pytest.mark.slow
@pytest.mark.usefixtures("no_leaks")
def test_ctrl_c_stops_cleanly(indexed_dataset: Path) -> None:
    """SIGINT in the training process ends it with KeyboardInterrupt: no hang, no leftovers."""
    script = textwrap.dedent(
        f"""
        import sys
        from shardfmt import ImageTransform, Loader
        loader = Loader({str(indexed_dataset)!r}, batch_size=8, num_workers=2, transform=ImageTransform(size=16))
        print("ready", flush=True)
        try:
            while True:
                for batch in loader:
                    pass
        except KeyboardInterrupt:
            loader.close()
            print("interrupted", flush=True)
            sys.exit(130)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    with subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 130
        assert "interrupted" in process.stdout.read()
