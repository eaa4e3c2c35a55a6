"""Where a replay's time goes: its GPU kernels by category (nodes, microseconds, the bytes the category must
read, the bandwidth that gives) and the idle gaps between kernels inside it, from one profiled step."""

from __future__ import annotations

from typing import Any

from torch import nn

from cglab.bench.profiling import Window

__all__ = ["CATEGORIES", "breakdown", "category", "linear_bytes"]

# category -> name fragments, first match wins: the matmuls (cuBLAS's, CUTLASS's, the toy's fused linear),
# the custom ops' Triton kernels, copies, inductor's fused kernels; every other kernel is "other aten".
CATEGORIES = {
    "linear": ("gemm", "gemv", "cutlass", "nvjet", "sm90_", "cublas", "fused_linear"),
    "attention": ("attention",),
    "short conv": ("short_conv",),
    "compressor": ("compressor",),
    "copy": ("memcpy", "memset", "copy"),
    "inductor fused": ("triton_",),
}


def category(kernel_name: str) -> str:
    name = kernel_name.lower()
    return next((c for c, parts in CATEGORIES.items() if any(p in name for p in parts)), "other aten")


def linear_bytes(model: nn.Module) -> int:
    """Bytes of every ``nn.Linear`` weight: what the linear category streams once per step."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, nn.Linear))


def breakdown(window: Window, weights: int) -> dict[str, Any]:
    """Per category ``nodes``, ``us``, ``bytes``, ``gb_s`` (bytes only for the linears: the rest move activations
    and caches, a few hundred KB); the replay's ``span_us``, and ``idle_us`` (no kernel running) over ``gaps``."""
    kernels = sorted(window.kernels, key=lambda k: k[1])
    table: dict[str, dict[str, Any]] = {}
    idle, last_end = 0.0, kernels[0][1] if kernels else 0.0
    for name, start, end in kernels:
        entry = table.setdefault(category(name), {"nodes": 0, "us": 0.0, "bytes": None, "gb_s": None})
        entry["nodes"], entry["us"] = entry["nodes"] + 1, entry["us"] + end - start
        idle, last_end = idle + max(0.0, start - last_end), max(last_end, end)
    if "linear" in table:
        table["linear"].update(bytes=weights, gb_s=round(weights / table["linear"]["us"] / 1e3, 1))
    table = {c: {**entry, "us": round(entry["us"], 2)} for c, entry in table.items()}
    gaps = max(0, len(kernels) - 1)
    span, mean = round(last_end - (kernels[0][1] if kernels else 0.0), 2), round(idle / max(gaps, 1), 3)
    return {"categories": table, "span_us": span, "idle_us": round(idle, 2), "gaps": gaps, "mean_gap_us": mean}
