"""Padding and dispatch: which graph serves which batch, under every policy (vLLM model runner v2)."""

import pytest

from cglab import BatchExecutionDescriptor, CudagraphDispatcher, CUDAGraphMode, ModelRunner, ToyConfig
from cglab.batch import (
    decode_graph_eligible,
    get_uniform_decode_token_count,
    prefill_runs_as_decode,
    uniform_decode_sizes,
)
from cglab.compilation_config import CompilationConfig
from cglab.config import default_capture_sizes
from cglab.errors import ConfigError

NONE, PW, FULL = CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL
FAP, FDO = CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.FULL_DECODE_ONLY
DECODE = 1  # uniform_token_count of a decode batch; None for any other batch


def test_piecewise_pads_tokens_not_requests():
    d = CudagraphDispatcher(PW, [1, 2, 4, 8], max_num_reqs=8)
    assert d.dispatch(3, 3, DECODE) == BatchExecutionDescriptor(PW, 4, None)
    assert d.dispatch(2, 7, None) == BatchExecutionDescriptor(PW, 8, None)


def test_full_pads_tokens_and_requests_and_serves_mixed_batches():
    """Plain FULL is not decode-only: FULL(size, num_reqs=min(size, max_num_reqs)) for every size."""
    d = CudagraphDispatcher(FULL, [1, 2, 4, 8], max_num_reqs=6)
    assert d.dispatch(3, 3, DECODE) == BatchExecutionDescriptor(FULL, 4, 4)
    assert d.dispatch(5, 5, DECODE) == BatchExecutionDescriptor(FULL, 8, 6)
    assert d.dispatch(2, 7, None) == BatchExecutionDescriptor(FULL, 8, 6)  # a prefill chunk plus a decode


def test_full_and_piecewise_decode_takes_full_and_mixed_takes_piecewise():
    d = CudagraphDispatcher(FAP, [1, 2, 4, 8], max_num_reqs=8)
    assert d.dispatch(3, 3, DECODE) == BatchExecutionDescriptor(FULL, 4, 4, uniform_token_count=1)
    assert d.dispatch(2, 3, None) == BatchExecutionDescriptor(PW, 4, None)
    assert d.dispatch(2, 4, 2) == BatchExecutionDescriptor(PW, 4, None)  # uniform, but not one token each


def test_decode_that_no_full_graph_fits_falls_back_to_piecewise():
    """FULL decode graphs stop at max_num_reqs requests: 5 decodes find FULL(4) too small, FULL(8)
    not captured (8 > max_num_reqs), so the candidate list moves on to PIECEWISE."""
    d = CudagraphDispatcher(FAP, [1, 2, 4, 8], max_num_reqs=6)
    assert [str(c) for c in d.candidates(5)] == ["PIECEWISE(tokens=8, reqs=any)"]
    assert [str(c) for c in d.candidates(3)] == ["FULL(tokens=4, reqs=4, uniform=1)", "PIECEWISE(tokens=4, reqs=any)"]
    assert d.dispatch(5, 5, DECODE) == BatchExecutionDescriptor(PW, 8, None)


def test_full_decode_only_runs_mixed_batches_eagerly():
    d = CudagraphDispatcher(FDO, [1, 2, 4, 8], max_num_reqs=8)
    assert d.dispatch(4, 4, DECODE).cg_mode is FULL
    assert d.dispatch(2, 4, None) == BatchExecutionDescriptor(NONE, 4, 2)


def test_too_large_runs_eagerly():
    assert CudagraphDispatcher(PW, [1, 2, 4], 8).dispatch(3, 9, None) == BatchExecutionDescriptor(NONE, 9, 3)
    assert CudagraphDispatcher(FULL, [1, 2, 4], 8).dispatch(5, 5, DECODE).cg_mode is NONE


def test_capture_order_piecewise_first_then_full_largest_first():
    d = CudagraphDispatcher(FAP, [1, 2, 4, 8], max_num_reqs=4)
    order = [(x.cg_mode, x.num_tokens) for x in d.capture_descriptors()]
    assert order == [(PW, 8), (PW, 4), (PW, 2), (PW, 1), (FULL, 4), (FULL, 2), (FULL, 1)]


def test_none_policy_captures_nothing():
    assert CudagraphDispatcher(NONE, [1, 2], 2).capture_descriptors() == []


@pytest.mark.parametrize(
    ("sizes", "query_len", "max_num_reqs", "expected"),
    [
        ((1, 2, 4, 8), 3, 8, [3, 6]),  # 1 and 2 both round to 3, kept once; 9 is above the largest size
        ((1, 2, 4, 8, 16, 24), 3, 8, [3, 6, 9, 18, 24]),  # vLLM #53407's example
        ((1, 2, 4, 8), 3, 1, [3]),  # 6 tokens would take 2 requests
        ((1, 2, 4, 8), 17, 8, []),  # every size rounds above 8: no FULL decode graph, and no error
        ((9, 18, 36), 17, 8, [17, 34]),
        ((1, 2, 4, 8), 1, 4, [1, 2, 4]),  # plain decode: the sizes themselves, up to max_num_reqs
    ],
)
def test_full_decode_sizes_round_up_to_the_query_length(sizes, query_len, max_num_reqs, expected):
    assert uniform_decode_sizes(sizes, query_len, max_num_reqs) == expected


def test_spec_decode_keeps_piecewise_sizes_and_rounds_full_decode_ones():
    """vLLM's model runner v2 with K = 2: PIECEWISE at the sizes given, FULL uniform decode at multiples of 3."""
    d = CudagraphDispatcher(FAP, [1, 2, 4, 8], max_num_reqs=8, decode_query_len=3)
    order = [(x.cg_mode, x.num_tokens, x.num_reqs) for x in d.capture_descriptors()]
    assert order == [(PW, 8, None), (PW, 4, None), (PW, 2, None), (PW, 1, None), (FULL, 6, 2), (FULL, 3, 1)]
    assert d.dispatch(2, 6, 3) == BatchExecutionDescriptor(FULL, 6, 2, uniform_token_count=3)
    assert d.dispatch(1, 2, None) == BatchExecutionDescriptor(PW, 2, None)  # a batch of 2 tokens pads to 2, not 3
    assert [x.num_tokens for x in CudagraphDispatcher(PW, [1, 2, 4, 8], 8, 3).capture_descriptors()] == [8, 4, 2, 1]


def _runner_with_prompts(policy: str, **kwargs) -> ModelRunner:
    runner = ModelRunner(ToyConfig(layers="sconv,attn", max_num_reqs=4), CompilationConfig(policy, (1, 2, 4), **kwargs))
    runner.add_request("old")
    runner.step({"old": [1, 2, 3]}, eager=True)
    runner.add_request("new", num_prompt_tokens=3)  # its prompt arrives a token a step
    return runner


# One request's prompt arrives a token a step beside a decode: its first token (nothing cached yet), two
# tokens after earlier ones, then a decode. The graph each step takes under each dated rule.
F2, P2 = "FULL(tokens=2, reqs=2, uniform=1)", "PIECEWISE(tokens=2, reqs=any)"
RULE_STEPS = {
    "current": [P2, F2, F2, F2],  # vLLM today: a 1-token chunk after earlier chunks runs as a decode
    "51865": [P2, P2, P2, F2],  # vLLM PR #51865 (August 2026): no request may be prefilling
    "shape": [F2, F2, F2, F2],  # before #51865: equal query lengths alone
}


@pytest.mark.parametrize("rule", RULE_STEPS)
def test_one_token_prompt_chunks_under_each_uniform_decode_rule(rule: str) -> None:
    runner = _runner_with_prompts("full_and_piecewise", uniform_decode_rule=rule)
    steps = [{"old": [4], "new": [5]}, {"old": [6], "new": [7]}, {"old": [8], "new": [9]}, {"old": [1], "new": [2]}]
    assert [str(runner.step(s).descriptor) for s in steps] == RULE_STEPS[rule]


def test_prefill_runs_as_decode_and_decode_graph_eligible_by_their_vllm_definitions() -> None:
    # a decode, a first prompt token, a 1-token chunk after 4 cached tokens, a 3-token chunk after 4
    lens, computed, prefilling = (1, 1, 1, 3), (7, 0, 4, 4), (False, True, True, True)
    assert prefill_runs_as_decode(lens, computed, prefilling) == [False, False, True, False]
    eligible = {r: decode_graph_eligible(lens[:1] + lens[2:3], (7, 4), (False, True), r) for r in RULE_STEPS}
    assert eligible == {"current": True, "51865": False, "shape": True}
    first = {r: decode_graph_eligible(lens[:2], computed[:2], prefilling[:2], r) for r in RULE_STEPS}
    assert first == {"current": False, "51865": False, "shape": True}
    assert get_uniform_decode_token_count((1, 1), True) == 1
    assert get_uniform_decode_token_count((1, 1), False) is None
    assert get_uniform_decode_token_count((1, 3), True) is None


def test_an_unknown_uniform_decode_rule_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"uniform_decode_rule must be one of \('current', '51865', 'shape'\), got 'today'"
    ):
        CompilationConfig("full_and_piecewise", uniform_decode_rule="today")


def test_default_capture_sizes_ladder():
    assert default_capture_sizes(40) == (1, 2, 4, 8, 16, 24, 32, 40)
    assert default_capture_sizes(300)[-3:] == (256, 272, 288)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("FULL", FULL),
        ("full", FULL),
        (" Piecewise ", PW),
        ("none", NONE),
        ("Full_And_Piecewise", FAP),
        ("full_decode_only\n", FDO),
        (PW, PW),
    ],
)
def test_mode_parse(mode, expected):
    assert CUDAGraphMode.parse(mode) is expected
