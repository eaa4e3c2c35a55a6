"""The benchmark's row kinds on a real GPU: every one runs, the profiler sees the launches each is built
from, the peer computes what eager does on torch's graphs, and FULL's replays are broken down by kernel.
Speed is reported by the recorded runs, never here."""

from __future__ import annotations

import pytest
import torch

from cglab.bench import BenchConfig, run_bench

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)"),
]


@pytest.mark.parametrize(("kernels", "fused"), [("aten", False), ("triton", False), ("triton", True)])
def test_every_row_kind_runs_and_is_counted_by_the_profiler(kernels: str, fused: bool) -> None:
    config = BenchConfig.quick_preset(
        device="cuda", batch_sizes=(1, 4), repeats=10, warmup=5, profile_steps=3, kernels=kernels, fused_linear=fused
    )
    result = run_bench(config, progress=False)
    assert result.environment["kernels"] == kernels
    # Every row computes eager's logits, with either kernel set (Triton's replayed inside the graphs too).
    assert max(result.environment["max_abs_diff_vs_eager"].values()) < 1e-3
    assert result.modes == ["none", "piecewise", "full", "compiled_piecewise", "compiled_full", "reduce_overhead"]
    at_1 = {r["mode"]: r for r in result.rows if r["batch_size"] == 1}
    assert at_1["full"]["launches"] == at_1["compiled_full"]["launches"] == 1  # one graph launch a step
    assert at_1["compiled_full"]["kernels"] < at_1["full"]["kernels"]  # inductor fused kernels
    # Compiled PIECEWISE launches its pieces and attention's kernels, as breakable PIECEWISE does.
    assert at_1["compiled_piecewise"]["launches"] < at_1["none"]["launches"]
    # The peer replays torch's graph (plus its copies of the inputs into the graph's own buffers).
    assert at_1["reduce_overhead"]["launches"] < at_1["none"]["launches"]
    assert result.environment["reduce_overhead_cudagraph_skips"] == 0
    assert result.environment["roofline_us"] > 0 and result.environment["memory_bandwidth_gb_s"] > 100
    # FULL's and compiled FULL's replays by kernel category: every kernel the profiler saw, matmuls among them.
    for mode in ("full", "compiled_full"):
        found = result.environment["kernel_breakdown"][f"{mode}/1"]
        assert sum(c["nodes"] for c in found["categories"].values()) == at_1[mode]["kernels"]
        assert found["categories"]["linear"]["nodes"] > 0 and 0 <= found["idle_us"] < found["span_us"]
