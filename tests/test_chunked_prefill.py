"""Chunked prefill in the engine: prompts enter in chunks beside decode tokens, and the policy decides
which graph each mixed batch replays. This is where FULL_AND_PIECEWISE hides or shows the bug."""

from __future__ import annotations

import pytest

from cglab import ModelRunner, ToyConfig, run_repro
from cglab.compilation_config import CompilationConfig
from cglab.repro import repro_config, schedule


def test_schedule_mixes_prompt_chunks_with_decodes():
    steps = list(schedule([[1, 2, 3], [4, 5]], [[10, 11, 12], [20, 21, 22]], batch_sizes=[2], steps=4, prefill_chunk=2))
    # A chunk's budget spills over to the next waiting prompt; a request decodes once its prompt is in.
    assert [s for s, _ in steps] == [
        {"req0": [1, 2]},
        {"req0": [3], "req1": [4]},
        {"req0": [10], "req1": [5]},
        {"req0": [11], "req1": [20]},
    ]
    assert not any(eager for _, eager in steps)
    eager_first = list(schedule([[1, 2, 3]], [[9, 8]], batch_sizes=[1], steps=2, prefill_chunk=0))
    assert eager_first == [({"req0": [1, 2, 3]}, True), ({"req0": [9]}, False), ({"req0": [8]}, False)]


def test_the_token_budget_holds_the_decode_tokens_and_any_prefill_chunk():
    """A step holds one decode token per running request beside the chunk, which never takes more than every
    prompt (14 tokens at most each): a chunk of 1000 for 16 requests needs 16 + 16 * 14 tokens a step."""
    config = repro_config(ToyConfig(), CompilationConfig(), [16], steps=3, prefill_chunk=1000)
    assert config.max_num_batched_tokens == 16 + 16 * 14
    result = run_repro("none", batch_sizes=(16,), prefill_chunk=1000, steps=3)
    assert result.error is None and result.steps_by_mode == {"none": 3}


def test_full_and_piecewise_hides_the_bug_on_decode_only_traffic(device, replays):
    result = run_repro(CompilationConfig("full_and_piecewise", legacy_skip_attn=True), steps=12, device=device)
    assert result.steps_by_mode == {"full": 12} and replays == {"full": 12}  # every decode step replayed FULL
    assert result.error is None and not result.diverged


def test_full_and_piecewise_shows_the_bug_once_mixed_batches_replay_piecewise(device, replays):
    result = run_repro(
        CompilationConfig("full_and_piecewise", legacy_skip_attn=True), prefill_chunk=4, steps=20, device=device
    )
    assert result.steps_by_mode.get("piecewise", 0) >= 10  # the prompt chunks mixed with decodes
    assert replays == {m: n for m, n in result.steps_by_mode.items() if m != "none"}  # really replayed
    assert result.error is None and result.diverged  # still silent
    breakable = run_repro(
        CompilationConfig("full_and_piecewise", legacy_skip_attn=True, use_breakable_cg=True),
        prefill_chunk=4,
        steps=20,
        device=device,
    )
    assert breakable.steps_by_mode == result.steps_by_mode and not breakable.diverged


@pytest.mark.parametrize("mode", ["full", "full_and_piecewise", "full_decode_only", "piecewise"])
@pytest.mark.parametrize("flavor", ["compiled", "breakable"])
def test_fixed_path_matches_eager_with_chunked_prefill(device, mode, flavor, replays):
    result = run_repro(
        CompilationConfig(mode, use_breakable_cg=flavor == "breakable"), prefill_chunk=8, steps=24, device=device
    )
    assert result.error is None and not result.diverged, (result.step_diffs, result.state_diffs)
    assert sum(result.steps_by_mode.values()) == 24
    graph_steps = sum(n for m, n in result.steps_by_mode.items() if m != "none")
    assert graph_steps >= 12  # most steps replayed a graph: the comparison is about graphs
    assert sum(replays.values()) == graph_steps  # counted where the manager replays, not assumed
    if mode == "full":
        assert set(result.steps_by_mode) <= {"full", "none"}  # plain FULL serves the mixed batches too
    if mode == "full_decode_only":
        assert result.steps_by_mode["none"] >= 10  # ... FULL_DECODE_ONLY runs them eagerly


def test_plain_full_replays_a_mixed_batch():
    runner = ModelRunner(ToyConfig(layers="sconv,attn", max_num_reqs=2), CompilationConfig("full", (2, 4)))
    runner.add_request("a")
    runner.step({"a": [1, 2, 3]}, eager=True)
    runner.add_request("b", num_prompt_tokens=3)
    out = runner.step({"a": [4], "b": [5, 6, 7]})  # a decode beside a whole prompt: 4 tokens
    assert str(out.descriptor) == "FULL(tokens=4, reqs=2)"
    assert runner.graph_replays()[out.descriptor] == 1
