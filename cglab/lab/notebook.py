"""The first cell of every notebook, ``DEVICE = setup_notebook()``: pin what the saved outputs rely on."""

from __future__ import annotations

import os

import torch

from cglab.compilation_config import COMPILE_BACKEND_ENV
from cglab.errors import ConfigError

__all__ = ["setup_notebook"]


def setup_notebook(device: str | None = None) -> str:
    """``"cuda"`` where a GPU is visible, else ``"cpu"`` (the simulator). One CPU thread (tiny tensors: more
    only compete, and sums keep one order); on a GPU the ``eager`` compile backend unless
    ``$CGLAB_COMPILE_BACKEND`` says otherwise (a cold inductor compile costs seconds per model)."""
    if device is not None and device not in ("cpu", "cuda"):
        raise ConfigError(f"setup_notebook takes 'cpu', 'cuda' or nothing (the GPU if one is visible), got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "setup_notebook('cuda') was asked for but no CUDA GPU is visible; "
            "call setup_notebook() to run on the CPU simulator of CUDA graphs"
        )
    torch.set_num_threads(1)
    chosen = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if chosen == "cuda":
        os.environ.setdefault(COMPILE_BACKEND_ENV, "eager")
    return chosen
