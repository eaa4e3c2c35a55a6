"""The end-to-end reproduction: a graph runner against an eager reference on identical inputs.

This is what ``python -m cglab repro`` runs, what notebook 04 plots and what the tests assert on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import torch

from cglab.capacity import check_run_fits
from cglab.compare import NON_FINITE, HasState, exceeds, json_safe, state_differences, worst
from cglab.compilation_config import CompilationConfig
from cglab.config import ToyConfig
from cglab.errors import CaptureError, CglabError
from cglab.runner import ModelRunner


@dataclass
class ReproResult:
    mode: str
    piecewise_flavor: str
    legacy_skip_attn: bool
    layers: str
    backend: str
    captured_sizes: dict[str, list[int]]
    steps: int
    prefill_chunk: int  # 0: prompts prefilled eagerly first; N: through the engine, N prompt tokens a step
    steps_by_mode: dict[str, int]  # how the steps ran: {"full": 10, "piecewise": 5, "none": 1}
    max_abs_diff: float | None  # replay vs eager logits, over all steps; NaN or inf: the runner produced them
    state_diverged: bool | None  # any cache/state tensor differs from the reference after the last step
    error: str | None
    # The policy actually used, after lowering it for builders that support less (as vLLM does at
    # start-up); empty: the same as ``mode``. In the CLI's JSON contract, after ``prefill_chunk``.
    cudagraph_mode: str = ""
    cudagraph_mode_note: str | None = None  # what was lowered and why; None: nothing
    # Not in the CLI's JSON contract; for plots and tests.
    step_diffs: list[float] = field(default_factory=list)
    step_modes: list[str] = field(default_factory=list)
    state_diffs: dict[str, float] = field(default_factory=dict)
    tolerance: float = 1e-4
    # Speculative decoding (``cglab.spec_decode.run_spec_repro``); the two rates are in the contract.
    num_speculative_tokens: int = 0
    acceptance_rate: float | None = None  # accepted drafts / verified drafts, graph runner
    reference_acceptance_rate: float | None = None  # the same drafter run eagerly
    tokens_per_step: list[float] = field(default_factory=list)  # per step, mean over its requests
    reference_tokens_per_step: list[float] = field(default_factory=list)
    draft_steps_by_mode: dict[str, dict[str, int]] = field(default_factory=dict)  # {"prefill": {...}, "decode": {...}}
    outputs_identical: bool | None = None  # generated tokens equal the eager run's, as far as both got

    def __post_init__(self) -> None:
        if not self.cudagraph_mode:
            self.cudagraph_mode = self.mode

    def to_json(self) -> dict[str, Any]:
        """The CLI contract's keys, in its order."""
        keys = (
            "mode",
            "piecewise_flavor",
            "legacy_skip_attn",
            "layers",
            "backend",
            "steps",
            "prefill_chunk",
            "cudagraph_mode",
            "captured_sizes",
            "steps_by_mode",
            "max_abs_diff",
            "state_diverged",
            "error",
        )
        if self.num_speculative_tokens:
            keys += ("acceptance_rate", "reference_acceptance_rate")
        data = asdict(self)
        return {k: json_safe(data[k]) for k in keys}  # a NaN difference as "nan": valid JSON

    @property
    def replayed_graphs(self) -> bool:
        """Whether any step replayed a graph; if none did, the run compared eager with eager."""
        return any(n for mode, n in self.steps_by_mode.items() if mode != "none")

    @property
    def diverged(self) -> bool:
        """Replay and eager disagree in some step's logits, a final cache or the generated tokens."""
        return (
            bool(self.state_diverged)
            or self.outputs_identical is False
            or (self.max_abs_diff is not None and exceeds(self.max_abs_diff, self.tolerance))
        )

    @property
    def non_finite(self) -> bool:
        """Whether the logits or a cache compared as NaN or inf: a divergence with a reason of its own."""
        diffs = [*self.state_diffs.values(), *([] if self.max_abs_diff is None else [self.max_abs_diff])]
        return not all(map(math.isfinite, diffs))

    @property
    def max_abs_diff_text(self) -> str:
        """``max_abs_diff`` for print, the same on every machine: rounding reads as the tolerance."""
        if self.max_abs_diff is None:
            return "n/a (no step compared)"
        if self.max_abs_diff <= self.tolerance:
            return f"below the tolerance {self.tolerance:g}"
        return f"{self.max_abs_diff:.3g}"

    @property
    def lost_acceptance(self) -> bool:
        """The drafter accepted fewer drafts than when run eagerly: exact outputs, lost speed."""
        return (
            self.acceptance_rate is not None
            and self.reference_acceptance_rate is not None
            and self.acceptance_rate < self.reference_acceptance_rate
        )


def tolerance(dtype: str) -> float:
    """Differences below this are rounding (padding changes matmul shapes), not divergence."""
    return 1e-4 if dtype == "float32" else 5e-2


_MIN_PROMPT, _MAX_PROMPT = 5, 14


def repro_config(
    config: ToyConfig,
    compilation_config: CompilationConfig,
    batch_sizes: Sequence[int],
    steps: int,
    *,
    prefill_chunk: int = 0,
    num_speculative_tokens: int = 0,
    max_num_reqs: int | None = None,
) -> ToyConfig:
    """``config`` sized for the scenario: the pool holds the largest batch (or ``max_num_reqs``: a capture
    size above it makes a prefill-shaped capture batch), the caches every prompt and step, a step its chunk."""
    k, pool = num_speculative_tokens, max(batch_sizes)
    # Each step adds up to K + 1 tokens, and the drafts after the last one reach K - 1 further. Rounded up
    # to whole multiples of 48 tokens (ToyConfig's default): runs of nearby lengths then build models of
    # one shape, which share one dynamo trace (an engine's max_model_len is the model's, not the run's).
    unit = math.lcm(48, config.block_size)
    max_model_len = -(-(_MAX_PROMPT + steps * (k + 1) + k) // unit) * unit
    # A step holds the decode tokens plus a prompt chunk (no more than every prompt), and every capture
    # size fits it (vLLM never captures above its token budget).
    chunk = min(max(prefill_chunk, _MAX_PROMPT), pool * _MAX_PROMPT)
    budget = max(128, pool + chunk, pool * (k + 1), *compilation_config.cudagraph_capture_sizes)
    return dataclasses.replace(
        config,
        max_num_reqs=max_num_reqs or pool,
        max_model_len=max_model_len,
        num_blocks=pool * (max_model_len // config.block_size),
        max_num_batched_tokens=budget,
    )


def make_workload(
    config: ToyConfig, num_steps_tokens: int, num_requests: int | None = None
) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts of different lengths and each request's decode tokens, seeded (None: ``max_num_reqs``)."""
    gen = torch.Generator().manual_seed(config.seed + 1)
    pool = config.max_num_reqs if num_requests is None else num_requests
    lengths = torch.randint(_MIN_PROMPT, _MAX_PROMPT + 1, (pool,), generator=gen).tolist()
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    decode = torch.randint(0, config.vocab_size, (pool, num_steps_tokens), generator=gen).tolist()
    return prompts, decode


def schedule(
    prompts: Sequence[Sequence[int]],
    decode: Sequence[Sequence[int]],
    batch_sizes: Sequence[int],
    steps: int,
    prefill_chunk: int,
) -> Iterator[tuple[dict[str, list[int]], bool]]:
    """The steps of a run, as ``(scheduled, eager)``: eager prefills then decodes of the first
    ``batch_sizes[i % len]`` requests, or (``prefill_chunk=N``) up to N prompt tokens a step beside them."""
    if prefill_chunk == 0:
        for i, prompt in enumerate(prompts):
            yield {f"req{i}": list(prompt)}, True
    prefilled = [0 if prefill_chunk else len(p) for p in prompts]
    used = [0] * len(prompts)
    for step in range(steps):
        k = batch_sizes[step % len(batch_sizes)]
        scheduled: dict[str, list[int]] = {}
        for i in range(k):
            if prefilled[i] == len(prompts[i]):
                scheduled[f"req{i}"] = [decode[i][used[i]]]
                used[i] += 1
        budget = prefill_chunk
        for i, prompt in enumerate(prompts):
            n = min(budget, len(prompt) - prefilled[i])
            if n > 0:
                scheduled[f"req{i}"] = list(prompt[prefilled[i] : prefilled[i] + n])
                prefilled[i] += n
                budget -= n
        yield scheduled, False


def new_result(
    cc: CompilationConfig, config: ToyConfig, steps: int, prefill_chunk: int = 0, num_speculative_tokens: int = 0
) -> ReproResult:
    """An empty result for the case ``cc`` names, before any runner runs."""
    return ReproResult(
        cc.cudagraph_mode.value,
        cc.piecewise_flavor,
        cc.legacy_skip_attn,
        ",".join(config.layers),
        "eager",
        {},
        steps,
        prefill_chunk,
        {},
        None,
        None,
        None,
        tolerance=tolerance(config.dtype),
        num_speculative_tokens=num_speculative_tokens,
    )


def run_repro(
    compilation_config: CompilationConfig | str = "piecewise",
    config: ToyConfig | None = None,
    *,
    batch_sizes: Sequence[int] = (3, 1, 8),
    steps: int = 16,
    prefill_chunk: int = 0,
    max_num_reqs: int | None = None,
    device: str = "cpu",
    progress: Callable[[], object] | None = None,
) -> ReproResult:
    """Run ``schedule``'s steps on a graph runner built with ``compilation_config`` (a mode name: only that
    mode) and on an eager reference; compare every step's logits (then call ``progress()``) and, at the end,
    every cache. ``config``: the model (None: the default), sized for the run by ``repro_config``."""
    cc = CompilationConfig.of(compilation_config)
    sized = partial(repro_config, config or ToyConfig(), prefill_chunk=prefill_chunk)
    check_run_fits(sized, cc, batch_sizes, steps, max_num_reqs, device)  # before allocating
    config = sized(cc, batch_sizes, steps, max_num_reqs=max_num_reqs)
    result = new_result(cc, config, steps, prefill_chunk)
    # The graph runner first: it checks the device and the capture sizes before it builds anything.
    try:
        runner = ModelRunner(config, cc, device=device)
    except CaptureError as exc:  # a strict layer or a builder refusing to capture is a finding, not a crash
        return failed_capture(result, exc, ModelRunner(config, "none", device=device), cc)
    describe_runner(result, runner)
    reference = ModelRunner(config, "none", device=device)
    prompts, decode = make_workload(config, steps, num_requests=max(batch_sizes))
    with judged_run(result, runner, reference):
        for i, prompt in enumerate(prompts):
            for r in (runner, reference):
                r.add_request(f"req{i}", num_prompt_tokens=len(prompt))
        for scheduled, eager in schedule(prompts, decode, batch_sizes, steps, prefill_chunk):
            out = runner.step(scheduled, eager=eager)
            ref = reference.step(scheduled, eager=True)
            if eager:
                continue
            result.step_diffs.append((out.logits.float() - ref.logits.float()).abs().max().item())
            result.step_modes.append(str(out.descriptor))
            mode_name = out.descriptor.cg_mode.value
            result.steps_by_mode[mode_name] = result.steps_by_mode.get(mode_name, 0) + 1
            if progress is not None:
                progress()
    return result


def describe_runner(result: ReproResult, runner: ModelRunner) -> None:
    """How the graph runner was set up: the policy it resolved (and why), its graph backend, its graphs."""
    resolved = runner.compilation_config
    result.cudagraph_mode, result.cudagraph_mode_note = resolved.cudagraph_mode.value, resolved.cudagraph_mode_note
    result.backend = runner.backend_name
    if runner.cudagraph_manager is not None:
        result.captured_sizes = {m.value: s for m, s in runner.cudagraph_manager.captured_sizes.items()}


def failed_capture(
    result: ReproResult, error: CaptureError, eager: ModelRunner, cc: CompilationConfig, decode_query_len: int = 1
) -> ReproResult:
    """``result`` of a run whose capture raised: the error, the graph backend and the policy, resolved for
    the builders of ``eager`` (a runner of the same config) as the failed runner resolved ``cc``."""
    result.error = f"{type(error).__name__}: {error}"
    resolved = cc.resolve(eager.config, eager.device, eager.attn_groups, decode_query_len)
    result.backend = resolved.graph_backend
    result.cudagraph_mode, result.cudagraph_mode_note = resolved.cudagraph_mode.value, resolved.cudagraph_mode_note
    return result


@contextmanager
def judged_run(result: ReproResult, runner: ModelRunner | Any, reference: HasState) -> Iterator[None]:
    """The steps run inside: a ``CglabError`` among them is the run's error, not a crash, and a Ctrl-C stops
    the run with the steps so far. Either way the runner is closed and its final state compared with the reference's."""
    try:
        yield
    except (CglabError, KeyboardInterrupt) as exc:
        result.error = f"{type(exc).__name__}: {str(exc) or f'after {len(result.step_diffs)} steps'}"
    finally:
        runner.close()
    compare_final_state(result, runner, reference)


def compare_final_state(result: ReproResult, runner: HasState, reference: HasState) -> None:
    """Fill in ``result``'s verdict: the largest logit difference and which caches differ from eager."""
    result.max_abs_diff = worst(result.step_diffs)
    result.state_diffs = state_differences(runner, reference)
    result.state_diverged = any(exceeds(d, result.tolerance) for d in result.state_diffs.values())


def divergence_verdict(
    result: ReproResult,
    cache_groups: dict[str, list[str]] | None = None,
    *,
    caches_only: bool = False,
    name_caches: bool = False,
) -> str:
    """Which parts DIVERGED from eager and which match (``"caches DIVERGED from eager; logits match"``):
    a broken drafter leaves the logits exact. ``cache_groups``: caches by owner (default ``"caches"``);
    ``caches_only``: leave out logits and tokens; ``name_caches``: list each group's diverged caches."""
    groups = cache_groups if cache_groups is not None else {"caches": list(result.state_diffs)}
    parts: dict[str, list[str] | None] = {}  # part -> its diverged caches, None where it matches
    if not caches_only:
        logits = result.max_abs_diff is not None and exceeds(result.max_abs_diff, result.tolerance)
        parts["logits"] = [] if logits else None
    for label, names in groups.items():
        parts[label] = [n for n in names if exceeds(result.state_diffs.get(n, 0.0), result.tolerance)] or None
    if result.state_diverged and not any(parts[label] for label in groups):
        # A result without its per-cache differences (built by hand): which cache is unknown.
        parts = {**{p: n for p, n in parts.items() if p not in groups}, "caches": []}
    if result.outputs_identical is False and not caches_only:
        parts["generated tokens"] = []
    diverged = [f"{p} ({', '.join(n)})" if name_caches and n else p for p, n in parts.items() if n is not None]
    matching = [p for p, n in parts.items() if n is None]
    if not diverged:
        return f"{_and(matching)} match eager" if caches_only else "matches eager"
    compared = [result.state_diffs.get(n, 0.0) for names in groups.values() for n in names]
    if not caches_only and result.max_abs_diff is not None:
        compared.append(result.max_abs_diff)
    reason = "" if all(map(math.isfinite, compared)) else f" ({NON_FINITE})"
    return f"{_and(diverged)} DIVERGED from eager{reason}" + (f"; {_and(matching)} match" if matching else "")


def _and(items: Sequence[str]) -> str:
    """``["a", "b", "c"]`` -> ``"a, b and c"``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
