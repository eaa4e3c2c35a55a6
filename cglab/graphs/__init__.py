"""CUDA graph capture: one driver, two backends, ``"sim"`` (a CPU simulator: semantics, not speed) and
``"cuda"`` (``torch.cuda.CUDAGraph``). Importing it never touches ``torch.cuda``."""

from __future__ import annotations

import torch

from cglab.graphs.capture_driver import (
    CapturedGraph,
    EagerStep,
    GraphBackend,
    GraphSegment,
    eager_break_during_capture,
    is_capturing,
)
from cglab.graphs.cuda import CudaBackend
from cglab.graphs.sim import SIMULATOR_LABEL, SimBackend

__all__ = [
    "SIMULATOR_LABEL",
    "CapturedGraph",
    "CudaBackend",
    "EagerStep",
    "GraphBackend",
    "GraphSegment",
    "SimBackend",
    "eager_break_during_capture",
    "get_backend",
    "is_capturing",
]


def get_backend(name: str, device: str | torch.device | None = None) -> GraphBackend:
    """The graph backend ``"sim"`` (the CPU simulator) or ``"cuda"`` (real CUDA graphs)."""
    return {"sim": SimBackend, "cuda": CudaBackend}[name](device)
