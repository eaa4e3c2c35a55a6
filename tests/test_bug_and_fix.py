"""The missing-metadata bug and its fix, end to end, on every backend available."""

import pytest
import torch

from cglab import AddressChangedError, ModelRunner, ToyConfig, run_repro, state_differences
from cglab.compilation_config import CompilationConfig
from cglab.forward_context import set_forward_context
from cglab.graphs.ops import OpCounter
from cglab.kernels import use_kernels
from cglab.layers.sconv import short_conv
from cglab.metadata import AllocatingShortConvMetadataBuilder

PATTERNS = ["sconv,attn,compressor,attn", "attn", "sconv", "compressor,compressor", "attn,sconv,attn"]
MIXED_BATCHES = (3, 1, 8, 5, 2, 7)


FLAVORS = ["compiled", "breakable"]


# Mode "none" is not here: its runner and its reference are both eager, so the comparison would be
# eager against eager (that determinism check is test_determinism.py's eager test).
@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("mode", ["piecewise", "full", "full_and_piecewise", "full_decode_only"])
@pytest.mark.parametrize("layers", PATTERNS)
def test_fixed_path_replay_equals_eager(device, mode, layers, flavor, replays):
    steps = 14
    result = run_repro(
        CompilationConfig(mode, use_breakable_cg=flavor == "breakable"),
        ToyConfig(layers=layers),
        batch_sizes=MIXED_BATCHES,
        steps=steps,
        device=device,
    )
    assert result.error is None
    assert result.max_abs_diff < result.tolerance, result.step_diffs
    assert not result.state_diverged, result.state_diffs
    expected = "piecewise" if mode == "piecewise" else "full"  # decode steps: FULL where captured
    assert result.steps_by_mode == {expected: steps}  # graphs served every step, not eager
    assert replays == {expected: steps}  # and each of those steps really replayed its graph


@pytest.mark.parametrize("layers", ["sconv,attn,compressor,attn", "sconv", "compressor"])
def test_legacy_compiled_piecewise_diverges_silently(device, layers, replays):
    result = run_repro(CompilationConfig("piecewise", legacy_skip_attn=True), ToyConfig(layers=layers), device=device)
    assert result.steps_by_mode == {"piecewise": result.steps} and replays == {"piecewise": result.steps}
    assert result.piecewise_flavor == "compiled"  # vLLM's default, and where the bug lived
    assert result.error is None  # no error anywhere: that is the bug
    assert result.max_abs_diff > 0.05  # not rounding: the layers' whole contribution is missing
    assert result.state_diverged
    assert max(result.state_diffs.values()) > 0.05


@pytest.mark.parametrize("layers", ["sconv,attn,compressor,attn", "sconv", "compressor"])
def test_legacy_breakable_piecewise_was_already_safe(device, layers, replays):
    """Before the fix, breakable capture got capture metadata (the assert tied the two together)."""
    result = run_repro(
        CompilationConfig("piecewise", use_breakable_cg=True, legacy_skip_attn=True),
        ToyConfig(layers=layers, strict_layers=True),
        device=device,
    )
    assert result.error is None and not result.diverged
    assert result.steps_by_mode == {"piecewise": result.steps} and replays == {"piecewise": result.steps}


def test_legacy_graph_never_writes_guarded_state(device):
    """After eager prefill, legacy compiled PIECEWISE decode steps write attention's KV cache but
    never the sconv or compressor state: the pieces replay the profiling branch."""
    config = ToyConfig(max_num_reqs=4)
    runner = ModelRunner(config, CompilationConfig("piecewise", legacy_skip_attn=True), device=device)
    for i in range(4):
        runner.add_request(f"r{i}")
        runner.step({f"r{i}": list(range(3, 9 + i))}, eager=True)
    after_prefill = {k: v.clone() for k, v in runner.state_tensors().items()}
    for step in range(8):
        out = runner.step({f"r{i}": [step + i] for i in range(1 + step % 4)})
        assert out.descriptor.cg_mode.name == "PIECEWISE"
    assert sum(runner.graph_replays().values()) == 8
    changed = {k: not v.equal(after_prefill[k]) for k, v in runner.state_tensors().items()}
    assert changed == {
        "layers.0.sconv.conv_state": False,
        "layers.1.attn.kv_cache": True,
        "layers.2.compressor.state_cache": False,
        "layers.2.compressor.compressed_cache": False,
        "layers.3.attn.kv_cache": True,
    }


def test_legacy_compiled_piecewise_with_strict_layers_fails_loudly(device):
    result = run_repro(
        CompilationConfig("piecewise", legacy_skip_attn=True), ToyConfig(strict_layers=True), device=device
    )
    assert result.error is not None and result.error.startswith("MissingMetadataError")
    assert "prepare_inputs_to_capture" in result.error


def test_strict_layers_capture_fine_with_the_fix(device, replays):
    result = run_repro("piecewise", ToyConfig(strict_layers=True), device=device)
    assert result.error is None and not result.diverged
    assert result.steps_by_mode == {"piecewise": result.steps} and replays == {"piecewise": result.steps}


def test_legacy_path_is_harmless_for_attention_only(device, replays):
    result = run_repro(
        CompilationConfig("piecewise", legacy_skip_attn=True), ToyConfig(layers="attn,attn"), device=device
    )
    assert result.error is None and not result.diverged
    assert result.steps_by_mode == {"piecewise": result.steps} and replays == {"piecewise": result.steps}


def test_legacy_switch_leaves_full_untouched(device, replays):
    result = run_repro(CompilationConfig("full", legacy_skip_attn=True), device=device)
    assert result.error is None and not result.diverged
    assert result.steps_by_mode == {"full": result.steps} and replays == {"full": result.steps}


def test_fragile_assumption_allocating_builder_breaks_fixed_piecewise(device):
    """With the address guard off (the default on CUDA), the breakage is silent."""
    config = ToyConfig(layers=("sconv", "attn"), max_num_reqs=4, max_model_len=32, num_blocks=32)
    reference = ModelRunner(config, "none", device=device)
    runner = ModelRunner(
        config,
        CompilationConfig("piecewise", check_addresses=False),
        device=device,
        builders={"sconv": AllocatingShortConvMetadataBuilder(config, reference.device)},
    )
    for i in range(4):
        for r in (runner, reference):
            r.add_request(f"r{i}")
            r.step({f"r{i}": [1, 2, 3, 4, 5 + i]}, eager=True)
    worst = 0.0
    for step in range(6):
        batch = {f"r{i}": [(step + i) % config.vocab_size] for i in range(1 + step % 4)}
        worst = max(worst, (runner.step(batch).logits - reference.step(batch).logits).abs().max().item())
    assert sum(runner.graph_replays().values()) == 6  # every decode step replayed
    assert worst > 0.05  # the graph reads the capture batch's tap slots, not the live ones
    # Writes use the slot mapping, which is a persistent buffer: the state stays right, the reads do not.
    assert state_differences(runner, reference)["layers.0.sconv.conv_state"] < 1e-4
    runner.close()


def test_address_guard_catches_the_allocating_builder(device):
    """On by default in the simulator (opt-in on CUDA): the first replay names the replaced tensor."""
    config = ToyConfig(layers=("sconv", "attn"), max_num_reqs=4, max_model_len=32, num_blocks=32)
    runner = ModelRunner(
        config,
        CompilationConfig("piecewise", check_addresses=None if device == "cpu" else True),
        device=device,
        builders={"sconv": AllocatingShortConvMetadataBuilder(config, device)},
    )
    runner.add_request("r0")
    runner.step({"r0": [1, 2, 3]}, eager=True)  # eager steps read live tensors: nothing to guard
    with pytest.raises(AddressChangedError) as err:
        runner.step({"r0": [4]})
    message = str(err.value)
    assert message.startswith("layers.0.sconv.tap_slots (returned by AllocatingShortConvMetadataBuilder.build())")
    assert "instead of written in place" in message and "PIECEWISE(tokens=1, reqs=any)" in message
    runner.close()


def test_legacy_guarded_graph_records_nothing_for_the_layer(device):
    # Counted with the aten bodies: the op's Triton kernel is one launch, as the guarded copy is, so on
    # CUDA the counts could not tell the sconv's work from its absence (the replay tests run Triton).
    with use_kernels("aten"):
        config = ToyConfig(layers=("sconv",))
        fixed = ModelRunner(config, CompilationConfig("piecewise", (2,)), device=device)
        legacy = ModelRunner(config, CompilationConfig("piecewise", (2,), legacy_skip_attn=True), device=device)
        desc = next(iter(fixed.graph_replays()))
        (f,), (g,) = fixed.captured_graphs(desc), legacy.captured_graphs(desc)
        # The sconv op's own kernels on the captured batch shape: with live metadata, and with none.
        for r in ("a", "b"):
            fixed.add_request(r)
        metadata = fixed.prepare_step({"a": [1], "b": [2]}).attn_metadata
        layer = fixed.model.layers[0].mixer
        x = torch.randn(2, config.hidden_size, device=fixed.device)

        def sconv_ops(md):
            out, state = torch.empty_like(x), layer.conv_state.clone()
            with set_forward_context(md), OpCounter() as counter:
                short_conv(x, out, state, layer.conv_weight, layer.layer_name)
            return counter.count

        working, skipped = sconv_ops(metadata), sconv_ops(None)
        assert skipped == 1 < working  # no metadata: only the copy of the input
        assert (f.num_segments, g.num_segments) == (1, 1)
        # Exactly the sconv's work is missing from the legacy graph: the rest of the layer is recorded.
        assert f.num_ops - g.num_ops == working - skipped


class RandomCachesRunner(ModelRunner):
    """Fills every cache with random values after the profiling run, just before capture, and keeps a
    copy: caches of zeros would hide a dummy write of zeros, or of a value that happens to be zero."""

    def profile_run(self):
        super().profile_run()
        gen = torch.Generator().manual_seed(0)
        for tensor in self.state_tensors().values():
            tensor.copy_(torch.randn(tensor.shape, generator=gen))
        self.before_capture = {name: t.clone() for name, t in self.state_tensors().items()}


@pytest.mark.parametrize(
    ("mode", "flavor"),
    [("full", "compiled"), ("piecewise", "compiled"), ("piecewise", "breakable"), ("full", "breakable")],
)
@pytest.mark.parametrize("layers", ["compressor,attn", "sconv,attn,compressor,attn"])
def test_capture_does_not_touch_caches(device, mode, flavor, layers):
    """Warmups and captures run the model on dummy batches whose slots are all PAD_SLOT_ID. With one
    request at most, the dummy batches of 4 and 8 tokens are one request each, whose 4th and 8th
    tokens complete compressor groups: still no cache row may change, not even by a bit."""
    config = ToyConfig(layers=layers, max_num_reqs=1)
    runner = RandomCachesRunner(
        config, CompilationConfig(mode, (4, 8), use_breakable_cg=flavor == "breakable"), device=device
    )
    assert len(runner.graph_replays()) == 2
    for name, tensor in runner.state_tensors().items():
        assert torch.equal(tensor, runner.before_capture[name]), name
    runner.close()
