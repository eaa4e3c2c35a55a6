"""The address-stability guard (vLLM's debug check): a graph keeps reading the storage it saw at
capture, so replacing an input, a cache or a metadata tensor instead of writing into it is caught
before the replay that would silently read stale memory."""

from __future__ import annotations

import pytest
import torch

from cglab import AddressChangedError, ModelRunner, ToyConfig

CONFIG = ToyConfig(layers=("sconv", "attn", "compressor"), max_num_reqs=2, capture_sizes=(1, 2))


def _runner(mode: str, **kwargs) -> ModelRunner:  # type: ignore[no-untyped-def]
    runner = ModelRunner(CONFIG, mode, **kwargs)
    runner.add_request("a")
    runner.step({"a": [1, 2, 3]}, eager=True)
    return runner


@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_in_place_writes_pass_the_guard(mode: str) -> None:
    runner = _runner(mode)
    assert runner.cudagraph_manager.check_addresses  # on by default in the simulator
    for token in range(5):
        assert runner.step({"a": [token]}).descriptor.cg_mode.value == mode


def _reset_by_assignment(layer: torch.nn.Module) -> None:
    layer.state_cache = torch.zeros_like(layer.state_cache)  # the mistake: `layer.state_cache.zero_()` is right


REPLACEMENTS = {
    "input_ids (ModelRunner.input_buffers)":
        lambda r: setattr(r.input_buffers, "input_ids", r.input_buffers.input_ids.clone()),
    "layers.1.attn.slot_mapping (returned by AttentionMetadataBuilder.build())":
        lambda r: setattr(r.block_tables, "slot_mapping", r.block_tables.slot_mapping.clone()),
    "layers.2.compressor.state_cache (a cache of the model)": lambda r: _reset_by_assignment(r.model.layers[2].mixer),
}


@pytest.mark.parametrize("mode", ["piecewise", "full"])
@pytest.mark.parametrize("replaced", list(REPLACEMENTS))
def test_replacing_a_tensor_the_graph_reads_is_named(mode: str, replaced: str) -> None:
    runner = _runner(mode)
    REPLACEMENTS[replaced](runner)
    with pytest.raises(AddressChangedError, match="instead of written in place") as err:
        runner.step({"a": [4]})
    assert replaced in str(err.value)


def test_guard_can_be_switched_off() -> None:
    runner = _runner("full", check_addresses=False)
    REPLACEMENTS["input_ids (ModelRunner.input_buffers)"](runner)
    runner.step({"a": [4]})  # no check: the graph silently reads the old input_ids


def test_eager_steps_are_not_guarded() -> None:
    runner = _runner("full_decode_only")
    REPLACEMENTS["input_ids (ModelRunner.input_buffers)"](runner)
    runner.step({"a": [4, 5]})  # a prefill chunk: FULL_DECODE_ONLY runs it eagerly


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)")
def test_guard_is_opt_in_on_cuda() -> None:
    assert not ModelRunner(CONFIG, "full", device="cuda").cudagraph_manager.check_addresses
    assert ModelRunner(CONFIG, "full", device="cuda", check_addresses=True).cudagraph_manager.check_addresses
