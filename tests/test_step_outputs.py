"""What a step hands back must survive the next step, and a guarded layer with no metadata must do
nothing but pass its input through."""

from __future__ import annotations

import pytest
import torch

from cglab import ModelRunner, ToyConfig
from cglab.forward_context import set_forward_context
from cglab.layers.sconv import short_conv


@pytest.mark.parametrize("mode", ["full", "piecewise", "none"])
def test_step_logits_survive_the_next_step(device: str, mode: str) -> None:
    """A graph rewrites its static output at every replay: ``step()`` must return a copy of it."""
    runner = ModelRunner(ToyConfig(layers=("sconv", "attn"), max_num_reqs=2, capture_sizes=(1, 2)), mode,
                         device=device)
    runner.add_request("a")
    runner.step({"a": [1, 2, 3]}, eager=True)
    first = runner.step({"a": [4]})
    kept = first.logits.clone()
    second = runner.step({"a": [5]})  # the same graph (same descriptor) replays again
    assert first.descriptor == second.descriptor and first.descriptor.cg_mode.value == mode
    if runner.cudagraph_manager is not None:
        assert sum(e.replays for e in runner.cudagraph_manager.graphs.values()) == 2
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
