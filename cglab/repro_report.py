"""What ``python -m cglab repro`` prints for a person: a header naming the run, then its verdict.
(The command line imports it once the arguments are checked: it imports the engine, and torch.)

The verdict names what diverged from eager (the logits, the target's caches, the drafter's caches),
because a broken drafter leaves the target's outputs exact: "diverged" alone would read as a
contradiction two lines above "outputs exact".
"""

from __future__ import annotations

from cglab.config import CUDAGraphMode
from cglab.repro import ReproResult, divergence_verdict
from cglab.spec_decode.repro import cache_groups, summarize_spec

LEGACY_NOTE = (
    "--legacy-skip-attn changes nothing here: this policy captures no PIECEWISE graph, and FULL graphs got "
    "capture metadata before the fix too"
)


def repro_header(result: ReproResult, *, python_guards: bool = False, frozen_step_index: bool = False) -> str:
    """The run's first line: mode, capture path, layers, the switches that change the model, backend."""
    legacy = " with the legacy skip_attn path" if result.legacy_skip_attn else ""
    flavor = f" ({result.piecewise_flavor})" if "piecewise" in result.mode else ""
    guards = ", guards in plain Python" if python_guards else ""
    # Named with its value: the same mode and layers give a different acceptance with it on.
    frozen = (
        ", --frozen-step-index on (the draft step index is a Python int frozen at capture)" if frozen_step_index else ""
    )
    return (
        f"mode {result.mode.upper()}{flavor}{legacy}, layers {result.layers}{guards}{frozen}, backend {result.backend}"
    )


def repro_verdict(result: ReproResult) -> str:
    """``"matches eager"``, ``"NO GRAPH REPLAYED ..."`` or what DIVERGED from eager and what matches."""
    if result.diverged:
        return divergence_verdict(result, cache_groups(result) if result.num_speculative_tokens else None)
    return "NO GRAPH REPLAYED (every step ran eagerly)" if no_graph_replayed(result) else "matches eager"


def legacy_switch_idle(result: ReproResult) -> bool:
    """Whether ``--legacy-skip-attn`` changed nothing: the policy, as lowered, captured no PIECEWISE graph
    (known once the runner resolved it; ``--mode none`` is warned about before the run)."""
    return (
        result.legacy_skip_attn
        and result.mode != "none"
        and CUDAGraphMode.PIECEWISE not in CUDAGraphMode(result.cudagraph_mode).runtime_modes()
    )


def no_graph_replayed(result: ReproResult) -> bool:
    """A graph mode that ran every step eagerly compared eager with eager: no result about graphs."""
    return result.mode != "none" and result.error is None and not result.replayed_graphs


def print_repro(result: ReproResult, *, python_guards: bool = False, frozen_step_index: bool = False) -> None:
    """The human report of one run."""
    print(repro_header(result, python_guards=python_guards, frozen_step_index=frozen_step_index))
    if result.backend == "sim":
        print("  (backend 'sim' is the CPU simulator of CUDA graphs: faithful semantics, no GPU speed-up)")
    if result.cudagraph_mode_note:
        print(f"  {result.cudagraph_mode_note}")
    print(f"  captured sizes: {result.captured_sizes or 'none'}")
    if result.error:
        print(f"  ERROR: {result.error}")
    if result.max_abs_diff is not None:
        what = (
            f"steps (prompts in chunks of {result.prefill_chunk})"
            if result.prefill_chunk
            else "speculative steps"
            if result.num_speculative_tokens
            else "decode steps"
        )
        print(
            f"  {result.steps} {what}, ran as {result.steps_by_mode}: max |replay - eager|: "
            f"{result.max_abs_diff_text}, caches diverged: {result.state_diverged} -> {repro_verdict(result)}"
        )
        if no_graph_replayed(result):
            print(
                "  no batch fitted a captured graph, so this run says nothing about graphs: use --batch-sizes "
                "within --capture-sizes (and, for full_decode_only, decode steps)"
            )
    if result.acceptance_rate is not None:
        print(f"  {result.num_speculative_tokens} speculative tokens, drafts ran as {result.draft_steps_by_mode}")
        for line in summarize_spec(result).splitlines():
            print(f"  {line}")
