"""Device selection: ``auto`` is CUDA when present, else the CPU — one code path for both."""

from __future__ import annotations

import torch

from dynlab.errors import DynlabInputError

__all__ = ["DEVICE_CHOICES", "resolve_device"]

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Turn ``auto | cpu | cuda | cuda:N`` into a ``torch.device``; refuse unavailable ones."""
    if isinstance(device, torch.device):
        return device
    name = str(device).strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DynlabInputError(f"device {device!r} requested but CUDA is not available; allowed here: auto, cpu")
        return torch.device(name)
    raise DynlabInputError(f"unknown device {device!r}; allowed: {', '.join(DEVICE_CHOICES)} (or cuda:N)")
