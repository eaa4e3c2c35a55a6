"""Capturing graphs and closing the runner gives every byte back: no pool or buffer outlives close().

Runs on the GPU machine (``pytest tests/test_gpu_memory.py -s`` prints the numbers).
"""

from __future__ import annotations

import gc

import pytest
import torch

from cglab import ModelRunner, ToyConfig
from cglab.compilation_config import CompilationConfig

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)"),
]

CYCLES = 20
ALLOCATED_SLACK = 1 << 20  # bytes held by live tensors: anything left per cycle would be far more after 20
RESERVED_SLACK = 8 << 20  # a leaked graph pool keeps at least one 2 MiB segment per cycle
MIB = float(1 << 20)
SIZES = (1, 2, 4, 8)


def _capture_step_close(config: ToyConfig) -> int:
    """Build a runner per mode (capturing every size), replay a step, close it; return the peak allocation."""
    peak = 0
    for mode in ("piecewise", "full"):
        runner = ModelRunner(config, CompilationConfig(mode, SIZES), device="cuda")
        assert runner.graph_replays()
        runner.add_request("a")
        runner.step({"a": [1, 2, 3]}, eager=True)
        assert runner.step({"a": [4]}).descriptor.cg_mode.name == mode.upper()  # a graph replayed
        torch.cuda.synchronize()
        peak = max(peak, torch.cuda.memory_allocated())
        runner.close()
        del runner
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return peak


def test_capturing_and_closing_twenty_times_returns_memory_to_baseline() -> None:
    config = ToyConfig()
    _capture_step_close(config)  # one-time costs first: CUDA context, cuBLAS handles and workspaces
    base_allocated, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    peak = 0
    for _ in range(CYCLES):
        peak = max(peak, _capture_step_close(config))
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    print(
        f"\nGPU memory over {CYCLES} capture/close cycles (MiB): allocated {base_allocated / MIB:.2f} -> "
        f"{allocated / MIB:.2f} (peak while captured {peak / MIB:.2f}), reserved after empty_cache "
        f"{base_reserved / MIB:.2f} -> {reserved / MIB:.2f}"
    )
    assert peak > base_allocated  # the runners did hold memory: the comparison below means something
    assert allocated - base_allocated <= ALLOCATED_SLACK
    assert reserved - base_reserved <= RESERVED_SLACK
