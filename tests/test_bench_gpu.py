"""The benchmark's row kinds on a real GPU: every one runs, the profiler sees the launches each is
built from, and the peer computes what eager does. Speed is reported by the recorded runs, never here."""

from __future__ import annotations

import pytest
import torch

from cglab.bench import BenchConfig, run_bench
from cglab.bench.run import ReduceOverheadForward, _prefill, capture_safe
from cglab.runner import ModelRunner

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)"),
]


@pytest.mark.parametrize("kernels", ["aten", "triton"])
def test_every_row_kind_runs_and_is_counted_by_the_profiler(kernels: str) -> None:
    config = BenchConfig.quick_preset(
        device="cuda", batch_sizes=(1, 4), repeats=10, warmup=5, profile_steps=3, kernels=kernels
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
    # (Eager launches an aten kernel per op; with the toy's Triton kernels it launches far fewer.)
    assert at_1["reduce_overhead"]["launches"] < at_1["none"]["launches"] / (10 if kernels == "aten" else 3)
    assert result.environment["reduce_overhead_cudagraph_skips"] == 0
    assert result.environment["roofline_us"] > 0 and result.environment["memory_bandwidth_gb_s"] > 100


def test_the_peer_computes_what_eager_computes() -> None:
    config = BenchConfig.quick_preset(device="cuda", batch_sizes=(1, 2, 4))
    runner = ModelRunner(config.toy_config(), "none", device="cuda")
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 64, (4, config.prompt_len), generator=gen).tolist()
    _prefill(runner, prompts, runner.config.max_num_batched_tokens)

    def step(batch_size: int) -> torch.Tensor:  # prepare_step does not advance: the same step every time
        prepared = capture_safe(runner, runner.prepare_step({f"req{i}": [i + 1] for i in range(batch_size)}))
        return runner.execute(prepared)[:batch_size]

    expected = {b: step(b).clone() for b in (1, 2, 4)}
    runner.forward_model = ReduceOverheadForward(runner.model)
    for _ in range(3):  # compile, warm up, record, replay
        for b in (1, 2, 4):
            got = step(b)
            torch.testing.assert_close(got, expected[b], rtol=1e-4, atol=1e-4)
