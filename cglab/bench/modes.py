"""What the benchmark can measure: one row kind per way of running a decode step, the ladder from
eager to compiled FULL, plus the peer a user would pick instead of an engine.

A row's ``mode`` column holds the name. The first three run the uncompiled model (PIECEWISE is the
breakable flavor); the compiled rows run it through torch.compile split at attention (vLLM's default,
inductor on a GPU); ``reduce_overhead`` is the same model under ``torch.compile(mode="reduce-overhead")``:
inductor plus PyTorch's own CUDA graph trees, no engine graphs at all (CUDA only).
"""

from __future__ import annotations

from typing import NamedTuple

from cglab.config import CUDAGraphMode

__all__ = ["BENCH_MODES", "MODE_NAMES", "POLICIES", "BenchMode", "available_modes", "bench_compiler"]


class BenchMode(NamedTuple):
    """One row kind: the mode the engine dispatches the step to (the peer: NONE, torch captures), how
    the model runs ("plain", "compiled" or "reduce-overhead"), a short label and a description."""

    cg_mode: CUDAGraphMode
    flavor: str
    label: str
    description: str


BENCH_MODES = {
    "none": BenchMode(CUDAGraphMode.NONE, "plain", "eager (NONE)", "the plain model, run eagerly"),
    "piecewise": BenchMode(
        CUDAGraphMode.PIECEWISE,
        "plain",
        "PIECEWISE",
        "the plain model, breakable PIECEWISE: graph segments between attention's eager breaks",
    ),
    "full": BenchMode(CUDAGraphMode.FULL, "plain", "FULL", "the plain model, one FULL graph"),
    "compiled_piecewise": BenchMode(
        CUDAGraphMode.PIECEWISE,
        "compiled",
        "compiled PIECEWISE",
        "torch.compile split at attention (inductor on a GPU), one graph per piece",
    ),
    "compiled_full": BenchMode(
        CUDAGraphMode.FULL,
        "compiled",
        "compiled FULL",
        "torch.compile (inductor on a GPU), one FULL graph of the compiled forward",
    ),
    "reduce_overhead": BenchMode(
        CUDAGraphMode.NONE,
        "reduce-overhead",
        'torch.compile "reduce-overhead"',
        'torch.compile(mode="reduce-overhead"): inductor and torch\'s CUDA graph trees; the engine captures nothing',
    ),
}
MODE_NAMES = tuple(BENCH_MODES)
# The policies ``cglab.bench.startup`` compares: here, away from torch, for the parser.
POLICIES = ("piecewise", "full", "full_and_piecewise")


def available_modes(device_type: str) -> tuple[str, ...]:
    """Every row kind this device can measure, in ladder order (CUDA graph trees exist only on a GPU)."""
    return tuple(m for m, kind in BENCH_MODES.items() if device_type == "cuda" or kind.flavor != "reduce-overhead")


def bench_compiler(device_type: str) -> str:
    """How the benchmarks compile: vLLM's inductor on CUDA, whatever ``$CGLAB_COMPILE_BACKEND`` says
    for the lessons, so a compiled row always measures what its description promises."""
    return "inductor" if device_type == "cuda" else "eager"
