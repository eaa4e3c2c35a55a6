"""CUDA graph capture for cglab: one driver, two backends.

``get_backend("sim")`` is a faithful CPU simulator (semantics, not speed); ``get_backend("cuda")``
uses real ``torch.cuda.CUDAGraph``. Both capture FULL graphs (one segment) or, with
``breakable=True``, PIECEWISE graphs split at ``eager_break_during_capture`` functions.
Importing this package never touches ``torch.cuda``, so it works on CPU-only builds.
"""

from __future__ import annotations

import torch

from cglab.errors import ConfigError
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

_NAMES = ("auto", "sim", "cuda")


def get_backend(name: str = "auto", device: str | torch.device | None = None) -> GraphBackend:
    """Make a graph backend.

    ``"auto"`` picks ``"cuda"`` when a GPU is visible (and ``device`` is not a non-CUDA device),
    else ``"sim"``. ``"sim"`` works on any device (CPU by default). ``"cuda"`` without a GPU
    raises ConfigError pointing at ``"sim"``, rather than failing later inside torch.
    """
    if name == "auto":
        wants_cuda = device is None or torch.device(device).type == "cuda"
        name = "cuda" if wants_cuda and torch.cuda.is_available() else "sim"
    if name == "sim":
        return SimBackend(device)
    if name == "cuda":
        return CudaBackend(device)
    raise ConfigError(f"unknown graph backend {name!r}; valid names: {', '.join(map(repr, _NAMES))}")
