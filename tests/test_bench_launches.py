"""The benchmark's launch count: what a step costs the host in launches, counted structurally.

A FULL step is one launch. A PIECEWISE step launches each graph segment once and every kernel of
the eager attention between them one by one: those eager launches are what PIECEWISE pays for its
live metadata, and what notebook 05 plots.
"""

from __future__ import annotations

import pytest
import torch

from cglab import ModelRunner, ToyConfig
from cglab.bench.run import count_launches
from cglab.compilation_config import CompilationConfig
from cglab.forward_context import set_forward_context
from cglab.graphs.ops import OpCounter
from cglab.layers.attention import unified_attention

CONFIG = ToyConfig(layers=("sconv", "attn"), max_num_reqs=2)
# On the simulator, one decode step of two requests: 67 kernels in all, 32 of them attention's
# (its KV write, the key range, the scores and the softmax, counted by OpCounter), in 2 segments
# around 1 eager break.
KERNELS, ATTENTION_KERNELS = 67, 32


def _decode_step(mode: str, flavor: str):  # type: ignore[no-untyped-def]
    runner = ModelRunner(
        CONFIG, CompilationConfig(mode, (1, 2), use_breakable_cg=flavor == "breakable", check_addresses=False)
    )
    for i in range(2):
        runner.add_request(f"r{i}")
        runner.step({f"r{i}": [1, 2, 3]}, eager=True)
    return runner, runner.prepare_step({"r0": [4], "r1": [5]})


def test_attention_runs_this_many_kernels_eagerly() -> None:
    """The count the PIECEWISE expectations below are made of, taken from attention alone."""
    runner, prepared = _decode_step("none", "breakable")
    layer = runner.model.layers[1].mixer
    q, k, v = (torch.randn(2, CONFIG.num_heads, CONFIG.head_dim) for _ in range(3))
    out, kv_cache = torch.empty_like(q), layer.kv_cache.clone()
    with torch.inference_mode(), set_forward_context(prepared.attn_metadata), OpCounter() as counter:
        unified_attention(q, k, v, out, kv_cache, layer.layer_name, layer.max_model_len)
    assert counter.count == ATTENTION_KERNELS


@pytest.mark.parametrize(
    ("mode", "flavor", "expected"),
    [
        ("none", "breakable", (KERNELS, KERNELS, 0, 0)),  # eager: a launch per kernel
        ("full", "breakable", (1, KERNELS, 1, 0)),  # one graph
        ("piecewise", "breakable", (2 + ATTENTION_KERNELS, KERNELS, 2, 1)),  # 2 segments + attention, eagerly
        ("piecewise", "compiled", (2 + ATTENTION_KERNELS, KERNELS, 2, 1)),  # 2 pieces + the splitting op
    ],
)
def test_launches_are_segments_plus_eager_kernels(mode: str, flavor: str, expected: tuple[int, ...]) -> None:
    """(launches, kernels, graph segments, eager breaks): every mode runs the same kernels."""
    runner, prepared = _decode_step(mode, flavor)
    assert prepared.descriptor.cg_mode.value == mode
    assert count_launches(runner, prepared) == expected
    runner.close()
