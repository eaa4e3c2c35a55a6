"""The first cell of every notebook: pin what the saved outputs rely on, and pick the device.

``DEVICE = setup_notebook()`` is the whole of it. The notebooks are committed executed and nbval
compares their outputs on whatever machine runs them, so nothing they print may depend on that
machine's core count; and on a GPU box every notebook must run in about a minute.
"""

from __future__ import annotations

import os

import torch

from cglab.compilation.backends import COMPILE_BACKEND_ENV
from cglab.errors import ConfigError

__all__ = ["setup_notebook"]


def setup_notebook(device: str | None = None) -> str:
    """The device the notebook runs on: ``"cuda"`` where a GPU is visible (real CUDA graphs), else
    ``"cpu"`` (the simulator). ``device="cpu"`` keeps a GPU box on the simulator.

    - One CPU thread. The toy's tensors are tiny, so more threads only compete: nbval runs notebooks
      side by side, one kernel each, and on 2 cores the suite took 7 minutes with torch's default
      thread count against 1 min 45 s with one. One thread also adds every sum in the same order on
      any machine.
    - On a GPU, compiled pieces are compiled with the ``eager`` backend (the FX code dynamo traced,
      run as it is, as on the CPU) unless ``$CGLAB_COMPILE_BACKEND`` already says otherwise. The
      lessons are about what a graph records, which inductor does not change, and a cold inductor
      compile costs seconds for every model a notebook builds (about 4 s per repro case on an H200).
      Notebook 05 and ``python -m cglab bench`` always compile with inductor: they measure speed.
    """
    if device is not None and device not in ("cpu", "cuda"):
        raise ConfigError(f"setup_notebook takes 'cpu', 'cuda' or nothing (the GPU if one is visible), "
                          f"got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("setup_notebook('cuda') was asked for but no CUDA GPU is visible; "
                          "call setup_notebook() to run on the CPU simulator of CUDA graphs")
    torch.set_num_threads(1)
    chosen = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if chosen == "cuda":
        os.environ.setdefault(COMPILE_BACKEND_ENV, "eager")
    return chosen
