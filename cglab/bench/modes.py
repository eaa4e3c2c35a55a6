"""What the benchmark can measure: one row kind (a row's ``mode``) per way of running a decode step,
the ladder from eager to compiled FULL (compiled rows use inductor on a GPU), and on a GPU the peer a user
would pick instead, ``torch.compile(mode="reduce-overhead")``."""

from __future__ import annotations

from typing import NamedTuple

from cglab.compilation_config import CompilationConfig
from cglab.config import CUDAGraphMode

__all__ = ["BENCH_MODES", "MODE_NAMES", "POLICIES", "BenchMode", "available_modes", "bench_compilation"]


class BenchMode(NamedTuple):
    """One row kind: the engine's mode (the peer: NONE, torch captures) and how the model runs."""

    cg_mode: CUDAGraphMode
    flavor: str
    label: str
    description: str


_NONE, _PIECEWISE, _FULL = CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL
BENCH_MODES = {
    "none": BenchMode(_NONE, "plain", "eager (NONE)", "the plain model, run eagerly"),
    "piecewise": BenchMode(
        _PIECEWISE, "plain", "PIECEWISE", "the plain model, breakable: segments between eager breaks"
    ),
    "full": BenchMode(_FULL, "plain", "FULL", "the plain model, one FULL graph"),
    "compiled_piecewise": BenchMode(_PIECEWISE, "compiled", "compiled PIECEWISE", "torch.compile split at attention"),
    "compiled_full": BenchMode(_FULL, "compiled", "compiled FULL", "torch.compile, one FULL graph of the forward"),
    "reduce_overhead": BenchMode(
        _NONE,
        "reduce-overhead",
        'torch.compile "reduce-overhead"',
        "inductor and torch's CUDA graph trees, no engine graph; linears never fused",
    ),
}
MODE_NAMES = tuple(BENCH_MODES)
# The policies ``cglab.bench.startup`` compares: here, away from torch, for the parser.
POLICIES = ("piecewise", "full", "full_and_piecewise")


def available_modes(device_type: str) -> tuple[str, ...]:
    """Every row kind ``device_type`` can measure, in ladder order (torch's graph trees need CUDA)."""
    return MODE_NAMES if device_type == "cuda" else MODE_NAMES[:-1]


def bench_compilation(
    mode: str | CUDAGraphMode, capture_sizes: tuple[int, ...], device_type: str, breakable: bool, legacy: bool = False
) -> CompilationConfig:
    """How both benchmarks build an engine: compiled by vLLM's inductor on CUDA, whatever
    ``$CGLAB_COMPILE_BACKEND`` says for the lessons; the address check (a debugging aid) off, untimed."""
    return CompilationConfig(
        mode,
        capture_sizes,
        use_breakable_cg=breakable,
        legacy_skip_attn=legacy,
        backend="inductor" if device_type == "cuda" else "eager",
        check_addresses=False,
    )
