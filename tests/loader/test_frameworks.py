"""The Loader where training code already runs: what frameworks call on a loader (an ``iter()``
to check it, ``set_epoch`` after ``iter()``, the DataLoader attributes), ranks taken from a
process group made after the loader, the workers under a parent's signal handlers, and
Lightning's Trainer itself (1 process, and 2 with ``ddp_spawn``) and Accelerate's
``prepare`` and ``save_state``/``load_state`` (docs/frameworks.md)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as tmp
from conftest import jpeg_bytes

from shardfmt import DatasetWriter, ImageTransform, Loader, Output, Sampling, Workers
from shardfmt.format import IMAGE_CLASSIFICATION

NUM_RECORDS = 40
REPO = Path(__file__).resolve().parents[2]
SETTINGS: dict[str, Any] = dict(batch_size=4, seed=5, transform=ImageTransform(size=8, crop="resize"), output=Output(return_indices=True))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 records whose label is their index, in several shards."""
    out = tmp_path_factory.mktemp("frameworks") / "ds"
    with DatasetWriter(out, schema=IMAGE_CLASSIFICATION, shard_size=20_000) as writer:
        for i in range(NUM_RECORDS):
            writer.write({"image": jpeg_bytes(12, 16, seed=i), "label": i, "key": f"k{i}"})
    return out


def indices_of(loader: Any) -> list[list[int]]:
    return [batch[2].tolist() for batch in loader]


def reference(path: Path, *, epochs: int, **changes: Any) -> list[list[list[int]]]:
    """Each epoch's batches of record indices, from a loader iterated plainly."""
    with Loader(path, num_workers=0, **(SETTINGS | changes)) as loader:
        return [indices_of(loader) for _ in range(epochs)]


# -- what frameworks call ----------------------------------------------------------------------


def test_an_iter_never_advanced_starts_no_epoch(dataset: Path) -> None:
    """Lightning calls iter() to check a loader, then iter() for the epoch."""
    expected = reference(dataset, epochs=2)
    with Loader(dataset, num_workers=2, **SETTINGS) as loader:
        iter(loader)  # looked at, never advanced
        assert indices_of(loader) == expected[0]
        iter(loader)
        iter(loader)
        assert indices_of(loader) == expected[1]
        assert loader.epoch == 2


def test_set_epoch_of_the_epoch_about_to_start_keeps_the_iterator_and_the_position(dataset: Path) -> None:
    """Lightning calls iter(), then set_epoch(epoch); after load_state_dict, set_epoch(saved epoch)."""
    expected = reference(dataset, epochs=2)
    with Loader(dataset, num_workers=2, **SETTINGS) as loader:
        iterator = iter(loader)
        loader.set_epoch(0)
        assert [batch[2].tolist() for batch in iterator] == expected[0]
        iterator = iter(loader)
        loader.set_epoch(1)
        head = [next(iterator)[2].tolist() for _ in range(3)]
        state = loader.state_dict()
    assert head == expected[1][:3]
    with Loader(dataset, num_workers=2, **SETTINGS) as resumed:
        resumed.load_state_dict(state)
        iterator = iter(resumed)
        resumed.set_epoch(1)
        assert [batch[2].tolist() for batch in iterator] == expected[1][3:]


@pytest.mark.slow  # the first import of Lightning, about 10 s on two loaded cores
def test_the_dataloader_attributes_mean_what_they_mean_on_a_dataloader(dataset: Path) -> None:
    from lightning.fabric.utilities.data import _set_sampler_epoch, has_len
    from lightning.pytorch.utilities.data import _is_dataloader_shuffled

    expected = reference(dataset, epochs=2, drop_last=True, batch_size=6)
    with Loader(dataset, num_workers=0, **(SETTINGS | {"drop_last": True, "batch_size": 6})) as loader:
        sampler = loader.batch_sampler
        assert (sampler.batch_size, sampler.drop_last, len(sampler), len(loader)) == (6, True, 6, 6)
        assert sampler.sampler is loader.sampler
        assert (loader.batch_size, loader.drop_last, loader.num_workers, len(loader.dataset)) == (6, True, 0, NUM_RECORDS)
        assert list(sampler) == expected[0]  # what the epoch about to start delivers ...
        assert indices_of(loader) == expected[0]  # ... and looking moved nothing
        assert has_len(loader) and not _is_dataloader_shuffled(loader)
        _set_sampler_epoch(loader, 1)
        assert list(sampler) == expected[1] == indices_of(loader)


def test_lightning_does_not_rebuild_a_loader_with_a_distributed_sampler(dataset: Path) -> None:
    """Lightning replaces the sampler of torch DataLoaders only; a Loader is used as it is."""
    from lightning.pytorch.trainer.connectors.data_connector import _DataConnector
    from lightning.pytorch.trainer.states import RunningStage

    class Trainer:  # what _prepare_dataloader reads of a Trainer with use_distributed_sampler=True
        _accelerator_connector = type("Connector", (), {"use_distributed_sampler": True, "is_distributed": True})()

    with Loader(dataset, num_workers=0, **SETTINGS) as loader:
        connector = _DataConnector(Trainer())  # type: ignore[arg-type]
        assert connector._prepare_dataloader(loader, shuffle=True, mode=RunningStage.TRAINING) is loader


# -- ranks from a process group made after the loader -------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_main(rank: int, path: str, port: int, out: str) -> None:
    """Made before the process group, as in a DataModule's __init__; then one epoch, and a
    loader whose world size disagrees with the group's."""
    os.environ["OMP_NUM_THREADS"] = "1"
    early = Loader(path, num_workers=1, **SETTINGS)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        length = len(early)
        seen = indices_of(early)
        early.close()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with Loader(path, num_workers=0, **SETTINGS, sampling=Sampling(world_size=1, rank=0)) as whole:
                whole_epoch = indices_of(whole)
        messages = [str(w.message) for w in caught]
        Path(out, f"rank{rank}.json").write_text(json.dumps({"len": length, "seen": seen, "whole": whole_epoch, "warnings": messages}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_loader_made_before_the_process_group_reads_its_rank_share(dataset: Path, tmp_path: Path) -> None:
    tmp.spawn(rank_main, args=(str(dataset), free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    epoch = reference(dataset, epochs=1)[0]
    for rank, found in enumerate(ranks):
        assert found["len"] == 5
        assert found["seen"] == reference(dataset, epochs=1, sampling=Sampling(rank=rank, world_size=2))[0]
        assert found["whole"] == epoch  # asked for: every record, and said so
        assert found["warnings"] == [
            "Sampling(world_size=1) differs from the initialised process group's world size 2: this rank reads 1/1 of each "
            "epoch, not 1/2; pass rank=None, world_size=None to take the process group's"
        ]
    shares = [set(np.concatenate(found["seen"]).tolist()) for found in ranks]
    assert not shares[0] & shares[1] and shares[0] | shares[1] == set(range(NUM_RECORDS))


# -- signal handlers the workers inherit ---------------------------------------------------------


def test_workers_do_not_run_the_parents_signal_handlers(dataset: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A handler that prints and carries on, as Lightning's SIGTERM handler does: each worker
    ends by the SIGTERM close() sends, without printing and without being killed."""
    ran: list[int] = []

    def handler(number: int, frame: Any) -> None:
        ran.append(os.getpid())
        print(f"handler ran in {os.getpid()}", flush=True)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        with Loader(dataset, num_workers=2, **SETTINGS, workers=Workers(start_method="fork")) as loader:
            assert sum(len(batch) for batch in indices_of(loader)) == NUM_RECORDS
            processes = list(loader.scheduler.pool.processes)
        assert [p.exitcode for p in processes] == [-signal.SIGTERM, -signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert ran == []
    assert "handler ran" not in capfd.readouterr().out


# -- num_workers -----------------------------------------------------------------------------------


def test_num_workers_past_four_a_core_is_taken_with_a_warning(dataset: Path) -> None:
    cores = os.cpu_count() or 1
    many = 4 * cores + 1
    with pytest.warns(UserWarning, match=rf"num_workers={many} is more than 4 a core on this machine of {cores}"):
        loader = Loader(dataset, num_workers=many, **SETTINGS)
    with loader:
        assert loader.num_workers == many
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Loader(dataset, num_workers=4 * cores, **SETTINGS).close()
    with pytest.raises(ValueError, match=rf"num_workers must be in \[0, {max(256, 4 * cores)}\]"):
        Loader(dataset, num_workers=max(256, 4 * cores) + 1, **SETTINGS)


# -- Lightning --------------------------------------------------------------------------------------


def fit(path: Path, out: Path, name: str, *, devices: int, ckpt_path: Path | None = None) -> Any:
    """A Trainer's fit of 2 epochs over a DataModule's Loaders, checkpointing every 3 steps;
    returns the trainer and what each rank trained and validated on."""
    import lightning as L
    from framework_parts import Recorder, Shards
    from lightning.pytorch.callbacks import ModelCheckpoint

    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp_spawn" if devices > 1 else "auto",
        max_epochs=2,
        logger=False,
        enable_checkpointing=True,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=out / "checkpoints", every_n_train_steps=3, save_top_k=-1)],
    )
    trainer.fit(Recorder(str(out), name), datamodule=Shards(str(path), num_workers=1), ckpt_path=ckpt_path)
    seen = [json.loads((out / f"{name}-fit-rank{rank}.json").read_text()) for rank in range(devices)]
    return trainer, seen


def steps(seen: dict[str, Any]) -> list[list[Any]]:
    return [[epoch, step, indices] for epoch, step, indices in seen["seen"]["fit"]]


# The resumed runs write their checkpoints beside those of the run they resume, on purpose.
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty:UserWarning")
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_lightning_fits_validates_and_resumes_mid_epoch_exactly(dataset: Path, tmp_path: Path) -> None:
    trainer, [whole] = fit(dataset, tmp_path, "whole", devices=1)
    expected = reference(dataset, epochs=2)
    assert (trainer.global_step, trainer.num_training_batches, trainer.num_val_batches) == (20, 10, [10])
    assert steps(whole) == [[epoch, 10 * epoch + step, expected[epoch][step]] for epoch in range(2) for step in range(10)]
    evaluation = reference(dataset, epochs=1, shuffle=False)[0]
    # the sanity check's 2 batches, then the whole validation set after each epoch
    assert whole["seen"]["validate"] == [[0, b, evaluation[b]] for b in range(2)] + [
        [epoch, b, evaluation[b]] for epoch in range(2) for b in range(10)
    ]
    for checkpoint, done in (("epoch=0-step=6.ckpt", 6), ("epoch=1-step=12.ckpt", 12)):
        resumed, [after] = fit(dataset, tmp_path, f"after{done}", devices=1, ckpt_path=tmp_path / "checkpoints" / checkpoint)
        assert resumed.global_step == 20
        assert steps(after) == steps(whole)[done:]
    trainer.validate(trainer.lightning_module, datamodule=__import__("framework_parts").Shards(str(dataset), num_workers=0))
    validated = json.loads((tmp_path / "whole-validate-rank0.json").read_text())
    assert validated["seen"]["validate"][-10:] == [[2, b, evaluation[b]] for b in range(10)]


# The resumed runs write their checkpoints beside those of the run they resume, on purpose.
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty:UserWarning")
@pytest.mark.slow
@pytest.mark.timeout(900)  # four processes that import Lightning, about 100 s on two loaded cores
def test_lightning_ddp_spawn_gives_two_ranks_disjoint_equal_shares_and_resumes(dataset: Path, tmp_path: Path) -> None:
    _, ranks = fit(dataset, tmp_path, "whole", devices=2)
    for rank, seen in enumerate(ranks):
        expected = reference(dataset, epochs=2, sampling=Sampling(rank=rank, world_size=2))
        assert seen["global_step"] == 10
        assert steps(seen) == [[epoch, 5 * epoch + step, expected[epoch][step]] for epoch in range(2) for step in range(5)]
        evaluation = reference(dataset, epochs=1, shuffle=False, sampling=Sampling(rank=rank, world_size=2))[0]
        assert seen["seen"]["validate"][2:] == [[epoch, b, evaluation[b]] for epoch in range(2) for b in range(5)]
    for epoch in range(2):
        shares = [{i for _, _, batch in steps(seen)[5 * epoch : 5 * epoch + 5] for i in batch} for seen in ranks]
        assert len(shares[0]) == len(shares[1]) == NUM_RECORDS // 2
        assert not shares[0] & shares[1] and shares[0] | shares[1] == set(range(NUM_RECORDS))
    # the checkpoint holds rank 0's loader state; each rank continues its own share from it
    _, after = fit(dataset, tmp_path, "after3", devices=2, ckpt_path=tmp_path / "checkpoints" / "epoch=0-step=3.ckpt")
    for rank in range(2):
        assert after[rank]["global_step"] == 10
        assert steps(after[rank]) == steps(ranks[rank])[3:]

# -- Accelerate -------------------------------------------------------------------------------------

ACCELERATE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from accelerate import Accelerator
    from shardfmt import ImageTransform, Loader, Output

    path, out = sys.argv[1], sys.argv[2]
    SETTINGS = dict(batch_size=4, seed=5, num_workers=1, transform=ImageTransform("resize", size=8), output=Output(return_indices=True))

    def train(accelerator, loader, model, optimizer, seen, first_epoch, save_at=None):
        for epoch in range(first_epoch, 2):
            loader.set_epoch(epoch)
            for step, (images, labels, indices) in enumerate(loader):
                loss = torch.nn.functional.cross_entropy(model(images.float().mean((2, 3))), labels % 2)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                seen.append(indices.tolist())
                if (epoch, step) == save_at:
                    accelerator.save_state(out + "/state")

    def run(resume):
        accelerator = Accelerator(cpu=True)
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        model, optimizer, loader = accelerator.prepare(model, optimizer, Loader(path, **SETTINGS))
        accelerator.register_for_checkpointing(loader)
        seen = []
        if resume:
            accelerator.load_state(out + "/state")
            train(accelerator, loader, model, optimizer, seen, loader.epoch)
        else:
            train(accelerator, loader, model, optimizer, seen, 0, save_at=(0, 2))
        loader.close()
        return accelerator.process_index, accelerator.num_processes, len(loader), seen

    rank, world, length, whole = run(resume=False)
    resumed = run(resume=True)[3]
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"world": world, "len": length, "whole": whole, "resumed": resumed}, f)
    """
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_accelerate_launch_gives_two_ranks_their_shares_and_resumes_from_save_state(dataset: Path, tmp_path: Path) -> None:
    """``accelerator.prepare`` hands the Loader back as it is (its ranks come from the process
    group Accelerate made); ``register_for_checkpointing(loader)`` puts its state in
    save_state, which rank 0 writes and every rank continues its own share from."""
    script = tmp_path / "train.py"
    script.write_text(ACCELERATE_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    launch += ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]
    result = subprocess.run([*launch, str(script), str(dataset), str(tmp_path)], env=env, capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank, found in enumerate(ranks):
        expected = [batch for epoch in reference(dataset, epochs=2, sampling=Sampling(rank=rank, world_size=2)) for batch in epoch]
        assert (found["world"], found["len"], len(found["whole"])) == (2, 5, 10)
        assert found["whole"] == expected
        assert found["resumed"] == expected[3:]
    shares = [{i for batch in found["whole"][:5] for i in batch} for found in ranks]
    assert len(shares[0]) == len(shares[1]) == NUM_RECORDS // 2 and not shares[0] & shares[1]
