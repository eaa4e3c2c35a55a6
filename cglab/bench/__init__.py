"""The replay-latency benchmark: one decode step per row kind and batch size, and the start-up cost.

What is timed is ``ModelRunner.execute`` on a batch already written into the persistent buffers:
the graph replay (FULL, PIECEWISE) or the forward (NONE, and the peer, whose graphs are torch's).
The row kinds (``cglab.bench.modes``) climb a ladder: eager, PIECEWISE and FULL of the plain model,
then compiled PIECEWISE and compiled FULL (torch.compile split at attention, inductor on a GPU),
and beside them the peer a user would pick instead, ``torch.compile(mode="reduce-overhead")``.

* On a GPU each step is timed with CUDA events (device time, from the first launch to the last
  kernel) and with the host clock (what a caller waits for, the final synchronisation included).
  On the CPU simulator only the host clock exists, and the numbers say nothing about GPU speed.
* The *kernel floor* is the summed duration of one step's kernels (torch.profiler): what the step
  would cost if launching were free. On the CPU it is the summed self time of the aten ops, measured
  under the profiler, whose tracing slows every op: there it is no floor and may exceed the median.
* The *kernel span* runs from the step's first kernel start to its last kernel end: the floor plus
  the device's idle gaps between kernels. It is measured under the profiler, whose tracing slows
  launches a little, so it can exceed the timed median. ``enqueue_median_us`` is the host time
  until ``execute`` returns: close to the step's latency when the CPU's launching is what the step
  waits for, and an upper bound on a graph's launch latency.
* *Launches* are host submissions of GPU work per step: one per eager kernel, one per graph
  segment. On a GPU they are counted from the profiler (distinct CUDA correlation ids, since all
  kernels of one graph launch share the launch's id); ``counted_launches`` counts the same thing
  structurally, on every backend: graph segments replayed plus work-doing aten ops run outside them.
* The *roofline* (``cglab.bench.roofline``) is the physical limit: the weights read once per step at
  the measured memory bandwidth.
* *Start-up* (``cglab.bench.startup``): compile time, warmup and capture time, capture memory.
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use (PEP 562): ``python -m cglab`` reads the row kinds (``cglab.bench.modes``, no
# torch) to build its parser, and must not import torch for it.
_EXPORTS = {
    "cglab.bench.config": ("LIMIT_NOTE", "BenchConfig"),
    "cglab.bench.files": ("CSV_COLUMNS", "EXTRA_COLUMNS", "FORMAT", "BenchResult", "check_output", "load_results",
                          "result_paths", "save_results"),
    "cglab.bench.modes": ("BENCH_MODES", "MODE_NAMES", "BenchMode"),
    "cglab.bench.run": ("run_bench",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = ["BENCH_MODES", "CSV_COLUMNS", "EXTRA_COLUMNS", "FORMAT", "LIMIT_NOTE", "MODE_NAMES", "BenchConfig",
           "BenchMode", "BenchResult", "check_output", "load_results", "result_paths", "run_bench", "save_results"]


def __getattr__(name: str) -> Any:
    """Import the module that holds ``name`` and keep the name here, so the next access is plain."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'cglab.bench' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
