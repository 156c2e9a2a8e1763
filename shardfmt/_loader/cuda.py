"""Delivery on a CUDA device: pinned slots, copies on a side stream, normalisation on the GPU."""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from .shm import SlotRing

__all__ = ["DeviceStage"]


def _clear_cuda_error() -> None:
    """Reset the CUDA runtime's last error after a call whose failure was handled here
    (torch's bindings of cudaHostRegister do not), through the libcudart this process loaded."""
    try:
        with open("/proc/self/maps") as maps:
            path = next((line.split()[-1] for line in maps if "libcudart" in line), None)
        if path is not None:
            ctypes.CDLL(path).cudaGetLastError()
    except (OSError, AttributeError):
        pass


class DeviceStage:
    """Copy batches from shared-memory slots to a CUDA device without blocking the host.

    The slots are page-locked in place with cudaHostRegister (falling back to a pinned staging
    copy where that fails), so `non_blocking` copies are true asynchronous DMA. Copies run on a
    side stream; the consumer's current stream waits on them, so the next step's compute and the
    copy of the batch after it overlap.

    Args:
        device: a CUDA device.
        mean, std: per-channel values on the 0-255 scale; when given, batches arrive as float32
            ``(x - mean) / std``; otherwise as uint8.
        layout: "NHWC" or "NCHW" (channels_last memory).
        side_stream: copy on a stream of its own (the default); False copies on the consumer's
            current stream, so that the copy and the step before it run one after the other
            (what tools/bench_train.py compares against).

    Raises:
        RuntimeError: CUDA is not available.
    """

    def __init__(
        self, device: torch.device, *, mean: tuple[float, ...] | None, std: tuple[float, ...] | None, layout: str, side_stream: bool = True
    ) -> None:
        if device.type != "cuda":
            raise ValueError(f"device must be a CUDA device, got {device}")
        if not torch.cuda.is_available():
            raise RuntimeError("device='cuda' was asked for, but torch.cuda.is_available() is False")
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        self.device = device
        self.layout = layout
        self.stream = torch.cuda.Stream(device=device) if side_stream else torch.cuda.current_stream(device)
        self._mean = torch.tensor(mean, dtype=torch.float32, device=device).view(1, 1, 1, -1) if mean is not None else None
        self._std = torch.tensor(std, dtype=torch.float32, device=device).view(1, 1, 1, -1) if std is not None else None
        self._registered: list[int] = []
        self._staging: dict[str, torch.Tensor] | None = None

    def pin(self, ring: SlotRing) -> None:
        """Page-lock every array of every slot of `ring` (or prepare pinned staging buffers)."""
        cudart: Any = torch.cuda.cudart()
        for slot in ring.arrays:
            for array in slot.values():
                tensor = torch.from_numpy(array)
                code = cudart.cudaHostRegister(tensor.data_ptr(), tensor.numel() * tensor.element_size(), 0)
                if int(code) != 0:
                    _clear_cuda_error()  # else the next CUDA call in torch reports this failure as its own
                    self._staging = {
                        name: torch.empty(a.shape, dtype=torch.from_numpy(a).dtype, pin_memory=True) for name, a in ring.arrays[0].items()
                    }
                    return
                self._registered.append(tensor.data_ptr())

    def unpin(self) -> None:
        """Undo `pin` (before the ring's arrays change or go): a registration left behind outlives
        the mapping, and a later mapping at the same address then fails to register."""
        if self._registered:
            self.stream.synchronize()  # no copy out of the slots is in flight
            cudart: Any = torch.cuda.cudart()
            for pointer in self._registered:
                if int(cudart.cudaHostUnregister(pointer)) != 0:
                    _clear_cuda_error()
        self._registered = []
        self._staging = None

    def transfer(
        self, tensors: dict[str, torch.Tensor], images: set[str], *, normalised: str | None
    ) -> tuple[dict[str, torch.Tensor], torch.cuda.Event]:
        """Start copying one batch (every field); return the device tensors and an event marking
        the copy's end. The fields named in `images` (N x H x W x C) are permuted to the layout,
        and the field `normalised` (one of them, or None) normalised with the mean and std."""
        if self._staging is not None:
            staged = {}
            for name, tensor in tensors.items():
                if tensor.device.type == "cuda":  # decoded on the device already (decode="gpu")
                    staged[name] = tensor
                    continue
                staging = self._staging[name][: len(tensor)]
                staging.copy_(tensor)
                staged[name] = staging
            tensors = staged
        with torch.cuda.stream(self.stream):
            on_device = {}
            for name, tensor in tensors.items():
                moved = tensor.to(self.device, non_blocking=True)
                if name in images:
                    if name == normalised and self._mean is not None and self._std is not None:  # given together
                        moved = (moved.float() - self._mean) / self._std
                    if self.layout == "NCHW":
                        moved = moved.permute(0, 3, 1, 2)
                on_device[name] = moved
            done = torch.cuda.Event()
            done.record(self.stream)
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(done)
        for tensor in on_device.values():
            tensor.record_stream(consumer)
        return on_device, done
