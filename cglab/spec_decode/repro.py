"""Speculative decoding end to end: what ``python -m cglab repro --num-speculative-tokens K`` runs.

Three engines on identical weights and prompts: the **graph runner** (target and drafter with graphs); an
eager **shadow** that verifies exactly the graph runner's drafts, so that every target step and, at the
end, every cache can be compared; an eager **reference** with its own drafter, whose acceptance rate the
graph runner's should equal. Greedy verification keeps a broken drafter's outputs exact: it shows only as
a lower acceptance rate, fewer tokens per step, a silent loss of speed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from cglab.capacity import check_run_fits
from cglab.compilation_config import DRAFT_PREFIX, CompilationConfig, SpeculativeConfig
from cglab.config import ToyConfig
from cglab.errors import CaptureError
from cglab.repro import (
    ReproResult,
    describe_runner,
    divergence_verdict,
    failed_capture,
    judged_run,
    make_workload,
    new_result,
    repro_config,
)
from cglab.spec_decode.runner import SpecDecodeRunner, SpecStepOutput


def run_spec_repro(
    compilation_config: CompilationConfig | str,
    speculative_config: SpeculativeConfig,
    config: ToyConfig | None = None,
    *,
    batch_sizes: Sequence[int] = (3, 1, 8),
    steps: int = 16,
    frozen_step_index: bool = False,
    max_num_reqs: int | None = None,
    device: str = "cpu",
    progress: Callable[[], object] | None = None,
) -> ReproResult:
    """Prefill every prompt eagerly, one request a step (every engine's speculative steps start from the
    same caches), then run ``steps`` speculative steps of the first ``batch_sizes[i % len]`` requests.
    ``speculative_config``, ``frozen_step_index``: as ``SpecDecodeRunner``'s; the rest as ``run_repro``."""
    cc, k = CompilationConfig.of(compilation_config), speculative_config.num_speculative_tokens
    sized = partial(repro_config, config or ToyConfig(), num_speculative_tokens=k)
    check_run_fits(sized, cc, batch_sizes, steps, max_num_reqs, device, speculative_config)
    config = sized(cc, batch_sizes, steps, max_num_reqs=max_num_reqs)
    result = new_result(cc, config, steps, num_speculative_tokens=k)
    eager = partial(SpecDecodeRunner, config, "none", speculative_config, device=device)
    # The graph runner first: it checks the device before it builds anything.
    try:
        runner = SpecDecodeRunner(config, cc, speculative_config, frozen_step_index=frozen_step_index, device=device)
    except CaptureError as exc:  # a strict layer refusing to capture is a finding, not a crash
        return failed_capture(result, exc, eager().target, cc, k + 1)
    describe_runner(result, runner.target)
    shadow, reference = eager(), eager()
    prompts, _ = make_workload(config, steps, num_requests=max(batch_sizes))
    engines = (runner, shadow, reference)
    outputs: dict[str, list[SpecStepOutput]] = {"runner": [], "reference": []}
    with judged_run(result, runner, shadow):
        for i, prompt in enumerate(prompts):
            for engine in engines:
                engine.add_request(f"req{i}", prompt)
                engine.step([f"req{i}"], eager=True)
        for step in range(steps):
            req_ids = [f"req{i}" for i in range(batch_sizes[step % len(batch_sizes)])]
            proposed = {r: runner.drafts[r] for r in req_ids}
            out = runner.step(req_ids)
            eager = shadow.step(req_ids, drafts=proposed)
            ref = reference.step(req_ids)
            result.step_diffs.append((out.logits.float() - eager.logits.float()).abs().max().item())
            result.step_modes.append(str(out.descriptor))
            _count(result.steps_by_mode, out.descriptor.cg_mode.value)
            _count(result.draft_steps_by_mode.setdefault("prefill", {}), out.draft_prefill.cg_mode.value)
            for desc in out.draft_decode:
                _count(result.draft_steps_by_mode.setdefault("decode", {}), desc.cg_mode.value)
            outputs["runner"].append(out)
            outputs["reference"].append(ref)
            result.tokens_per_step.append(_tokens_per_request(out))
            result.reference_tokens_per_step.append(_tokens_per_request(ref))
            if progress is not None:
                progress()
    result.acceptance_rate = acceptance_rate(outputs["runner"])
    result.reference_acceptance_rate = acceptance_rate(outputs["reference"])
    result.outputs_identical = all(_agree(runner.outputs[r], reference.outputs[r]) for r in runner.outputs)
    return result


def summarize_spec(result: ReproResult) -> str:
    """What a speculative run did, in two lines: acceptance against the eager drafter, and whether the
    outputs stayed exact and which caches (target's, drafter's) diverged, if any."""
    if result.acceptance_rate is None or result.reference_acceptance_rate is None:
        return f"no speculative step completed ({result.error or 'no drafts were verified'})"
    if not result.outputs_identical:
        verdict = "the generated tokens differ too: the target itself is broken"
    elif result.lost_acceptance:
        verdict = "LOWER than the eager drafter's: outputs exact, speed silently lost"
    else:
        verdict = "as the eager drafter's"
    tokens, reference = (sum(t) / len(t) for t in (result.tokens_per_step, result.reference_tokens_per_step))
    caches = divergence_verdict(result, cache_groups(result), caches_only=True, name_caches=True)
    return (
        f"acceptance rate {result.acceptance_rate:.3f} (eager drafter {result.reference_acceptance_rate:.3f}), "
        f"{tokens:.2f} tokens per step (eager drafter {reference:.2f}) -> {verdict}\n"
        f"generated tokens identical to the eager run: {result.outputs_identical}; {caches}"
    )


def cache_groups(result: ReproResult) -> dict[str, list[str]]:
    """A speculative run's caches by owner, for ``divergence_verdict``."""
    drafter = [name for name in result.state_diffs if name.startswith(DRAFT_PREFIX)]
    return {"target caches": [name for name in result.state_diffs if name not in drafter], "drafter caches": drafter}


def acceptance_rate(steps: Sequence[SpecStepOutput]) -> float | None:
    """Accepted drafts over verified drafts, in draft tokens over every request of every step (None: none
    verified); counted per request, the rate would read up to K times too high."""
    verified = sum(sum(step.num_drafts) for step in steps)
    return sum(sum(step.num_accepted) for step in steps) / verified if verified else None


def _count(counter: dict[str, int], key: str) -> None:
    counter[key] = counter.get(key, 0) + 1


def _tokens_per_request(output: SpecStepOutput) -> float:
    """Tokens a request gained in the step, on average: accepted drafts plus the target's own."""
    return sum(map(len, output.new_tokens)) / len(output.new_tokens)


def _agree(tokens: Sequence[int], reference: Sequence[int]) -> bool:
    """Whether two generations agree as far as both got (the slower one stops earlier)."""
    n = min(len(tokens), len(reference))
    return list(tokens[:n]) == list(reference[:n])
