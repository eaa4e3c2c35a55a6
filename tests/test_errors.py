"""Every public entry point answers a mistake with one clear error that names the fix.

Python API: a ``ConfigError`` (a ``ValueError``) or a ``CaptureError``, never a torch traceback.
The command line's errors: tests/test_cli.py.
"""

from __future__ import annotations

import pytest
import torch

import cglab.layers.sconv
from cglab import (
    BatchExecutionDescriptor,
    CapacityError,
    CaptureError,
    ConfigError,
    CUDAGraphMode,
    MissingMetadataError,
    ModelRunner,
    ToyConfig,
)
from cglab.compilation_config import CompilationConfig, SpeculativeConfig

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


def _message(call, error: type[Exception] = ConfigError) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, (ValueError, CaptureError))
    return str(info.value)


# -- the boundaries: each bad input is refused where it enters, in one line that names the fix ------------

TOY_CONFIG_CASES = {
    "unknown layer kind": (dict(layers="sconv,atn"), "valid kinds: attn, sconv, compressor"),
    "empty layer pattern": (dict(layers=" , "), "empty"),
    "empty item in the layer pattern": (dict(layers="sconv,,attn"), "'sconv,,attn' has an empty item"),
    "empty item in a list of kinds": (dict(layers=["sconv", " ", "attn"]), "has an empty item"),
    "layer pattern of the wrong type": (dict(layers=5), "'sconv,attn'"),
    "zero size": (dict(hidden_size=0), "hidden_size must be a positive integer"),
    "float size": (dict(num_blocks=2.5), "num_blocks must be a positive integer"),
    "bool size": (dict(max_num_reqs=True), "max_num_reqs must be a positive integer"),
    "heads do not divide": (dict(hidden_size=30, num_heads=4), "divisible by num_heads"),
    "block straddles a group": (dict(block_size=6, compress_ratio=4), "multiple of compress_ratio"),
    "negative seed": (dict(seed=-1), "seed must be an integer from 0"),
    "huge seed": (dict(seed=2**40), "seed must be an integer from 0"),
    "strict_layers not a bool": (dict(strict_layers="yes"), "True or False"),
    "strict and python guards": (dict(strict_layers=True, python_guards=True), "choose one"),
    "unknown dtype": (dict(dtype="fp8"), "float32"),
}


@pytest.mark.parametrize("case", list(TOY_CONFIG_CASES))
def test_bad_toy_config(case: str) -> None:
    kwargs, fix = TOY_CONFIG_CASES[case]
    assert fix in _message(lambda: ToyConfig(**kwargs))


COMPILATION_CONFIG_CASES = {
    "unknown mode": (dict(cudagraph_mode="fulll"), "none, piecewise, full"),
    "mode None": (dict(cudagraph_mode=None), "none, piecewise, full"),
    "mode a number": (dict(cudagraph_mode=3), "none, piecewise, full"),
    "duplicate capture sizes": (dict(cudagraph_capture_sizes=(1, 2, 2)), "drop the duplicates"),
    "non-positive capture size": (dict(cudagraph_capture_sizes=(0, 1)), "every capture size must be a positive"),
    "capture sizes not a list": (dict(cudagraph_capture_sizes=8), "(1, 2, 4, 8)"),
    "flag not a bool": (dict(legacy_skip_attn="no"), "True or False"),
    "check_addresses not a bool": (dict(check_addresses="yes"), "True, False or None"),
    "unknown compile backend": (dict(backend="tvm"), "'eager', 'inductor'"),
    "unknown graph backend": (dict(graph_backend="tpu"), "'sim'"),
    "splitting ops for breakable": (dict(splitting_ops=["cglab::short_conv"], use_breakable_cg=True), "breakable"),
    "splitting ops not a list": (dict(splitting_ops=5), "list of op names"),
    "no splitting op": (dict(splitting_ops=" , "), "for one graph over the whole forward use mode 'full'"),
    "empty splitting op": (dict(splitting_ops="cglab::short_conv,,"), "has an empty item"),
    "unknown splitting op": (dict(splitting_ops=["cglab::attn"]), "valid ops: cglab::unified_attention"),
}


@pytest.mark.parametrize("case", list(COMPILATION_CONFIG_CASES))
def test_bad_compilation_config(case: str) -> None:
    kwargs, fix = COMPILATION_CONFIG_CASES[case]
    assert fix in _message(lambda: CompilationConfig(**kwargs))


SPECULATIVE_CONFIG_CASES = {
    "no draft token": (dict(num_speculative_tokens=0), "nothing to draft; use a plain ModelRunner"),
    "negative": (dict(num_speculative_tokens=-1), "an integer of at least 0"),
    "not an int": (dict(num_speculative_tokens="2"), "an integer of at least 0"),
    "draft layers the drafter cannot build": (
        dict(num_speculative_tokens=2, draft_layers=(("mine.0", "attn"),)),
        "draft_layers must be the drafter's (name, kind) pairs as draft_layer_pairs('attn') gives them",
    ),
    "draft layer of an unknown kind": (
        dict(num_speculative_tokens=2, draft_layers=(("draft.layers.0.sconv", "sconv"), ("draft.layers.1.x", "x"))),
        "kinds from attn, sconv, compressor, linear_attn",
    ),
    "draft layers not pairs": (dict(num_speculative_tokens=2, draft_layers=5), "got 5"),
}


@pytest.mark.parametrize("case", list(SPECULATIVE_CONFIG_CASES))
def test_bad_speculative_config(case: str) -> None:
    kwargs, fix = SPECULATIVE_CONFIG_CASES[case]
    assert fix in _message(lambda: SpeculativeConfig(**kwargs))


# What only the model can tell: checked when a runner resolves its CompilationConfig for its ToyConfig.
RUNNER_CASES = {
    "unknown device": (dict(device="tpu"), "use 'cpu' or 'cuda'"),
    "device of the wrong type": (dict(device=3.5), "use 'cpu' or 'cuda'"),
    "capture size above the token budget": (
        dict(compilation_config=CompilationConfig("full", (256,))),
        "capture size 256: is above the 128 tokens a step may hold (max_num_batched_tokens); the largest capture "
        "size that fits is 128",
    ),
    "capture batch longer than a request": (
        dict(config=ToyConfig(max_num_reqs=1), compilation_config=CompilationConfig("full", (64,))),
        "capture size 64: puts 64 tokens in one request of its capture batch (of at most 1), above the 48 a request "
        "may hold (max_model_len); the largest capture size that fits is 48",
    ),
    "splitting op not in the model": (
        dict(compilation_config=CompilationConfig("piecewise", splitting_ops=["cglab::linear_attention"])),
        "are not in this model",
    ),
    "builder without build()": (dict(builders={"sconv": object()}), "builders['sconv']"),
    "builder for an unknown kind": (dict(builders={"conv": None}), "valid kinds"),
    "progress not a function": (
        dict(compilation_config=CompilationConfig("full", (1, 2)), progress="x"),
        "progress must be a function called with each descriptor captured, got 'x'",
    ),
    "more blocks than memory": (dict(config=ToyConfig(num_blocks=10**15)), "the largest num_blocks that fits is"),
}


@pytest.mark.parametrize("case", list(RUNNER_CASES))
def test_bad_runner_arguments(case: str) -> None:
    kwargs, fix = RUNNER_CASES[case]
    assert fix in _message(lambda: ModelRunner(**{"config": ToyConfig(), **kwargs}))


def test_an_eager_runner_never_checks_the_capture_sizes() -> None:
    """A token budget below the default sizes (1, 2, 4, 8) is fine for an eager runner, which captures
    nothing; a runner that captures refuses it, naming the size and the fix."""
    small = ToyConfig(layers="sconv,attn", max_num_reqs=2, max_num_batched_tokens=4)
    eager = ModelRunner(small, "none")
    eager.add_request("a")
    assert eager.step({"a": [1, 2, 3]}).descriptor.cg_mode is CUDAGraphMode.NONE
    assert _message(lambda: ModelRunner(small, "full")) == (
        "capture size 8: is above the 4 tokens a step may hold (max_num_batched_tokens); the largest capture size "
        "that fits is 4"
    )


# -- ModelRunner ----------------------------------------------------------------------------------

CONFIG = ToyConfig(layers=("sconv", "attn"), hidden_size=16, max_num_reqs=2, max_model_len=8, num_blocks=4)
SIZES = (1, 2)


def _runner_with_one_request() -> ModelRunner:
    r = ModelRunner(CONFIG, CompilationConfig("full", SIZES))
    r.add_request("a")
    return r


@pytest.fixture
def runner() -> ModelRunner:
    return _runner_with_one_request()


@NO_GPU
def test_cuda_without_gpu_points_to_the_simulator() -> None:
    assert "use device 'cpu' (--device cpu) to run the CPU simulator" in _message(
        lambda: ModelRunner(CONFIG, device="cuda")
    )


STEP_CASES = {
    "not a dict": ([("a", [1])], "takes a dict"),
    "nothing scheduled": ({}, "schedules no request"),
    "unknown request": ({"b": [1]}, "call add_request('b') first"),
    "no tokens": ({"a": []}, "give at least one"),
    "bare int": ({"a": 5}, "{'a': [5]}"),
    "string": ({"a": "12"}, "list of integer token ids"),
    "float token": ({"a": [1.5]}, "list of integer token ids"),
    "bool token": ({"a": [True]}, "list of integer token ids"),
    "float tensor": ({"a": torch.tensor([1.0])}, "list of integer token ids"),
    "0-d tensor": ({"a": torch.tensor(5)}, "{'a': [5]}"),
    "token outside the vocabulary": ({"a": [64]}, "outside the vocabulary [0, 64)"),
}


@pytest.fixture(scope="module")
def refusing_runner() -> ModelRunner:
    """One runner for every refused step (a compiled runner per case would cost a trace each): each case
    also checks that the refusal left it as it was."""
    return _runner_with_one_request()


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_bad_step_arguments(refusing_runner: ModelRunner, case: str) -> None:
    scheduled, fix = STEP_CASES[case]
    assert fix in _message(lambda: refusing_runner.step(scheduled))
    assert list(refusing_runner.requests) == ["a"] and refusing_runner.requests["a"].num_computed_tokens == 0


def test_integer_tensors_and_numpy_style_ints_are_token_ids(runner: ModelRunner) -> None:
    assert runner.step({"a": torch.tensor([1, 2])}).logits.shape == (2, CONFIG.vocab_size)


def test_batch_above_max_num_reqs(runner: ModelRunner) -> None:
    for r in ("b", "c"):
        runner.add_request(r)
    assert "raise ToyConfig.max_num_reqs" in _message(lambda: runner.step({r: [1] for r in "abc"}))


def test_capacity_errors_name_the_limit(runner: ModelRunner) -> None:
    fix = _message(lambda: runner.step({"a": list(range(9))}), CapacityError)
    assert "raise ToyConfig.max_model_len" in fix
    runner.add_request("b")
    runner.step({"a": list(range(8))})  # two blocks each: the four blocks run out at the next request
    runner.step({"b": list(range(8))})
    runner.add_request("c")
    fix = _message(lambda: runner.step({"c": [1]}), CapacityError)
    assert "the paged caches are full" in fix and "raise ToyConfig.num_blocks" in fix


def test_too_many_tokens_in_one_step() -> None:
    r = ModelRunner(ToyConfig(max_num_batched_tokens=8))
    r.add_request("a")
    assert "raise ToyConfig.max_num_batched_tokens" in _message(lambda: r.step({"a": [1] * 9}), CapacityError)


# -- capture failures explain themselves ---------------------------------------------------------


def test_host_sync_during_capture_names_the_graph_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    forward = cglab.layers.sconv.ShortConv.forward

    def syncing_forward(self, hidden):  # type: ignore[no-untyped-def]
        if hidden.sum().item() > 1e30:  # a host sync: fine eagerly, illegal in a graph
            return hidden
        return forward(self, hidden)

    monkeypatch.setattr(cglab.layers.sconv.ShortConv, "forward", syncing_forward)
    fix = _message(
        lambda: ModelRunner(CONFIG, CompilationConfig("piecewise", SIZES, use_breakable_cg=True)), CaptureError
    )
    assert fix.startswith("capturing the PIECEWISE(tokens=2, reqs=any) graph failed: host sync during graph capture")
    assert "use torch.where" in fix
    # Compiled, the same line cannot even be traced: dynamo refuses it in the profiling run, where it
    # traces the model, before any graph is captured.
    fix = _message(lambda: ModelRunner(CONFIG, CompilationConfig("piecewise", SIZES)), CaptureError)
    assert fix.startswith(
        "the profiling run before capture (where torch.compile traces) failed: torch.compile could not"
    )
    assert "piecewise_flavor='breakable'" in fix


def test_missing_metadata_in_a_strict_layer_names_the_fix() -> None:
    config = ToyConfig(layers=("sconv", "attn"), strict_layers=True)
    fix = _message(
        lambda: ModelRunner(config, CompilationConfig("piecewise", (2,), legacy_skip_attn=True)), MissingMetadataError
    )
    assert "PIECEWISE(tokens=2, reqs=any)" in fix and "prepare_inputs_to_capture(..., full_cudagraph)" in fix


def test_replaying_a_shape_that_was_never_captured(runner: ModelRunner) -> None:
    never = BatchExecutionDescriptor(CUDAGraphMode.FULL, 3, 3)
    fix = _message(lambda: runner.cudagraph_manager.run_fullgraph(never), CaptureError)
    assert "a shape the graph was not captured for" in fix and "CudagraphDispatcher.dispatch()" in fix


@pytest.mark.parametrize(
    ("mode", "flavor"), [("full", "compiled"), ("piecewise", "compiled"), ("piecewise", "breakable")]
)
def test_a_closed_runner_says_so_wherever_its_graphs_are_asked_for(mode: str, flavor: str) -> None:
    """A step, a picture of the graphs, the replay counts: each says the runner was closed, and how to go on."""
    from cglab.lab.anatomy import describe_pieces, describe_replays

    runner = ModelRunner(CONFIG, CompilationConfig(mode, SIZES, use_breakable_cg=flavor == "breakable"))
    runner.add_request("a")
    desc = next(iter(runner.graph_replays()))
    runner.close()
    closed = "the graphs were released by close(); build a new ModelRunner to capture them again"
    calls = [
        lambda: runner.step({"a": [1]}),
        runner.graph_replays,
        lambda: runner.captured_graphs(desc),
        lambda: describe_pieces(runner, desc),
        lambda: describe_replays(runner),
    ]
    for call in calls:
        assert closed in _message(call, CaptureError)
    assert runner.step({"a": [1]}, eager=True).descriptor.cg_mode is CUDAGraphMode.NONE  # eager steps still run
