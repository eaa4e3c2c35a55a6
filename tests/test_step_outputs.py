"""What a step hands back: its real rows, and a copy that survives the next step; and what a guarded layer
with no metadata does: nothing but pass its input through."""

from __future__ import annotations

import pytest
import torch

from cglab import ModelRunner, ToyConfig
from cglab.compilation_config import CompilationConfig
from cglab.forward_context import set_forward_context
from cglab.layers.compressor import Compressor, compressor
from cglab.layers.sconv import short_conv


@pytest.mark.parametrize("mode", ["full", "piecewise", "none"])
def test_step_logits_survive_the_next_step(device: str, mode: str) -> None:
    """A graph rewrites its static output at every replay: ``step()`` must return a copy of it."""
    runner = ModelRunner(
        ToyConfig(layers=("sconv", "attn"), max_num_reqs=2), CompilationConfig(mode, (1, 2)), device=device
    )
    runner.add_request("a")
    runner.step({"a": [1, 2, 3]}, eager=True)
    first = runner.step({"a": [4]})
    kept = first.logits.clone()
    second = runner.step({"a": [5]})  # the same graph (same descriptor) replays again
    assert first.descriptor == second.descriptor and first.descriptor.cg_mode.value == mode
    if runner.cudagraph_manager is not None:
        assert sum(runner.graph_replays().values()) == 2
    assert not torch.equal(second.logits, kept)  # a different token: different logits
    assert torch.equal(first.logits, kept)  # and the first step's result is untouched


def test_sconv_without_metadata_copies_its_input_and_writes_no_state() -> None:
    """The profiling branch (metadata None): output = input, the conv state untouched."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, generator=gen)
    output = torch.full_like(x, float("nan"))
    conv_state = torch.randn(17, 8, generator=gen)
    before = conv_state.clone()
    weight = torch.randn(3, 8, generator=gen)
    with set_forward_context(None):
        short_conv(x, output, conv_state, weight, "layers.0.sconv")
    assert torch.equal(output, x)
    assert torch.equal(conv_state, before)


def test_compressor_without_metadata_outputs_zeros_and_writes_no_state() -> None:
    """The compressor's profiling branch: it saves nothing and sees nothing, so its block adds exactly
    nothing to the residual stream (DeepSeek V4: no metadata -> return)."""
    gen = torch.Generator().manual_seed(0)
    kv = torch.randn(3, 8, generator=gen)
    output = torch.full_like(kv, float("nan"))
    state_cache, compressed_cache = torch.randn(17, 8, generator=gen), torch.randn(5, 8, generator=gen)
    before = state_cache.clone(), compressed_cache.clone()
    with set_forward_context(None):
        compressor(kv, output, state_cache, compressed_cache, torch.randn(4, generator=gen), "layers.0.compressor")
    assert torch.equal(output, torch.zeros_like(kv))
    assert torch.equal(state_cache, before[0]) and torch.equal(compressed_cache, before[1])
    block = Compressor(ToyConfig(layers=("compressor",)), "layers.0.compressor")
    hidden = torch.randn(3, 32, generator=gen)
    with torch.no_grad(), set_forward_context(None):
        assert torch.equal(block(hidden), hidden)


def test_a_padded_graph_step_returns_its_real_rows_only(device: str) -> None:
    """3 tokens replay the graph of 4: the step's logits are the 3 real rows, the eager ones."""
    config = ToyConfig(layers=("sconv", "attn"), max_num_reqs=4)
    runner = ModelRunner(config, CompilationConfig("piecewise", (4,)), device=device)
    reference = ModelRunner(config, "none", device=device)
    for r in (runner, reference):
        for i in range(3):
            r.add_request(f"r{i}")
            r.step({f"r{i}": [1, 2, 3 + i]}, eager=True)
    batch = {f"r{i}": [7 + i] for i in range(3)}
    out, ref = runner.step(batch), reference.step(batch)
    assert str(out.descriptor) == "PIECEWISE(tokens=4, reqs=any)"
    assert out.logits.shape == ref.logits.shape == (3, config.vocab_size)
    assert (out.logits - ref.logits).abs().max().item() < 1e-4
    runner.close()
