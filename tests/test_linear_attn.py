"""Linear attention: a layer whose builder builds capture metadata for decode-only batches, the fix's
second reason (vLLM PR #49364: breakable PIECEWISE capture moved from ``for_capture=True`` to
``False``), and vLLM's lowering of the CUDA graph mode for builders that support less."""

from __future__ import annotations

import json

import pytest
import torch
from matplotlib.figure import Figure

from cglab import (
    AttentionCGSupport,
    CaptureError,
    ConfigError,
    CUDAGraphMode,
    MetadataBuildError,
    ModelRunner,
    ToyConfig,
    run_repro,
    state_differences,
)
from cglab.cli import main
from cglab.compilation_config import CompilationConfig, resolve_cudagraph_mode, splitting_ops_contain_attention
from cglab.cudagraph_support import can_build_metadata
from cglab.forward_context import set_forward_context
from cglab.lab.draw import capture_support, draw_capture_support
from cglab.layers.linear_attn import LinearAttention, _linear_attention
from cglab.metadata import (
    CommonAttentionMetadata,
    LinearAttentionMetadata,
    LinearAttentionMetadataBuilder,
    ShortConvMetadataBuilder,
)
from cglab.repro import repro_config

LAYERS = "linear_attn,attn"
FLAVORS = ["compiled", "breakable"]
ABOVE = (1, 2, 4, 8, 16)  # with max_num_reqs 8 the 16-token capture batch is 8 requests x 2 tokens
STATE = "layers.0.linear_attn.state_cache"
NEVER, DECODE, UNIFORM, ALWAYS = (
    AttentionCGSupport.NEVER,
    AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE,
    AttentionCGSupport.UNIFORM_BATCH,
    AttentionCGSupport.ALWAYS,
)
NONE, PIECEWISE, FULL = CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL
FULL_AND_PIECEWISE, FULL_DECODE_ONLY = CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.FULL_DECODE_ONLY


# -- the recurrence ------------------------------------------------------------------------------


def test_prompt_in_one_step_equals_prompt_token_by_token_and_in_chunks() -> None:
    config = ToyConfig(layers=("linear_attn", "attn", "linear_attn"), max_num_reqs=2)
    prompt = [(7 * i + 3) % config.vocab_size for i in range(11)]  # three blocks of 4
    whole, by_token, chunked = (ModelRunner(config) for _ in range(3))
    for runner in (whole, by_token, chunked):
        runner.add_request("a", num_prompt_tokens=len(prompt))
    expected = whole.step({"a": prompt}).logits[-1]
    for token in prompt:
        last = by_token.step({"a": [token]}).logits[-1]
    for start in range(0, len(prompt), 4):
        last_chunk = chunked.step({"a": prompt[start : start + 4]}).logits[-1]
    for runner, logits in ((by_token, last), (chunked, last_chunk)):
        assert (logits - expected).abs().max().item() < 1e-5
        assert max(state_differences(runner, whole).values()) < 1e-5
    assert whole.state_tensors()[STATE].abs().sum() > 0  # the state really was written


def test_the_kernel_is_the_recurrence() -> None:
    """Against the formula, token by token: S = decay * S + k^T v, o = q S (q and k normalised). Request
    0 starts at position 0, request 1 continues from its saved state, and a padding row follows."""
    config = ToyConfig(layers=("linear_attn",), num_heads=2, hidden_size=8, num_blocks=4)
    layer = LinearAttention(config, "layers.0.linear_attn")
    heads, dim = config.num_heads, config.head_dim
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(6, heads, dim, generator=gen) for _ in range(3))
    decay = torch.tensor([0.9, 0.5])
    saved = torch.randn(heads, dim, dim, generator=gen)
    layer.state_cache[2] = saved  # request 1's first block is block 2
    query_start_loc, seq_lens = torch.tensor([0, 3, 5]), torch.tensor([3, 9])  # request 1: positions 7 and 8
    md = LinearAttentionMetadata(
        query_start_loc,
        seq_lens,
        torch.tensor([1, 2]),
        torch.tensor([4, 5, 6, 30, 31, -1]),
        num_reqs=2,
        num_actual_tokens=5,
        max_query_len=3,
    )
    out = torch.full_like(q, float("nan"))
    with set_forward_context({layer.layer_name: md}):
        _linear_attention(q, k, v, decay, out, layer.state_cache, layer.layer_name)
    qn, kn = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    for tokens, state, block in ((range(0, 3), torch.zeros(heads, dim, dim), 1), (range(3, 5), saved, 2)):
        for t in tokens:
            state = decay[:, None, None] * state + kn[t][:, :, None] * v[t][:, None, :]
            torch.testing.assert_close(out[t], torch.einsum("hd,hde->he", qn[t], state))
        torch.testing.assert_close(layer.state_cache[block], state)
    assert torch.equal(out[5], torch.zeros(heads, dim))  # the padding row: no request, zero output


def test_a_reused_block_starts_from_a_zero_state() -> None:
    """The freed request's state stays in its block; the next request there must not read it."""
    config = ToyConfig(layers=("linear_attn",), max_num_reqs=2)
    reused, fresh = ModelRunner(config), ModelRunner(config)
    reused.add_request("old")
    reused.step({"old": [5, 6, 7, 8, 9]})
    old_blocks = reused.requests["old"].block_ids
    reused.free_request("old")
    for runner in (reused, fresh):
        runner.add_request("new")
        runner.step({"new": [1, 2, 3]})
    assert reused.requests["new"].block_ids[0] in old_blocks
    step = {"new": [4]}
    assert (reused.step(step).logits - fresh.step(step).logits).abs().max().item() < 1e-6


def test_each_request_keeps_a_state_of_its_own() -> None:
    """Another request running in between changes nothing for this one: each request's state lives in its
    own first block. (Read from a column most rows leave unused, every request would share one state, and
    the eager reference with them: only a test of the requests' independence sees it.)"""
    config = ToyConfig(layers=("linear_attn", "attn"), max_num_reqs=2)
    alone, shared = ModelRunner(config), ModelRunner(config)
    for runner in (alone, shared):
        runner.add_request("a")
        runner.step({"a": [5, 6, 7]})
    shared.add_request("b")
    shared.step({"b": [9, 10, 11, 12, 13]})
    for token in (8, 3):
        assert torch.equal(alone.step({"a": [token]}).logits, shared.step({"a": [token]}).logits)
    both = shared.step({"a": [4], "b": [2]}).logits  # in one batch: other matmul shapes, rounding only
    assert (both[:1] - alone.step({"a": [4]}).logits).abs().max().item() < 1e-5


# -- the fix's second reason ----------------------------------------------------------------------


def test_legacy_breakable_capture_fails_in_the_builder_above_max_num_reqs(device) -> None:
    """Before the fix breakable PIECEWISE built capture metadata, and a 16-token capture batch of 8
    requests is prefill-shaped: the decode-only builder refuses it."""
    result = run_repro(
        CompilationConfig("piecewise", ABOVE, legacy_skip_attn=True, use_breakable_cg=True),
        ToyConfig(layers=LAYERS),
        steps=2,
        device=device,
    )
    assert result.error.startswith(
        "MetadataBuildError: capturing the PIECEWISE(tokens=16, reqs=any) graph failed: "
        "LinearAttentionMetadataBuilder cannot build capture metadata (for_capture=True) "
        "for a batch of 16 tokens in 8 requests (longest query 2 tokens)"
    )
    assert "UNIFORM_SINGLE_TOKEN_DECODE" in result.error and "at or below max_num_reqs (8)" in result.error
    assert result.cudagraph_mode == "piecewise" and result.captured_sizes == {}
    config = ToyConfig(layers=("linear_attn", "attn"), max_num_reqs=4)
    with pytest.raises(MetadataBuildError, match=r"8 tokens in 4 requests \(longest query 2 tokens\)") as info:
        ModelRunner(
            config, CompilationConfig("piecewise", (2, 8), use_breakable_cg=True, legacy_skip_attn=True), device=device
        )
    assert isinstance(info.value, CaptureError)


def test_legacy_breakable_works_when_capture_batches_are_decode_shaped(device, replays) -> None:
    result = run_repro(
        CompilationConfig("piecewise", (1, 2, 4, 8), legacy_skip_attn=True, use_breakable_cg=True),
        ToyConfig(layers=LAYERS),
        prefill_chunk=4,
        steps=8,
        device=device,
    )
    assert result.error is None and not result.diverged, result.step_diffs
    assert result.steps_by_mode["piecewise"] > 0 and replays["piecewise"] == result.steps_by_mode["piecewise"]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_fixed_path_captures_above_max_num_reqs_and_matches_eager(device, flavor, replays) -> None:
    """Ordinary metadata at PIECEWISE capture (the fix): the prefill-shaped capture batches are built,
    and chunked-prefill steps of up to 10 tokens replay the 16-token graph."""
    result = run_repro(
        CompilationConfig("piecewise", ABOVE, use_breakable_cg=flavor == "breakable"),
        ToyConfig(layers=LAYERS),
        batch_sizes=(3, 1, 4),
        max_num_reqs=4,
        prefill_chunk=6,
        steps=10,
        device=device,
    )
    assert result.error is None
    assert result.max_abs_diff <= result.tolerance and not result.state_diverged, result.step_diffs
    assert result.captured_sizes == {"piecewise": list(ABOVE)}
    assert result.steps_by_mode == {"piecewise": 10} and replays["piecewise"] == 10
    assert any(m.startswith("PIECEWISE(tokens=16") for m in result.step_modes)


@pytest.mark.parametrize(
    ("mode", "flavor"), [("piecewise", "breakable"), ("piecewise", "compiled"), ("full_and_piecewise", "breakable")]
)
def test_capture_writes_nothing_into_the_state_cache(device, monkeypatch, mode, flavor) -> None:
    """Warmup and the eager breaks run for real on the dummy batches (prefill-shaped ones too): no real
    state entry may change, only the spare row."""
    original = LinearAttention.__init__

    def prefilled(self: LinearAttention, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)
        self.state_cache.copy_(torch.randn(self.state_cache.shape, generator=torch.Generator().manual_seed(1)))

    monkeypatch.setattr(LinearAttention, "__init__", prefilled)
    config = ToyConfig(layers=("linear_attn", "attn"), max_num_reqs=4, num_blocks=8)
    runner = ModelRunner(
        config, CompilationConfig(mode, (1, 4, 16), use_breakable_cg=flavor == "breakable"), device=device
    )
    before = torch.randn(
        (config.num_blocks + 1, config.num_heads, config.head_dim, config.head_dim),
        generator=torch.Generator().manual_seed(1),
    )[:-1]
    assert torch.equal(runner.state_tensors()[STATE].cpu(), before)
    runner.close()


# -- lowering the mode ------------------------------------------------------------------------------


@pytest.mark.parametrize("flavor", FLAVORS)
def test_plain_full_is_lowered_to_full_and_piecewise_and_matches_eager(device, flavor, replays) -> None:
    result = run_repro(
        CompilationConfig("full", use_breakable_cg=flavor == "breakable"),
        ToyConfig(layers=LAYERS),
        batch_sizes=(2, 1),
        prefill_chunk=8,
        steps=8,
        device=device,
    )
    assert result.mode == "full" and result.cudagraph_mode == "full_and_piecewise"
    assert result.cudagraph_mode_note.startswith(
        "cudagraph_mode FULL lowered to FULL_AND_PIECEWISE: "
        "LinearAttentionMetadataBuilder's cudagraph_support is "
        "UNIFORM_SINGLE_TOKEN_DECODE"
    )
    assert result.error is None and not result.diverged, result.step_diffs
    graphs = {mode: n for mode, n in result.steps_by_mode.items() if mode != "none"}  # "none": above every size
    assert set(graphs) == {"full", "piecewise"} and replays == graphs
    assert result.to_json()["cudagraph_mode"] == "full_and_piecewise"


def test_the_runner_uses_the_lowered_policy_everywhere_and_full_decode_only_stays() -> None:
    config = ToyConfig(layers=("linear_attn", "attn"))
    lowered = ModelRunner(config, CompilationConfig("full", (1, 2), use_breakable_cg=True))
    assert (
        lowered.compilation_config.cudagraph_mode is FULL_AND_PIECEWISE
        and lowered.dispatcher.policy is FULL_AND_PIECEWISE
    )
    assert {d.uniform_token_count for d in lowered.dispatcher.descriptors if d.cg_mode is FULL} == {1}
    assert "LinearAttentionMetadataBuilder" in lowered.compilation_config.cudagraph_mode_note
    kept = ModelRunner(config, CompilationConfig("full_decode_only", (1, 2), use_breakable_cg=True))
    assert (
        kept.compilation_config.cudagraph_mode is FULL_DECODE_ONLY
        and kept.compilation_config.cudagraph_mode_note is None
    )
    assert (
        ModelRunner(ToyConfig(), CompilationConfig("full", (1,))).compilation_config.cudagraph_mode_note is None
    )  # all ALWAYS


def test_a_builder_passed_by_the_user_lowers_the_mode_too() -> None:
    class UniformShortConvBuilder(ShortConvMetadataBuilder):
        cudagraph_support = AttentionCGSupport.UNIFORM_BATCH

    config = ToyConfig(layers=("attn", "sconv"))  # not the first group: the least capable
    runner = ModelRunner(
        config,
        CompilationConfig("full", (1, 2)),
        builders={"sconv": UniformShortConvBuilder(config, torch.device("cpu"))},
    )
    assert runner.compilation_config.cudagraph_mode is FULL_AND_PIECEWISE
    assert (
        "UniformShortConvBuilder's cudagraph_support is UNIFORM_BATCH" in runner.compilation_config.cudagraph_mode_note
    )

    class Unlabelled:
        def build(self, common: object, for_capture: bool = False) -> None: ...

    with pytest.raises(ConfigError, match=r"builders\['sconv'\] \(Unlabelled\) must have a build.* cudagraph_support"):
        ModelRunner(config, CompilationConfig("full", (1, 2)), builders={"sconv": Unlabelled()})


def test_linear_attention_must_stay_a_splitting_op_under_compiled_piecewise() -> None:
    config = ToyConfig(layers=("linear_attn", "attn"))
    resolved = CompilationConfig("piecewise").resolve(config, torch.device("cpu"), ())
    assert resolved.splitting_ops == ("cglab::linear_attention", "cglab::unified_attention")
    with pytest.raises(ConfigError, match="add cglab::linear_attention to splitting_ops"):
        ModelRunner(config, CompilationConfig("piecewise", (1, 2), splitting_ops=["cglab::unified_attention"]))
    # Without PIECEWISE graphs nothing is frozen in a piece: FULL lowered to FULL_DECODE_ONLY (attention
    # is not all split), and the FULL decode graphs hold decode capture metadata.
    runner = ModelRunner(config, CompilationConfig("full", (1, 2), splitting_ops=["cglab::unified_attention"]))
    assert runner.compilation_config.cudagraph_mode is FULL_DECODE_ONLY


def _note(mode: CUDAGraphMode, to: CUDAGraphMode, support: AttentionCGSupport, why: str) -> str:
    return f"cudagraph_mode {mode.name} lowered to {to.name}: B's cudagraph_support is {support.name}; {why}"


MIXED_SPLIT = (
    "FULL graphs of mixed batches need ALWAYS; mixed batches run PIECEWISE (attention is outside the "
    "graphs), uniform decode batches FULL"
)
MIXED_EAGER = (
    "FULL graphs of mixed batches need ALWAYS; mixed batches run eagerly (attention is not a splitting "
    "op), uniform decode batches FULL"
)
NO_FULL_SPLIT = "no FULL graph can be captured; attention is compiled piecewise"
NO_FULL_EAGER = "no FULL graph can be captured, and attention is not compiled piecewise"
SPEC = "speculative decoding verifies 3 tokens per request, and FULL graphs of such batches need UNIFORM_BATCH or more"

RULE = [  # mode, support, splitting ops contain attention, uniform_decode_query_len -> mode, note
    (NONE, NEVER, True, 1, NONE, None),  # (1) NONE stays NONE
    (FULL, ALWAYS, False, 1, FULL, None),
    (FULL, DECODE, True, 1, FULL_AND_PIECEWISE, _note(FULL, FULL_AND_PIECEWISE, DECODE, MIXED_SPLIT)),  # (2)
    (FULL, UNIFORM, False, 1, FULL_DECODE_ONLY, _note(FULL, FULL_DECODE_ONLY, UNIFORM, MIXED_EAGER)),
    (FULL_AND_PIECEWISE, NEVER, True, 1, PIECEWISE, _note(FULL_AND_PIECEWISE, PIECEWISE, NEVER, NO_FULL_SPLIT)),  # (3)
    (FULL_DECODE_ONLY, NEVER, False, 1, NONE, _note(FULL_DECODE_ONLY, NONE, NEVER, NO_FULL_EAGER)),
    (FULL_AND_PIECEWISE, DECODE, True, 3, PIECEWISE, _note(FULL_AND_PIECEWISE, PIECEWISE, DECODE, SPEC)),  # (4)
    (FULL_DECODE_ONLY, DECODE, False, 3, NONE, _note(FULL_DECODE_ONLY, NONE, DECODE, SPEC)),
    (FULL_AND_PIECEWISE, UNIFORM, True, 3, FULL_AND_PIECEWISE, None),
    (
        FULL,
        DECODE,
        True,
        3,
        PIECEWISE,  # (2) then (4)
        _note(FULL, FULL_AND_PIECEWISE, DECODE, MIXED_SPLIT)
        + "; then "
        + _note(FULL_AND_PIECEWISE, PIECEWISE, DECODE, SPEC),
    ),
    (FULL_DECODE_ONLY, DECODE, True, 1, FULL_DECODE_ONLY, None),
    (FULL_AND_PIECEWISE, DECODE, True, 1, FULL_AND_PIECEWISE, None),
    (PIECEWISE, NEVER, True, 3, PIECEWISE, None),  # no FULL graph asked for: nothing to lower
]


@pytest.mark.parametrize(("mode", "support", "split", "query_len", "expected", "note"), RULE)
def test_resolve_cudagraph_mode_follows_vllms_rule(mode, support, split, query_len, expected, note) -> None:
    assert resolve_cudagraph_mode(
        mode, support, builder_name="B", splitting_ops_contain_attention=split, uniform_decode_query_len=query_len
    ) == (expected, note)


def test_mixed_full_with_a_never_builder_is_refused_with_the_remedy() -> None:
    with pytest.raises(
        ConfigError,
        match=r"cudagraph_mode FULL is not supported: B's cudagraph_support is NEVER .*"
        r"use cudagraph_mode='piecewise'",
    ):
        resolve_cudagraph_mode(FULL, NEVER, builder_name="B", splitting_ops_contain_attention=True)


def test_splitting_ops_contain_attention() -> None:
    layers = ("linear_attn", "sconv", "attn")
    both = ("cglab::unified_attention", "cglab::linear_attention")
    assert splitting_ops_contain_attention(both, layers, "compiled")
    assert not splitting_ops_contain_attention(both[:1], layers, "compiled")
    assert splitting_ops_contain_attention((), layers, "breakable")  # attention is always an eager break


# -- the one rule for "can build" ---------------------------------------------------------------------

SHAPES = {"decode": [1, 1, 1], "uniform prefill": [2, 2], "mixed": [1, 1, 5], "one prompt": [4]}
CAN = {  # shape -> the levels that can build capture metadata for it
    "decode": {DECODE, UNIFORM, ALWAYS},
    "uniform prefill": {UNIFORM, ALWAYS},
    "mixed": {ALWAYS},
    "one prompt": {UNIFORM, ALWAYS},
}


def _common(query_lens: list[int]) -> CommonAttentionMetadata:
    starts = torch.tensor([0, *query_lens]).cumsum(0)
    return CommonAttentionMetadata(
        starts,
        torch.tensor(query_lens),
        torch.zeros(len(query_lens), 2, dtype=torch.long),
        torch.full((sum(query_lens),), -1),
        len(query_lens),
        sum(query_lens),
        max(query_lens),
        max(query_lens),
    )


@pytest.mark.parametrize("shape", list(SHAPES))
def test_can_build_metadata_and_the_builder_apply_one_rule(shape: str) -> None:
    query_lens = SHAPES[shape]
    size = {"num_reqs": len(query_lens), "num_tokens": sum(query_lens), "max_query_len": max(query_lens)}
    assert {s for s in AttentionCGSupport if can_build_metadata(s, **size, for_capture=True)} == CAN[shape]
    assert all(can_build_metadata(s, **size, for_capture=False) for s in AttentionCGSupport)
    builder = LinearAttentionMetadataBuilder(ToyConfig(), torch.device("cpu"))
    builder.build(_common(query_lens))  # ordinary metadata: any batch
    if DECODE in CAN[shape]:
        assert builder.build(_common(query_lens), for_capture=True).max_query_len == 1
    else:
        with pytest.raises(MetadataBuildError, match=f"batch of {sum(query_lens)} tokens in {len(query_lens)} req"):
            builder.build(_common(query_lens), for_capture=True)


def test_capture_support_rows_and_figure() -> None:
    rows = capture_support(4, (8, 1, 6))
    assert [(r.num_tokens, r.query_lens, r.decode_shaped) for r in rows] == [
        (1, (1,), True),
        (6, (1, 1, 2, 2), False),
        (8, (2, 2, 2, 2), False),
    ]
    assert [r.describe_batch() for r in rows] == ["1 req x 1 token", "2 x 1 + 2 x 2 tokens", "4 reqs x 2 tokens"]
    assert [r.old[DECODE] for r in rows] == [True, False, False]
    assert [r.old[UNIFORM] for r in rows] == [True, False, True]
    assert all(all(r.fixed.values()) for r in rows) and not any(r.old[NEVER] for r in rows)
    figure = draw_capture_support(4, (1, 2, 4, 8, 16))
    assert isinstance(figure, Figure) and len(figure.axes) == 1
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert texts.count("fails") == 5 + 2 and "4 reqs x 4 tokens\n(prefill-shaped)" in texts  # NEVER x5, decode x2


# -- the CLI ------------------------------------------------------------------------------------------

OLD_BREAKABLE = [
    "repro",
    "--layers",
    LAYERS,
    "--mode",
    "piecewise",
    "--piecewise-flavor",
    "breakable",
    "--legacy-skip-attn",
    "--capture-sizes",
    "1,2,4,8,16",
    "--steps",
    "2",
]


def test_cli_reports_the_builder_failure_as_a_finding(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*OLD_BREAKABLE, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    keys = list(data)
    assert keys[keys.index("prefill_chunk") + 1] == "cudagraph_mode" and data["cudagraph_mode"] == "piecewise"
    assert "LinearAttentionMetadataBuilder cannot build capture metadata" in data["error"]
    assert "16 tokens in 8 requests (longest query 2 tokens)" in data["error"]
    assert main([*OLD_BREAKABLE, "--json", "--check"]) == 1
    capsys.readouterr()
    assert main([*OLD_BREAKABLE, "--max-num-reqs", "4", "--batch-sizes", "3,1"]) == 0
    out = capsys.readouterr().out  # 16 tokens over max_num_reqs, not over the largest batch size
    assert "ERROR: MetadataBuildError: capturing the PIECEWISE(tokens=16, reqs=any) graph failed" in out
    assert "16 tokens in 4 requests (longest query 4 tokens)" in out


def test_max_num_reqs_sets_the_engine_limit_not_the_request_pool() -> None:
    model, cc = ToyConfig(layers=LAYERS), CompilationConfig()
    config = repro_config(model, cc, [3, 1], steps=4, max_num_reqs=6)
    assert config.max_num_reqs == 6 and config.num_blocks == repro_config(model, cc, [3, 1], steps=4).num_blocks
    result = run_repro(
        CompilationConfig("piecewise", use_breakable_cg=True),
        ToyConfig(layers=LAYERS),
        batch_sizes=(3, 1),
        steps=2,
        max_num_reqs=6,
    )
    assert result.error is None and not result.diverged and result.steps_by_mode == {"piecewise": 2}


def test_cli_prints_the_lowering_note(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repro", "--layers", LAYERS, "--mode", "full", "--steps", "2", "--piecewise-flavor", "breakable"]) == 0
    out = capsys.readouterr().out
    assert "  cudagraph_mode FULL lowered to FULL_AND_PIECEWISE: LinearAttentionMetadataBuilder's" in out
    assert main(["repro", "--layers", "attn", "--mode", "full", "--steps", "2", "--piecewise-flavor", "breakable"]) == 0
    assert "lowered" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "fix"),
    [
        (["--num-speculative-tokens", "2", "--draft-layers", "linear_attn"], "does not support linear_attn"),
        (["--layers", LAYERS, "--splitting-ops", "cglab::unified_attention"], "add cglab::linear_attention"),
    ],
)
def test_cli_bad_values_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], fix: str) -> None:
    assert main(["repro", "--steps", "2", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and fix in err, err
