"""What the benchmark can measure: one row kind per way of running a decode step, the ladder from
eager to compiled FULL, plus the peer a user would pick instead of an engine.

A row's ``mode`` column holds the name. The first three are the rows every recording has had (the
uncompiled model: PIECEWISE is the breakable flavor); the compiled rows run the model through
torch.compile split at attention (vLLM's default, inductor on a GPU); ``reduce_overhead`` is the same
model under ``torch.compile(mode="reduce-overhead")``: inductor plus PyTorch's own CUDA graph trees,
no engine graphs at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from cglab.config import CUDAGraphMode

__all__ = ["BENCH_MODES", "MODE_NAMES", "POLICIES", "BenchMode", "available_modes", "bench_compiler"]


@dataclass(frozen=True)
class BenchMode:
    """One row kind: the runtime mode the engine dispatches the step to, and how the model runs."""

    name: str
    cg_mode: CUDAGraphMode  # what the engine's dispatcher picks (the peer: NONE, torch captures)
    flavor: str  # "plain" (uncompiled; PIECEWISE is breakable), "compiled" (split at attention), "reduce-overhead"
    label: str
    description: str
    cuda_only: bool = False  # CUDA graph trees exist only on a GPU


BENCH_MODES: dict[str, BenchMode] = {
    m.name: m
    for m in (
        BenchMode("none", CUDAGraphMode.NONE, "plain", "eager (NONE)", "the plain model, run eagerly"),
        BenchMode(
            "piecewise",
            CUDAGraphMode.PIECEWISE,
            "plain",
            "PIECEWISE",
            "the plain model, breakable PIECEWISE: graph segments between attention's eager breaks",
        ),
        BenchMode("full", CUDAGraphMode.FULL, "plain", "FULL", "the plain model, one FULL graph"),
        BenchMode(
            "compiled_piecewise",
            CUDAGraphMode.PIECEWISE,
            "compiled",
            "compiled PIECEWISE",
            "torch.compile split at attention (inductor on a GPU), one graph per piece",
        ),
        BenchMode(
            "compiled_full",
            CUDAGraphMode.FULL,
            "compiled",
            "compiled FULL",
            "torch.compile (inductor on a GPU), one FULL graph of the compiled forward",
        ),
        BenchMode(
            "reduce_overhead",
            CUDAGraphMode.NONE,
            "reduce-overhead",
            'torch.compile "reduce-overhead"',
            'torch.compile(mode="reduce-overhead"): inductor and torch\'s CUDA graph trees; the engine '
            "captures nothing",
            cuda_only=True,
        ),
    )
}
MODE_NAMES = tuple(BENCH_MODES)
# The policies the start-up measurement (``cglab.bench.startup``) compares; here, away from torch, for
# the command line to check ``--policies`` before it imports anything heavy.
POLICIES = ("piecewise", "full", "full_and_piecewise")


def available_modes(device_type: str) -> tuple[str, ...]:
    """Every row kind this device can measure, in ladder order."""
    return tuple(m.name for m in BENCH_MODES.values() if device_type == "cuda" or not m.cuda_only)


def bench_compiler(device_type: str) -> str:
    """How the benchmarks compile: vLLM's inductor on CUDA, whatever ``$CGLAB_COMPILE_BACKEND`` says
    for the lessons, so a compiled row always measures what its description promises."""
    return "inductor" if device_type == "cuda" else "eager"
