"""The address-stability guard (vLLM's debug check): a graph keeps reading the storage it saw at
capture, so replacing an input, a cache or a metadata tensor instead of writing into it is caught
before the replay that would silently read stale memory."""

from __future__ import annotations

import pytest
import torch

from cglab import AddressChangedError, ModelRunner, ToyConfig
from cglab.compilation_config import CompilationConfig

CONFIG = ToyConfig(layers=("sconv", "attn", "compressor"), max_num_reqs=2)
SIZES = (1, 2)


def _runner(mode: str, **kwargs) -> ModelRunner:  # type: ignore[no-untyped-def]
    runner = ModelRunner(CONFIG, CompilationConfig(mode, SIZES, **kwargs))
    runner.add_request("a")
    runner.step({"a": [1, 2, 3]}, eager=True)
    return runner


@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_in_place_writes_pass_the_guard(mode: str) -> None:
    runner = _runner(mode)
    assert runner.cudagraph_manager.check_addresses  # on by default in the simulator
    for token in range(5):
        assert runner.step({"a": [token]}).descriptor.cg_mode.value == mode
    assert _total_replays(runner) == 5


def _reset_by_assignment(layer: torch.nn.Module) -> None:
    layer.state_cache = torch.zeros_like(layer.state_cache)  # the mistake: `layer.state_cache.zero_()` is right


REPLACEMENTS = {
    "input_ids (ModelRunner.input_buffers)": lambda r: setattr(
        r.input_buffers, "input_ids", r.input_buffers.input_ids.clone()
    ),
    "layers.1.attn.slot_mapping (returned by AttentionMetadataBuilder.build())": lambda r: setattr(
        r.block_tables, "slot_mapping", r.block_tables.slot_mapping.clone()
    ),
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


def _as_transposed(t: torch.Tensor) -> torch.Tensor:
    """The same storage and first element, laid out column-major: same pointer, other strides."""
    rows, cols = t.shape
    return t.as_strided((rows, cols), (1, rows))


@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_a_same_pointer_view_with_other_strides_is_a_replacement(mode: str) -> None:
    """An address is where the data starts *and* how it is laid out: a graph indexes with the strides
    it saw at capture, so a view that starts at the same byte but strides differently is a new tensor."""
    runner = _runner(mode)
    layer = runner.model.layers[2].mixer
    view = _as_transposed(layer.state_cache)
    assert view.data_ptr() == layer.state_cache.data_ptr() and view.stride() != layer.state_cache.stride()
    layer.state_cache = view
    with pytest.raises(AddressChangedError, match="instead of written in place") as err:
        runner.step({"a": [4]})
    assert "layers.2.compressor.state_cache (a cache of the model)" in str(err.value)


def _total_replays(runner: ModelRunner) -> int:
    return sum(runner.graph_replays().values())


def _eager_reference() -> ModelRunner:
    return _runner("none")


def test_guard_can_be_switched_off() -> None:
    runner, reference = _runner("full", check_addresses=False), _eager_reference()
    REPLACEMENTS["input_ids (ModelRunner.input_buffers)"](runner)
    out = runner.step({"a": [4]})  # no check: the graph silently reads the old input_ids
    assert out.descriptor.cg_mode.value == "full" and _total_replays(runner) == 1
    stale = (out.logits - reference.step({"a": [4]}).logits).abs().max().item()
    assert stale > 0.05  # the step computed another token than the one scheduled


def test_eager_steps_are_not_guarded() -> None:
    runner, reference = _runner("full_decode_only"), _eager_reference()
    REPLACEMENTS["input_ids (ModelRunner.input_buffers)"](runner)
    out = runner.step({"a": [4, 5]})  # a prefill chunk: FULL_DECODE_ONLY runs it eagerly
    assert out.descriptor.cg_mode.value == "none" and _total_replays(runner) == 0
    # An eager step reads the live (replacing) buffer, so it computes exactly what eager computes.
    assert torch.equal(out.logits, reference.step({"a": [4, 5]}).logits)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)")
def test_guard_is_opt_in_on_cuda() -> None:
    assert not ModelRunner(CONFIG, CompilationConfig("full", SIZES), device="cuda").cudagraph_manager.check_addresses
    assert ModelRunner(
        CONFIG, CompilationConfig("full", SIZES, check_addresses=True), device="cuda"
    ).cudagraph_manager.check_addresses
