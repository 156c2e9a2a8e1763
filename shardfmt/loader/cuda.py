"""Delivery on a CUDA device: pinned slots, copies on a side stream, normalisation on the GPU."""

from __future__ import annotations

from typing import Any

import torch

from .shm import SlotRing

__all__ = ["DeviceStage"]


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

    Raises:
        RuntimeError: CUDA is not available.
    """

    def __init__(self, device: torch.device, *, mean: tuple[float, ...] | None, std: tuple[float, ...] | None, layout: str) -> None:
        if device.type != "cuda":
            raise ValueError(f"device must be a CUDA device, got {device}")
        if not torch.cuda.is_available():
            raise RuntimeError("device='cuda' was asked for, but torch.cuda.is_available() is False")
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        self.device = device
        self.layout = layout
        self.stream = torch.cuda.Stream(device=device)
        self._mean = torch.tensor(mean, dtype=torch.float32, device=device).view(1, 1, 1, -1) if mean is not None else None
        self._std = torch.tensor(std, dtype=torch.float32, device=device).view(1, 1, 1, -1) if std is not None else None
        self._registered: list[int] = []
        self._staging: list[torch.Tensor] | None = None

    def pin(self, ring: SlotRing) -> None:
        """Page-lock every slot of `ring` (or prepare a pinned staging buffer)."""
        cudart: Any = torch.cuda.cudart()
        for images in ring.images:
            tensor = torch.from_numpy(images)
            code = cudart.cudaHostRegister(tensor.data_ptr(), tensor.numel(), 0)
            if int(code) != 0:
                self._staging = [torch.empty(images.shape, dtype=torch.uint8, pin_memory=True)]
                return
            self._registered.append(tensor.data_ptr())

    def transfer(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.cuda.Event]:
        """Start copying one batch; return the device tensors and an event marking the copy's end."""
        if self._staging is not None:
            staging = self._staging[0][: len(images)]
            staging.copy_(images)
            images = staging
        with torch.cuda.stream(self.stream):
            on_device = images.to(self.device, non_blocking=True)
            labels_on_device = labels.to(self.device, non_blocking=True)
            if self._mean is not None:
                on_device = (on_device.float() - self._mean) / self._std
            if self.layout == "NCHW":
                on_device = on_device.permute(0, 3, 1, 2)
            done = torch.cuda.Event()
            done.record(self.stream)
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(done)
        on_device.record_stream(consumer)
        labels_on_device.record_stream(consumer)
        return on_device, labels_on_device, done
