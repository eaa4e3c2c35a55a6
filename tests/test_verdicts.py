"""The verdict path: how a run's numbers become "matches eager", "diverged" or "lost acceptance", and
``--check``'s exit code. Every statistic is checked against a value worked out by hand.

A loosened tolerance, a difference taken from one step only, or a verdict that forgets the caches
would leave every end-to-end test green (their runs are either exact or far off): these tests pin
the rules themselves.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from cglab import CompilationConfig, CUDAGraphMode, ModelRunner, ReproResult, SpeculativeConfig, ToyConfig
from cglab.cli import main
from cglab.compare import NON_FINITE, dumps, exceeds, worst
from cglab.errors import CapacityError, ConfigError
from cglab.repro import compare_final_state, divergence_verdict, judged_run, tolerance
from cglab.runner import PreparedStep
from cglab.spec_decode import SpecDecodeRunner, acceptance_rate, run_spec_repro

# Powers of two: exact in float32, so a difference computed from tensors is exactly this number.
ABOVE, BELOW = 2.0**-12, 2.0**-14  # 2.4e-4 and 6.1e-5, on either side of float32's 1e-4


def _result(**fields: object) -> ReproResult:
    """A completed PIECEWISE run that matched eager; ``fields`` change it."""
    base = ReproResult(
        "piecewise",
        "compiled",
        False,
        "sconv,attn",
        "sim",
        {"piecewise": [1, 2]},
        4,
        0,
        {"piecewise": 4},
        0.0,
        False,
        None,
    )
    return replace(base, **fields)


class _Caches:
    """Anything with ``state_tensors()``, as ``compare_final_state`` takes a runner."""

    def __init__(self, **tensors: torch.Tensor) -> None:
        self.tensors = tensors

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return self.tensors


def test_the_tolerance_is_float32_rounding_and_no_more() -> None:
    assert tolerance("float32") == 1e-4  # padding changes matmul shapes: rounding, never a lost layer
    assert tolerance("bfloat16") == tolerance("float16") == 5e-2
    assert ReproResult.__dataclass_fields__["tolerance"].default == 1e-4


@pytest.mark.parametrize(
    ("diff", "tol", "diverged"),
    [
        (1e-4, 1e-4, False),  # at the tolerance: rounding
        (1.0001e-4, 1e-4, True),  # just above it: divergence
        (1e-3, 1e-4, True),
        (1e-3, 5e-2, False),  # the result's own tolerance decides (bfloat16 here), not a constant
        (None, 1e-4, False),  # no step compared (capture failed): no divergence claimed
    ],
)
def test_the_logits_verdict_uses_the_results_tolerance(diff: float | None, tol: float, diverged: bool) -> None:
    assert _result(max_abs_diff=diff, tolerance=tol).diverged is diverged


@pytest.mark.parametrize(
    ("fields", "diverged"),
    [
        ({}, False),
        ({"max_abs_diff": 0.3}, True),  # the logits of some step
        ({"state_diverged": True}, True),  # a cache after the last step, with exact logits
        ({"outputs_identical": False}, True),  # speculative decoding: the generated tokens
        ({"outputs_identical": True}, False),
        ({"state_diverged": None}, False),  # not compared
    ],
)
def test_diverged_means_the_logits_or_any_cache_or_the_tokens(fields: dict, diverged: bool) -> None:
    assert _result(**fields).diverged is diverged


def test_max_abs_diff_is_the_worst_step_not_the_last() -> None:
    result = _result(max_abs_diff=None, state_diverged=None, step_diffs=[3e-5, 0.25, 1e-6])
    zeros = _Caches(cache=torch.zeros(4))
    compare_final_state(result, zeros, zeros)
    assert result.max_abs_diff == 0.25 and result.diverged
    empty = _result(max_abs_diff=0.5, step_diffs=[])
    compare_final_state(empty, zeros, zeros)
    assert empty.max_abs_diff is None  # no step ran: nothing to report, not 0


def test_state_verdict_compares_every_cache_with_the_tolerance() -> None:
    """One cache off by more than the tolerance is enough; a cache within it is rounding."""
    runner = _Caches(kv=torch.zeros(2, 3), conv=torch.zeros(5), pool=torch.zeros(4))
    off = torch.zeros(5)
    off[3] = ABOVE
    close = torch.zeros(4)
    close[0] = -BELOW
    result = _result(state_diverged=None)
    compare_final_state(result, runner, _Caches(kv=torch.zeros(2, 3), conv=off, pool=close))
    assert result.state_diffs == {"kv": 0.0, "conv": ABOVE, "pool": BELOW}
    assert result.state_diverged is True and result.diverged
    within = _result(state_diverged=None)
    compare_final_state(within, runner, _Caches(kv=torch.zeros(2, 3), conv=torch.zeros(5), pool=close))
    assert within.state_diverged is False and not within.diverged
    loose = _result(state_diverged=None, tolerance=5e-2)
    compare_final_state(loose, runner, _Caches(kv=torch.zeros(2, 3), conv=off, pool=close))
    assert loose.state_diverged is False  # bfloat16's tolerance: 2.4e-4 is rounding there


def test_acceptance_rate_counts_draft_tokens_not_requests() -> None:
    """Two steps with K = 2 drafts per request: 2 + 0 + 1 and then 2 accepted of 3 * 2 + 1 * 2 verified.
    Per request it would read 5 / 4 = 1.25: more drafts accepted than proposed."""
    steps = [
        SimpleNamespace(num_drafts=[2, 2, 2], num_accepted=[2, 0, 1]),
        SimpleNamespace(num_drafts=[2], num_accepted=[2]),
    ]
    assert acceptance_rate(steps) == 5 / 8
    assert acceptance_rate([SimpleNamespace(num_drafts=[0, 2], num_accepted=[0, 1])]) == 1 / 2  # a prompt step
    assert acceptance_rate([SimpleNamespace(num_drafts=[0], num_accepted=[0])]) is None  # nothing verified
    assert acceptance_rate([]) is None


def test_acceptance_rates_of_a_run_agree_with_its_tokens_per_step() -> None:
    """In a run every request verifies K drafts a step and gains its accepted drafts plus one token, so
    the rate is (tokens gained - requests) / (K * requests), summed over the steps."""
    k, batch_sizes, steps = 2, (1, 2, 3), 6
    result = run_spec_repro(
        CompilationConfig("piecewise", (3, 6, 12, 24), legacy_skip_attn=True),
        SpeculativeConfig(k),
        ToyConfig(layers="attn,attn", seed=5),
        batch_sizes=batch_sizes,
        steps=steps,
    )
    sizes = [batch_sizes[i % len(batch_sizes)] for i in range(steps)]
    for rate, per_step in (
        (result.acceptance_rate, result.tokens_per_step),
        (result.reference_acceptance_rate, result.reference_tokens_per_step),
    ):
        accepted = sum(round(n * (tokens - 1)) for n, tokens in zip(sizes, per_step))
        assert rate == accepted / (k * sum(sizes))
    assert result.acceptance_rate < result.reference_acceptance_rate and result.lost_acceptance


@pytest.mark.parametrize(
    ("runner", "reference", "lost"),
    [
        (0.5, 0.75, True),
        (0.75, 0.75, False),
        (0.8, 0.75, False),
        (None, 0.75, False),
        (0.5, None, False),
    ],
)
def test_lost_acceptance_is_a_lower_rate_than_the_eager_drafters(runner, reference, lost) -> None:
    result = _result(num_speculative_tokens=2, acceptance_rate=runner, reference_acceptance_rate=reference)
    assert result.lost_acceptance is lost


SPEC = {
    "num_speculative_tokens": 2,
    "acceptance_rate": 0.75,
    "reference_acceptance_rate": 0.75,
    "outputs_identical": True,
    "tokens_per_step": [2.5],
    "reference_tokens_per_step": [2.5],
}
CHECK_CASES = {  # what the run found -> --check's exit code
    "matches-eager": ({}, 0),
    "logits-diverged": ({"max_abs_diff": 0.3, "step_diffs": [0.3]}, 1),
    "a-cache-diverged": ({"state_diverged": True}, 1),
    "error": ({"error": "MissingMetadataError: capturing the PIECEWISE graph failed"}, 1),
    "no-graph-replayed": ({"steps_by_mode": {"none": 4}}, 1),
    "mode-none-all-eager": ({"mode": "none", "captured_sizes": {}, "steps_by_mode": {"none": 4}}, 0),
    "speculative-as-the-eager-drafter": (SPEC, 0),
    "speculative-lost-acceptance": ({**SPEC, "acceptance_rate": 0.5}, 1),
    "speculative-tokens-differ": ({**SPEC, "outputs_identical": False}, 1),
}


@pytest.mark.parametrize("case", list(CHECK_CASES))
@pytest.mark.parametrize("output", [["--json"], []], ids=["json", "human"])
def test_check_exit_code_for_every_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], case: str, output: list[str]
) -> None:
    """``--check`` exits 1 for each reason README gives, and only with ``--check``: without it a
    completed run exits 0, whatever it found."""
    fields, code = CHECK_CASES[case]
    found = _result(**fields)
    spec = bool(found.num_speculative_tokens)
    monkeypatch.setattr("cglab.repro.run_repro", lambda *a, **k: found)
    monkeypatch.setattr("cglab.spec_decode.run_spec_repro", lambda *a, **k: found)
    argv = ["repro", *output, *(["--num-speculative-tokens", "2"] if spec else [])]
    assert main([*argv, "--check"]) == code
    assert main(argv) == 0
    out = capsys.readouterr().out
    if output:
        assert json.loads(out.splitlines()[-1])["error"] == found.error


WITHIN = "below the tolerance 0.0001"


@pytest.mark.parametrize(
    ("diff", "text"),
    [
        (0.0, WITHIN),
        (4.77e-7, WITHIN),
        (1e-4, WITHIN),
        (ABOVE, "0.000244"),
        (0.4471, "0.447"),
        (None, "n/a (no step compared)"),
    ],
)
def test_the_printed_difference_is_the_same_for_any_rounding(diff: float | None, text: str) -> None:
    """What notebooks and the CLI print: 0 on one CPU and 5e-7 on another read the same."""
    assert _result(max_abs_diff=diff).max_abs_diff_text == text


# -- NaN and inf: never a match ----------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")


def _strict(text: str) -> dict:
    """JSON as a strict parser reads it: a bare NaN or Infinity is an error, not a number."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("bad", [NAN, INF])
def test_a_non_finite_difference_is_the_worst_and_never_within_the_tolerance(bad: float) -> None:
    """Python's max drops a NaN that is not first, and ``nan > tol`` is False: both would read as a match."""
    largest = worst([0.0, bad, 1e-6])
    assert largest == bad or math.isnan(bad) and math.isnan(largest)
    assert worst([]) is None and exceeds(bad, 1e-4) and not exceeds(1e-4, 1e-4)
    result = _result(max_abs_diff=None, state_diverged=None, step_diffs=[0.0, bad, 0.0])
    zeros = _Caches(cache=torch.zeros(4))
    compare_final_state(result, zeros, zeros)
    assert result.diverged and result.non_finite and not result.state_diverged
    assert divergence_verdict(result) == f"logits DIVERGED from eager ({NON_FINITE}); caches match"
    assert result.max_abs_diff_text == str(bad)


@pytest.mark.parametrize("bad", [NAN, INF])
def test_a_non_finite_cache_is_a_divergence(bad: float) -> None:
    poisoned = torch.zeros(5)
    poisoned[3] = bad
    result = _result(state_diverged=None)
    compare_final_state(
        result, _Caches(kv=torch.zeros(2), conv=poisoned), _Caches(kv=torch.zeros(2), conv=torch.zeros(5))
    )
    assert result.state_diverged is True and result.diverged and result.non_finite
    assert divergence_verdict(result) == f"caches DIVERGED from eager ({NON_FINITE}); logits match"


@pytest.mark.parametrize("diff", [NAN, INF, -INF])
def test_json_holds_a_non_finite_number_as_a_string(diff: float) -> None:
    """JSON has no NaN: ``max_abs_diff`` becomes ``"nan"`` or ``"inf"``, which ``float()`` reads back."""
    data = _strict(dumps(_result(max_abs_diff=diff).to_json()))
    assert data["max_abs_diff"] == str(diff) and data["state_diverged"] is False
    assert _strict(dumps({"rows": [{"kernel_floor_us": diff, "batch_size": 1}]})) == {
        "rows": [{"kernel_floor_us": str(diff), "batch_size": 1}]
    }


def _poison_graph_runner(monkeypatch: pytest.MonkeyPatch, where: str, value: float) -> None:
    """The runner with graphs goes bad, the eager ones stay sound: its second replayed step returns
    ``value`` in one logit (``where="logits"``), or one cache holds ``value`` when the run ends (the
    target's in a plain run, the drafter's in a speculative one)."""
    execute, close, spec_close = ModelRunner.execute, ModelRunner.close, SpecDecodeRunner.close

    def execute_poisoned(self: ModelRunner, prepared: PreparedStep) -> torch.Tensor:
        out = execute(self, prepared)
        if where == "logits" and prepared.descriptor.cg_mode is not CUDAGraphMode.NONE:
            # Counted on the runner itself: a later run's runner may reuse a closed one's id().
            self.poison_replays = getattr(self, "poison_replays", 0) + 1
            if self.poison_replays == 2:  # not the first: max() keeps a NaN that comes first
                with torch.inference_mode():
                    out[0, 0] = value
        return out

    def poison(caches: dict[str, torch.Tensor]) -> None:
        with torch.inference_mode():
            next(iter(caches.values())).view(-1)[0] = value

    def close_poisoned(self: ModelRunner) -> None:
        close(self)
        if where == "cache" and self.cudagraph_manager is not None and self.speculative_config is None:
            poison(self.state_tensors())

    def spec_close_poisoned(self: SpecDecodeRunner) -> None:
        spec_close(self)
        if where == "cache" and self.target.cudagraph_manager is not None:
            poison(self.speculator.state_tensors())

    monkeypatch.setattr(ModelRunner, "execute", execute_poisoned)
    monkeypatch.setattr(ModelRunner, "close", close_poisoned)
    monkeypatch.setattr(SpecDecodeRunner, "close", spec_close_poisoned)


@pytest.mark.parametrize("value", [NAN, INF], ids=["nan", "inf"])
@pytest.mark.parametrize("where", ["logits", "cache"])
@pytest.mark.parametrize("spec", [False, True], ids=["plain", "speculative"])
def test_a_graph_runner_that_produces_nan_or_inf_diverged(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    device: str,
    spec: bool,
    where: str,
    value: float,
) -> None:
    """End to end, both graph backends: ``--check`` exits 1, the JSON parses strictly and names the value,
    the printed verdict gives the reason."""
    _poison_graph_runner(monkeypatch, where, value)
    argv = [
        "repro",
        "--mode",
        "full",
        "--piecewise-flavor",
        "breakable",
        "--layers",
        "sconv,attn",
        "--steps",
        "4",
        "--batch-sizes",
        "3,1",
        "--device",
        device,
        "--check",
        *(["--num-speculative-tokens", "2", "--layers", "attn,attn"] if spec else []),
    ]
    assert main([*argv, "--json"]) == 1
    data = _strict(capsys.readouterr().out)
    assert data["error"] is None
    if where == "logits":  # in a speculative run the bad logits pick other tokens: the caches follow
        assert data["max_abs_diff"] == str(value) and data["state_diverged"] is spec
    else:
        assert data["max_abs_diff"] < 1e-4 and data["state_diverged"] is True
    assert main(argv) == 1
    verdict = capsys.readouterr().out.split(" -> ")[1].splitlines()[0]
    part = "logits" if where == "logits" else "drafter caches" if spec else "caches"
    assert verdict.startswith(part) and f"DIVERGED from eager ({NON_FINITE})" in verdict, verdict


def test_the_notebooks_verdicts_call_nan_a_divergence(monkeypatch: pytest.MonkeyPatch) -> None:
    from cglab.lab import widgets

    poisoned = _result(max_abs_diff=None, state_diverged=None, step_diffs=[0.0, NAN])
    compare_final_state(poisoned, _Caches(kv=torch.zeros(2)), _Caches(kv=torch.zeros(2)))
    assert widgets.verdict(poisoned) == f"DIVERGED from eager ({NON_FINITE})"
    monkeypatch.setattr(widgets, "cached_repro", lambda *args, **options: poisoned)
    assert widgets.verdict_table(["attn"], [("piecewise", False)]).splitlines()[-1].split() == [
        "PIECEWISE",
        "compiled",
        "fixed",
        "|",
        "DIVERGED",
    ]


class _Runner:
    """A runner whose one cache holds ``value`` (the reference's holds 0), and that counts its closes."""

    def __init__(self, value: float) -> None:
        self.cache, self.closed = torch.full((2,), value), 0

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"layers.0.attn.kv_cache": self.cache}

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("error", [ConfigError("a step too long"), CapacityError("the caches are full")])
def test_a_run_that_fails_mid_way_is_its_error_and_still_compared(error: Exception) -> None:
    """Any cglab error among the steps (not only a capture error) is the run's error, not a crash; the
    steps before it and the caches are still compared, and the runner closed."""
    result, runner = _result(max_abs_diff=None, state_diverged=None), _Runner(1.0)
    with judged_run(result, runner, _Runner(0.0)):
        result.step_diffs.append(0.5)
        raise error
    assert result.error == f"{type(error).__name__}: {error}" and runner.closed == 1
    assert (result.max_abs_diff, result.state_diverged) == (0.5, True)
    assert result.state_diffs == {"layers.0.attn.kv_cache": 1.0}
