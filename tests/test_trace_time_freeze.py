"""The other freeze: a guard in plain Python in a layer's ``forward`` (``python_guards``, as Inkling writes
it) is decided by dynamo when it traces, on the profiling run, which has no metadata."""

import pytest
import torch

from cglab import ModelRunner, ToyConfig, run_repro
from cglab.cli import main
from cglab.compilation.backends import op_name
from cglab.compilation_config import CompilationConfig
from cglab.forward_context import set_forward_context

STATEFUL_OPS = {"cglab::short_conv", "cglab::compressor"}


def _traced_ops(runner: ModelRunner) -> set[str]:
    """Every custom op in the FX graph dynamo traced for the runner's compiled model."""
    backend = runner.compiled_backend
    return {name for item in backend.items for node in item.graph.graph.nodes if (name := op_name(node))}


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("mode", ["piecewise", "full", "full_and_piecewise"])
def test_python_guards_freeze_the_profiling_branch_under_torch_compile(device, mode, legacy, replays):
    """Fixed path or not, every mode that runs the compiled model loses the guarded layers for good."""
    result = run_repro(CompilationConfig(mode, legacy_skip_attn=legacy), ToyConfig(python_guards=True), device=device)
    replayed = "piecewise" if mode == "piecewise" else "full"
    assert result.error is None  # silent, as the bug it mirrors
    assert result.steps_by_mode == {replayed: result.steps} and replays == {replayed: result.steps}
    assert result.max_abs_diff > 0.05  # not rounding: two layers' whole contribution is missing
    stateful = {name: d for name, d in result.state_diffs.items() if "sconv" in name or "compressor" in name}
    assert len(stateful) == 3 and min(stateful.values()) > 0.05  # every state cache of theirs, never written
    assert (
        max(d for name, d in result.state_diffs.items() if name not in stateful) > 0.05
    )  # and attention's, downstream


def test_the_trace_drops_the_guarded_ops(device):
    """Dynamo traced the profiling run: the guarded layers' ops are not in the compiled graph at all."""
    config = ToyConfig(python_guards=True)
    frozen = ModelRunner(config, CompilationConfig("piecewise", (4,)), device=device)
    assert _traced_ops(frozen) == {"cglab::unified_attention"}
    guarded_in_op = ModelRunner(ToyConfig(), CompilationConfig("piecewise", (4,)), device=device)
    assert _traced_ops(guarded_in_op) == {"cglab::unified_attention", *STATEFUL_OPS}


def test_eager_steps_of_the_compiled_model_are_frozen_too(device):
    """A batch above every capture size runs eagerly, but through the compiled model: frozen as well."""
    result = run_repro(
        CompilationConfig("piecewise", (1, 2)), ToyConfig(python_guards=True), batch_sizes=(8,), steps=3, device=device
    )
    assert result.steps_by_mode == {"none": 3}
    assert result.max_abs_diff > 0.05 and result.state_diverged


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("mode", ["piecewise", "full_and_piecewise"])
def test_breakable_graphs_ask_the_python_guard_at_capture(device, mode, legacy, replays):
    """No dynamo: the guard runs at capture, where metadata is present (before the fix too), and every
    layer records its kernels: Inkling's case, which vLLM runs on breakable graphs (vLLM PR #48822)."""
    result = run_repro(
        CompilationConfig(mode, use_breakable_cg=True, legacy_skip_attn=legacy),
        ToyConfig(python_guards=True),
        prefill_chunk=4,
        steps=12,
        device=device,
    )
    assert result.error is None
    assert result.max_abs_diff < result.tolerance and not result.state_diverged
    assert result.steps_by_mode.get("piecewise", 0) > 0 and replays["piecewise"] == result.steps_by_mode["piecewise"]


def test_the_eager_model_asks_the_python_guard_every_step(device):
    """Eagerly the guard is ordinary Python: no metadata skips the layer, metadata runs it."""
    config = ToyConfig(layers="sconv", python_guards=True)
    runner = ModelRunner(config, "none", device=device)
    ids = torch.arange(4, device=runner.device)
    mixer = runner.model.layers[0].mixer
    with set_forward_context(None):
        hidden = torch.randn(4, config.hidden_size, device=runner.device)
        assert torch.equal(mixer(hidden), hidden)  # the profiling branch: the block passes its input through
    runner.add_request("a")
    out = runner.step({"a": ids.tolist()}).logits
    assert runner.state_tensors()["layers.0.sconv.conv_state"].abs().sum() > 0  # the layer ran and stored its input
    assert out.shape == (4, config.vocab_size)


def test_profiling_run_writes_no_cache(device):
    """The profiling run (no metadata) runs before capture and stores nothing in any cache."""
    runner = ModelRunner(ToyConfig(), "full_and_piecewise", device=device)
    assert all(t.abs().sum() == 0 for t in runner.state_tensors().values())


def test_python_guards_and_strict_layers_are_exclusive():
    with pytest.raises(Exception, match="choose one"):
        ToyConfig(strict_layers=True, python_guards=True)


def test_cli_python_guards_check(capsys):
    argv = ["repro", "--python-guards", "--steps", "3", "--batch-sizes", "3,1", "--check"]
    assert main(argv) == 1  # compiled PIECEWISE: the trace froze the profiling branch
    assert "guards in plain Python" in capsys.readouterr().out
    assert main([*argv, "--piecewise-flavor", "breakable"]) == 0
