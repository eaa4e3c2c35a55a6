"""The first cell of every notebook, ``DEVICE = setup_notebook()``: pin what the saved outputs rely on."""

from __future__ import annotations

import os

import torch

from cglab import cli
from cglab.bench import run as bench_run
from cglab.compilation import caching
from cglab.compilation_config import COMPILE_BACKEND_ENV
from cglab.errors import ConfigError


def setup_notebook(device: str | None = None) -> str:
    """``"cuda"`` where a GPU is visible, else ``"cpu"`` (the simulator); one CPU thread; on a GPU, eager compiles."""
    if device is not None and device not in ("cpu", "cuda"):
        raise ConfigError(f"setup_notebook takes 'cpu', 'cuda' or nothing (the GPU if one is visible), got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("no CUDA GPU is visible: call setup_notebook() to run on the CPU simulator")
    # Tiny tensors: more threads only compete, and one thread keeps the sums in one order.
    torch.set_num_threads(1)
    caching.install()  # the notebooks build dozens of identical engines: they share one dynamo trace
    cli.LOG_EVERY_S = None  # a command run in a cell prints its result only: saved outputs stay the same
    bench_run.LOG_BAR["delay"] = float("inf")  # likewise a benchmark's progress lines
    chosen = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if chosen == "cuda":
        # The eager compile backend, unless $CGLAB_COMPILE_BACKEND names one: a cold inductor compile costs seconds.
        os.environ.setdefault(COMPILE_BACKEND_ENV, "eager")
    return chosen
