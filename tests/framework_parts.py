"""A tiny LightningModule and LightningDataModule over shardfmt Loaders, in a module of their
own so that the processes Lightning's ``ddp_spawn`` starts can import them
(tests/loader/test_frameworks.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch

from shardfmt import ImageTransform, Loader, Output

BATCH_SIZE = 4
SETTINGS: dict[str, Any] = dict(
    batch_size=BATCH_SIZE, seed=5, transform=ImageTransform(size=8, crop="resize"), output=Output(return_indices=True)
)


class Recorder(L.LightningModule):
    """Records the record indices of every batch it trains and validates on, and writes them to
    ``out/name-rank{r}.json`` when a stage ends."""

    def __init__(self, out: str, name: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 2)
        self.out, self.name = out, name
        self.seen: dict[str, list[Any]] = {"fit": [], "validate": []}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels, indices = batch
        self.seen["fit"].append([self.current_epoch, self.global_step, indices.tolist()])
        return torch.nn.functional.cross_entropy(self.layer(images.float().mean((2, 3))), labels % 2)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.seen["validate"].append([self.current_epoch, batch_idx, batch[2].tolist()])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def teardown(self, stage: str) -> None:
        record = {"seen": self.seen, "global_step": self.global_step}
        (Path(self.out) / f"{self.name}-{getattr(stage, 'value', stage)}-rank{self.global_rank}.json").write_text(json.dumps(record))


class Shards(L.LightningDataModule):
    """Loaders over `path`, made when Lightning first asks for them and closed at teardown."""

    def __init__(self, path: str, *, num_workers: int) -> None:
        super().__init__()
        self.path, self.num_workers = path, num_workers
        self.loaders: dict[str, Loader] = {}

    def train_dataloader(self) -> Loader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> Loader:
        return self._loader("val", shuffle=False)

    def _loader(self, name: str, *, shuffle: bool) -> Loader:
        if name not in self.loaders:
            self.loaders[name] = Loader(self.path, num_workers=self.num_workers, shuffle=shuffle, **SETTINGS)
        return self.loaders[name]

    def teardown(self, stage: str) -> None:
        for loader in self.loaders.values():
            loader.close()
        self.loaders = {}
