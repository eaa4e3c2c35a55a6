"""The replay-latency benchmark: one decode step (``ModelRunner.execute`` on a batch already in the
buffers) per row kind (``cglab.bench.modes``) and batch size, and the start-up cost (``startup``).

Columns: the median with CUDA events on a GPU, the host clock on the CPU simulator (no GPU speed);
``enqueue``, host time until ``execute`` returns; the *kernel floor*, the summed kernel time of a step
under the profiler (its cost if launching were free; on a CPU no floor); *launches*, host submissions
per step (one per eager kernel or graph segment; ``counted_launches`` counts them structurally).
"""

from __future__ import annotations

from cglab._lazy import lazy_exports

# Imported on first use (PEP 562): ``python -m cglab`` reads the row kinds (``cglab.bench.modes``, no
# torch) to build its parser, and must not import torch for it.
_EXPORTS = {
    "cglab.bench.config": ("BenchConfig",),
    "cglab.bench.files": ("CSV_COLUMNS", "BenchResult", "check_output", "load_results", "save_results"),
    "cglab.bench.modes": ("BENCH_MODES", "MODE_NAMES"),
    "cglab.bench.run": ("run_bench",),
}
__all__ = [name for names in _EXPORTS.values() for name in names]

__getattr__, __dir__ = lazy_exports("cglab.bench", _EXPORTS, globals(), __all__)
