"""Compiled PIECEWISE: torch.compile split at splitting_ops, one graph per piece, on every backend."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from cglab import (
    AddressChangedError,
    BatchExecutionDescriptor,
    CaptureError,
    ConfigError,
    CUDAGraphMode,
    ModelRunner,
    ToyConfig,
    run_repro,
    set_forward_context,
)
from cglab.cli import main
from cglab.compilation import caching
from cglab.compilation.cuda_graph import CUDAGraphWrapper, cudagraph_capturing_enabled
from cglab.compilation_config import CompilationConfig
from cglab.graphs import get_backend
from cglab.lab.anatomy import graph_pieces

CONFIG = ToyConfig(layers=("sconv", "attn", "compressor", "attn"), max_num_reqs=4)
SIZES = (1, 2, 4)


def _decode(runner: ModelRunner, steps: int) -> list[str]:
    """Prefill four requests eagerly, then ``steps`` decode steps; returns how each step ran."""
    for i in range(4):
        runner.add_request(f"r{i}")
        runner.step({f"r{i}": [1 + i, 2, 3, 4, 5]}, eager=True)
    return [str(runner.step({f"r{i}": [(s + i) % 60] for i in range(1 + s % 4)}).descriptor) for s in range(steps)]


def _replayed(result, replays) -> bool:  # type: ignore[no-untyped-def]
    """The run's graph steps were really replayed, one replay per step its descriptor claims; then the
    count restarts, so each run in a test is checked on its own."""
    claimed = {mode: n for mode, n in result.steps_by_mode.items() if mode != "none"}
    served = dict(replays)
    replays.clear()
    return bool(claimed) and served == claimed


def test_graph_is_split_at_attention_into_pieces(device):
    runner = ModelRunner(CONFIG, CompilationConfig("piecewise", SIZES), device=device)
    compiled = runner.compiled_backend
    kinds = [("splitting op" if item.is_splitting_graph else "piece") for item in compiled.items]
    assert kinds == ["piece", "splitting op", "piece", "splitting op", "piece"]
    assert sorted(compiled.wrappers) == ["submod_0", "submod_2", "submod_4"]  # splitting ops stay unwrapped
    first, second = graph_pieces(runner)[:2]  # the largest PIECEWISE descriptor
    assert (first.name, first.eager, second.name, second.eager) == ("submod_0", False, "submod_1", True)
    assert (first.num_ops == 25) == (device == "cpu")  # inductor fuses on a GPU
    assert second.op == "cglab::unified_attention"
    runner.close()


def test_compiles_once_and_every_piece_replays(device):
    """One trace with a symbolic token count serves capture at every size and every eager step;
    each piece's graph is replayed once per PIECEWISE step of its size (counted, not assumed)."""
    runner = ModelRunner(CONFIG, CompilationConfig("piecewise", SIZES), device=device)
    compiled = runner.compiled_backend
    modes = _decode(runner, 8)
    assert compiled.num_compiles == 1
    assert all(m.startswith("PIECEWISE") for m in modes)
    for wrapper in compiled.wrappers.values():
        assert sorted(e.replays for e in wrapper.entries.values()) == [2, 2, 4]  # sizes 1, 2, 4 (4 pads 3)
    runner.close()


def test_full_graphs_are_captured_from_the_compiled_model(device):
    """Under FULL the piece wrappers step aside (the mode is not theirs) and one graph holds everything."""
    runner = ModelRunner(CONFIG, CompilationConfig("full_and_piecewise", SIZES), device=device)
    manager = runner.cudagraph_manager
    assert runner.compiled_backend is not None and runner.compiled_backend.num_compiles == 1
    assert manager.captured_sizes == {CUDAGraphMode.PIECEWISE: [1, 2, 4], CUDAGraphMode.FULL: [1, 2, 4]}
    assert all(d.cg_mode is CUDAGraphMode.FULL for d in manager.graphs)  # the manager holds FULL graphs only
    full = [e.graph for e in manager.graphs.values()]
    assert all(g.num_segments == 1 and g.num_eager_breaks == 0 for g in full)
    assert all(m.startswith("FULL") for m in _decode(runner, 4))
    runner.close()


def test_full_only_policy_splits_the_graph_and_wraps_nothing(device):
    """As vLLM since #20059: the split stays, and the FULL graph is captured around the split model."""
    runner = ModelRunner(CONFIG, CompilationConfig("full", SIZES), device=device)
    compiled = runner.compiled_backend
    assert [item.is_splitting_graph for item in compiled.items] == [False, True, False, True, False]
    assert not compiled.wrappers and not runner.piecewise_wrappers()
    runner.close()


def test_splitting_at_the_short_conv_makes_it_eager_and_safe(device, replays):
    """LFM2's short conv is a splitting op upstream: split there, the guard runs at every step."""
    ops = ["cglab::unified_attention", "cglab::short_conv"]
    legacy = run_repro(
        CompilationConfig("piecewise", legacy_skip_attn=True, splitting_ops=ops),
        ToyConfig(layers="sconv,attn"),
        device=device,
    )
    assert legacy.error is None and not legacy.diverged and _replayed(legacy, replays)
    both = run_repro(CompilationConfig("piecewise", legacy_skip_attn=True, splitting_ops=ops), device=device)
    assert _replayed(both, replays)
    assert both.state_diffs["layers.0.sconv.conv_state"] < both.tolerance  # the short conv is safe now...
    assert both.state_diffs["layers.2.compressor.state_cache"] > 0.05  # ...the compressor is not


# A capture size above max_num_reqs: before vLLM #49751 its dummy batch put 1 + 63 = 64 tokens in its last
# request, above the 48 (12 blocks) a request may hold here, as vLLM's CI did with block_table[255][8..15].
REVERT = {"max_num_reqs": 64}


def test_the_revert_pre_49751_dummy_split_reads_past_a_block_table_row(device, replays):
    """The revert of #49364 (#49751): with metadata at capture, attention really runs on the dummy batch."""
    broken = run_repro(CompilationConfig("piecewise", (8, 127), pre_49751_dummy_split=True), device=device, **REVERT)
    assert broken.error == (
        "CaptureError: capturing the PIECEWISE(tokens=127, reqs=any) graph failed: layers.1.attn: request 63 of "
        "this batch has 64 tokens, above max_model_len (48), so attention would read block_table[63][12..15], "
        "past the 12 blocks of its row: an illegal address on a GPU. This is the crash that got vLLM PR #49364 reverted; "
        "#49751 splits the dummy batch so that no request exceeds max_model_len (drop pre_49751_dummy_split)"
    )
    fixed = run_repro(
        CompilationConfig("piecewise", (8, 127)), device=device, **REVERT
    )  # #49751's split: at most 2 tokens a request
    assert fixed.error is None and not fixed.diverged and fixed.captured_sizes == {"piecewise": [8, 127]}
    assert _replayed(fixed, replays)
    # Before #49364 compiled PIECEWISE captured with no attention metadata: attention took its profiling
    # path at capture, so the old split never reached a kernel.
    legacy = run_repro(
        CompilationConfig("piecewise", (8, 127), pre_49751_dummy_split=True, legacy_skip_attn=True),
        ToyConfig(layers="attn"),
        device=device,
        **REVERT,
    )
    assert legacy.error is None and not legacy.diverged and _replayed(legacy, replays)
    full = run_repro(
        CompilationConfig("full", (8, 127), pre_49751_dummy_split=True), device=device, **REVERT
    )  # capture metadata: max_model_len
    assert full.error is None and not full.diverged and _replayed(full, replays)


def test_a_recompile_is_impossible(device):
    """Guards are dropped after the one trace: a size never seen, or a call outside inference mode,
    reuses the compiled graph rather than tracing again."""
    runner = ModelRunner(CONFIG, CompilationConfig("piecewise", SIZES), device=device)
    runner.add_request("a")
    runner.step({"a": list(range(1, 40))}, eager=True)  # 39 tokens: above every capture size
    with set_forward_context(None):  # a profiling run, outside inference mode
        runner.forward_model(runner.input_buffers.input_ids[:3], runner.input_buffers.positions[:3])
    assert runner.compiled_backend.num_compiles == 1
    runner.close()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"use_breakable_cg": "fused"}, "use_breakable_cg must be True or False"),
        ({"splitting_ops": ["cglab::flash_attn"]}, "unknown splitting op(s) 'cglab::flash_attn'; valid ops"),
        ({"splitting_ops": ["cglab::compressor"]}, "'cglab::compressor' are not in this model"),
        ({"splitting_ops": []}, "splitting_ops is empty"),
        ({"splitting_ops": ["cglab::short_conv"], "use_breakable_cg": True}, "applies to piecewise_flavor='compiled'"),
        ({"backend": "tvm"}, "unknown compile backend 'tvm'"),
    ],
)
def test_bad_compile_options_get_a_config_error(kwargs, needle):
    config = ToyConfig(layers=("sconv", "attn"))
    with pytest.raises(ConfigError) as err:
        ModelRunner(config, CompilationConfig("piecewise", **kwargs))
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--piecewise-flavor", "fused"], "invalid choice: 'fused'"),
        (["--splitting-ops", "cglab::nope"], "unknown splitting op(s) 'cglab::nope'"),
        (["--layers", "attn", "--splitting-ops", "cglab::short_conv"], "are not in this model"),
    ],
)
def test_bad_compile_options_get_one_line_from_the_cli(capsys, argv, needle):
    try:
        code = main(["repro", *argv])
    except SystemExit as exc:  # argparse's own errors leave through SystemExit
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_check_exits_one_on_divergence(capsys):
    assert main(["repro", "--legacy-skip-attn", "--steps", "3", "--check", "--json"]) == 1
    assert main(["repro", "--steps", "3", "--check", "--json"]) == 0
    assert main(["repro", "--piecewise-flavor", "breakable", "--legacy-skip-attn", "--steps", "3", "--check"]) == 0


def test_a_wrapper_never_captures_while_serving(device):
    runner = ModelRunner(CONFIG, CompilationConfig("piecewise", SIZES), device=device)
    wrapper = runner.compiled_backend.wrappers["submod_0"]
    wrapper.entries.clear()  # as if size 1 had never been captured
    runner.add_request("a")
    runner.step({"a": [1, 2]}, eager=True)
    with pytest.raises(CaptureError, match="graphs are only captured at start-up"):
        runner.step({"a": [3]})
    runner.close()


def test_the_token_dimension_is_traced_symbolic(device, monkeypatch):
    """One trace serves every size because its token count is a symbol, not the profiling run's 128.

    Traced static, the simulator would still run every size (an FX piece replays its ops on whatever
    it is given), but inductor on a GPU compiles kernels for the traced size only: every other size
    would fail its shape checks, or read and write the wrong rows. Dynamo's fake values are read here,
    so the trace is made here (a trace another process shared keeps its code, not those).
    """
    monkeypatch.setattr(caching, "_TRACES", OrderedDict())
    runner = ModelRunner(CONFIG, CompilationConfig("piecewise", SIZES), device=device)
    compiled = runner.compiled_backend
    # The forward's own inputs (token ids, positions); the others are the model's weights and caches.
    inputs = [
        node.meta["example_value"]
        for node in compiled.split_gm.graph.nodes
        if node.op == "placeholder" and not node.name.startswith("l_self_")
    ]
    tokens = [value.shape[0] for value in inputs if isinstance(value, torch.Tensor)]
    assert len(tokens) == 2 and all(isinstance(n, torch.SymInt) for n in tokens), tokens
    assert str(tokens[0]) == str(tokens[1])  # one symbol for both
    runner.close()


def test_the_wrappers_own_address_check_names_a_replaced_argument():
    """vLLM's debug check in the piece wrapper: a tensor argument that lives elsewhere than at capture
    is refused before the replay that would read the old storage. It sees only the arguments."""
    backend = get_backend("sim", torch.device("cpu"))
    wrapper = CUDAGraphWrapper(lambda x: x * 2, backend, "submod_0", check_addresses=True)
    desc = BatchExecutionDescriptor(CUDAGraphMode.PIECEWISE, 4)
    x = torch.ones(4)
    with torch.inference_mode(), set_forward_context(None, CUDAGraphMode.PIECEWISE, desc):
        with cudagraph_capturing_enabled():
            out = wrapper(x)
        x.fill_(3)  # written in place: the graph reads it
        assert wrapper(x) is out and out.tolist() == [6.0] * 4
        with pytest.raises(
            AddressChangedError,
            match=r"submod_0, PIECEWISE\(tokens=4, reqs=any\): tensor "
            r"argument\(s\) \[0\] live elsewhere than at capture",
        ):
            wrapper(x.clone())
        assert wrapper.entries[desc].replays == 1  # the refused call replayed nothing
        unchecked = CUDAGraphWrapper(lambda x: x * 2, backend, "submod_1")
        with cudagraph_capturing_enabled():
            unchecked(x)
        unchecked(x.clone())  # off (the default on CUDA): the stale replay goes through, silently


@pytest.mark.parametrize("strict", [False, True], ids=["guarded", "strict"])
@pytest.mark.parametrize("mode", ["full", "piecewise"])
def test_the_model_is_traced_at_the_largest_size_whatever_the_capture_sizes(
    device: str, mode: str, strict: bool
) -> None:
    """Dynamo traces once, in the profiling run, at ``max_num_tokens``, also for strict layers (no
    profiling branch) and a single capture size of 1. On CUDA, inductor lowers the pieces for that
    trace's sizes: a model traced at 1 token failed to lower (CantSplit) under FULL."""
    config = ToyConfig(strict_layers=strict)
    runner = ModelRunner(config, CompilationConfig(mode, (1,)), device=device)
    assert runner.forward_model.traced_num_tokens == config.max_num_tokens
    assert runner.forward_model.backend.num_compiles == 1
    assert runner.cudagraph_manager.captured_sizes == {CUDAGraphMode.parse(mode): [1]}
