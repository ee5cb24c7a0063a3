"""Device and dtype names shared by the trainer, the gateway and the embedded engine, so that
`envhub train`, `envhub gateway` and `envhub engine` accept the same `--device` and `--dtype`
values and refuse a bad one with the same words.

    check_device("cuda:1")   # -> "cuda:1"; syntax only, no torch import (config validators)
    resolve_device("cuda")   # -> torch.device("cuda"); DeviceUnavailable when CUDA is absent

`auto` (or None) means: CUDA when present, else the CPU.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["DEVICES", "DTYPES", "DeviceUnavailable", "auto_dtype", "check_device",
           "check_dtype", "resolve_device"]

DEVICES = "auto, cpu, cuda, cuda:N (N = 0, 1, ...), mps"
DTYPES = ("auto", "float32", "bfloat16", "float16")  # auto: bfloat16 on CUDA, float32 elsewhere
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


class DeviceUnavailable(ValueError):
    """A well-formed device this machine does not have (`cuda` without CUDA, `cuda:3` with
    two GPUs). A ValueError, so the CLIs report it like any bad flag value."""


def check_device(name: str) -> str:
    """`name` trimmed and lower-cased when it is one of DEVICES; ValueError naming them if not."""
    device = name.strip().lower()
    if not _DEVICE.fullmatch(device):
        raise ValueError(f"device {name!r}: use one of {DEVICES}")
    return device


def check_dtype(name: str) -> str:
    """`name` lower-cased when it is one of DTYPES; ValueError naming them if not."""
    dtype = name.strip().lower()
    if dtype not in DTYPES:
        raise ValueError(f"dtype {name!r}: use one of {', '.join(DTYPES)}")
    return dtype


def auto_dtype(dtype: str, device_type: str) -> str:
    """`dtype` with `auto` made concrete for a device of `device_type` ("cuda", "cpu", ...):
    bfloat16 on CUDA; float32 elsewhere (bf16 matmuls on a CPU are slow, their logprobs noisy)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if device_type == "cuda" else "float32"


def resolve_device(name: str | None) -> torch.device:
    """The torch device `name` names, checked against this machine (DeviceUnavailable, with
    the fix, instead of an error deep inside torch on first use). Asking whether CUDA is
    present does not initialise it: `cpu` leaves `torch.cuda.is_initialized()` False."""
    import torch

    device = check_device(name or "auto")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device.partition(":")[2] or 0)
        if index >= count:
            have = (f"{count} CUDA device(s)" if count
                    else "no CUDA (torch.cuda.is_available() is False)")
            raise DeviceUnavailable(f"device {device!r}: this machine has {have}; use --device "
                                    "cpu, --device auto, or a CUDA device it has")
    if device == "mps" and not torch.backends.mps.is_available():
        raise DeviceUnavailable("device 'mps': this machine has no Apple GPU (MPS); use "
                                "--device cpu or --device auto")
    return torch.device(device)
