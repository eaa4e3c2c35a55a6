"""Where a benchmark's numbers come from, written beside every result (``OUT.json``): the device, the host
CPU, the versions and the date; and the roofline, the time a decode step needs to read every weight once."""

from __future__ import annotations

import platform
import time
from datetime import datetime, timezone
from typing import Any

import torch
from torch import nn

__all__ = ["collect_environment", "measure_bandwidth", "roofline", "weight_bytes"]


def collect_environment(device: torch.device) -> dict[str, Any]:
    cuda = device.type == "cuda"
    env: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "backend": "cuda" if cuda else "sim",
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if cuda else f"CPU ({_host_cpu()})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "host_cpu": _host_cpu(),
    }
    if not cuda:
        env["note"] = "CPU simulator of CUDA graphs: semantics only, not GPU speed"
    return env


def _host_cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):  # not Linux
        return platform.processor() or platform.machine() or "unknown"


def weight_bytes(model: nn.Module) -> int:
    """Bytes a decode step reads in full: every parameter but the embedding tables (looked up a row at a time)."""
    looked_up = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in looked_up)


def measure_bandwidth(device: torch.device, megabytes: int | None = None, repeats: int = 10) -> float:
    """Bytes per second a device-to-device copy moves (each byte read and written once): the best of
    ``repeats`` copies of a buffer far larger than any cache (1 GiB on a GPU, 256 MiB on a CPU)."""
    cuda = device.type == "cuda"
    size = (megabytes or (1024 if cuda else 256)) * 2**20
    src = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: page faults and lazy allocation are not bandwidth
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - t0
        best = min(best, seconds)
    return 2 * size / best


def roofline(model: nn.Module, bandwidth: float) -> dict[str, Any]:
    """The weights streamed once at the measured bandwidth: a small-batch step cannot be faster."""
    nbytes = weight_bytes(model)
    return {
        "weight_bytes": nbytes,
        "memory_bandwidth_gb_s": round(bandwidth / 1e9, 1),
        "roofline_us": round(nbytes / bandwidth * 1e6, 3),
    }
