"""The physical limit of a decode step: every weight read once from memory, at the memory's bandwidth.

A decode step at small batch multiplies each weight matrix by a handful of token vectors, so it
cannot be faster than the time to stream the weights through the memory system once: the
*roofline* time, ``weight_bytes / bandwidth``. It does not depend on the batch size until the
arithmetic catches up. The bandwidth is measured here (a large device-to-device copy), not taken
from a data sheet: what a copy reaches is what a kernel can hope for.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

__all__ = ["measure_bandwidth", "roofline", "weight_bytes"]

# Embedding tables are looked up, one row per token, never read whole: they are not streamed.
_LOOKUP_TABLES = (nn.Embedding,)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the weights one decode step reads in full: every parameter but the embedding tables."""
    looked_up = {id(p) for m in model.modules() if isinstance(m, _LOOKUP_TABLES) for p in m.parameters()}
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
    """The limit as the results record it: the bytes, the bandwidth and the time they imply."""
    nbytes = weight_bytes(model)
    return {
        "weight_bytes": nbytes,
        "memory_bandwidth_gb_s": round(bandwidth / 1e9, 1),
        "roofline_us": round(nbytes / bandwidth * 1e6, 3),
        "roofline": "weights (all parameters but embedding tables) read once per step at the bandwidth of a "
        "large device-to-device copy (best of 10)",
    }
