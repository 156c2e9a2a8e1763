"""`DistributedRanks`: a loader's rank and world size, as given or as torch.distributed has them."""

from __future__ import annotations

import warnings

import torch

__all__ = ["DistributedRanks"]


class DistributedRanks:
    """A loader's rank and world size: as given, else torch.distributed's when it is initialised,
    else (0, 1), asked again at each `resolve` (the loader asks when an epoch starts: a process
    group is often made after the loader). A world size given that differs from the initialised
    process group's is kept and warned about, once (each rank then reads another share than
    DDP expects)."""

    def __init__(self, rank: int | None, world_size: int | None) -> None:
        self.rank, self.world_size = rank, world_size
        self._warned = False

    def resolve(self) -> tuple[int, int]:
        rank, world_size = self.rank, self.world_size
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return (0 if rank is None else rank, 1 if world_size is None else world_size)
        group_rank, group_size = dist.get_rank(), dist.get_world_size()
        if world_size is not None and world_size != group_size and not self._warned:
            self._warned = True
            warnings.warn(
                f"Sampling(world_size={world_size}) differs from the initialised process group's world size {group_size}: "
                f"this rank reads 1/{world_size} of each epoch, not 1/{group_size}; pass rank=None, world_size=None "
                "to take the process group's",
                UserWarning,
                stacklevel=4,
            )
        return (group_rank if rank is None else rank, group_size if world_size is None else world_size)
