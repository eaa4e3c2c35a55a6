"""Running the benchmark: one runner per row kind, every (mode, batch size) timed in interleaved
rounds, launches counted, then one profiler session, then the roofline.

The peer, ``torch.compile(mode="reduce-overhead")``, is an engine in mode NONE whose model inductor
compiles and PyTorch's CUDA graph trees record, one graph per shape: the engine captures nothing."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from functools import partial
from typing import Any

import torch
from tqdm.auto import tqdm

from cglab.bench.breakdown import breakdown, linear_bytes
from cglab.bench.config import BenchConfig, toy_dict
from cglab.bench.environment import collect_environment, measure_bandwidth, roofline
from cglab.bench.files import CSV_COLUMNS, EXTRA_COLUMNS, BenchResult
from cglab.bench.modes import BENCH_MODES, bench_compilation
from cglab.bench.profiling import profile_steps
from cglab.bench.timing import Samples, split, stats, time_steps
from cglab.compare import worst
from cglab.compilation.wrapper import fresh_forward
from cglab.config import CUDAGraphMode, ToyConfig
from cglab.graphs import GraphSegment
from cglab.graphs.ops import OpCounter
from cglab.kernels import pdl_enabled, triton_launches, use_kernels
from cglab.kernels.fused_linear import fused_linears
from cglab.metadata import prepare_attn
from cglab.runner import ModelRunner, PreparedStep, resolve_device

__all__ = ["ReduceOverheadForward", "build_order", "capture_safe", "count_launches", "run_bench"]

_ROTATIONS = 8  # distinct token-id sets cycled through the timed steps
_MAX_ROUNDS = 10  # timing rounds over all modes and batch sizes (see run_bench)
_REWARM = 3  # untimed steps before each later round


# Without a terminal (a log, a pipe): after 5 s, a line every 5 s, not a bar redrawn in place (each line starts
# with \n, so the spaces tqdm pads with end the previous line). The tests and notebooks set delay to inf.
LOG_BAR = dict(delay=5, mininterval=5, bar_format="\n{desc}: {n}/{total}, {elapsed} gone, {remaining} left {postfix}")


def run_bench(config: BenchConfig, progress: bool = True) -> BenchResult:
    """Measure every (mode, batch size): time the steps, count launches, then profile kernels.

    Each timing round visits every row in turn, so a host's drift over seconds spreads over all rows
    instead of biasing whichever ran during a slow spell. The profiler runs last: its tracing slows
    launches, so nothing is timed after it."""
    device = resolve_device(config.device)
    toy = config.toy_config()
    environment = collect_environment(device)  # the date is the run's start
    environment["piecewise_flavor"] = "breakable"  # what the "piecewise" rows measure (the plain model)
    environment["row_kinds"] = {m: BENCH_MODES[m].description for m in config.modes}
    # the custom ops' kernels (aten bodies or Triton kernels), and whether the fused linear launches with PDL
    environment |= {"kernels": config.kernels, "pdl": config.kernels == "triton" and pdl_enabled()}
    gen = torch.Generator().manual_seed(config.seed + 1)
    pool = toy.max_num_reqs
    prompts = torch.randint(0, toy.vocab_size, (pool, config.prompt_len), generator=gen).tolist()
    decode = torch.randint(0, toy.vocab_size, (pool,), generator=gen).tolist()
    rotations = torch.randint(0, toy.vocab_size, (_ROTATIONS, pool), generator=gen).to(device)
    rounds = split(config.repeats, max(1, min(_MAX_ROUNDS, config.repeats // 10)))
    keys = [(mode, batch_size) for mode in config.modes for batch_size in config.batch_sizes]
    samples: dict[tuple[str, int], Samples] = {key: Samples() for key in keys}
    runners: dict[str, ModelRunner] = {}
    threads = torch.get_num_threads()
    style = {} if sys.stderr.isatty() else LOG_BAR
    with (
        use_kernels(config.kernels),
        fused_linears(config.fused_linear),
        tqdm(total=len(rounds) * len(keys), desc="bench", unit="size", disable=not progress, **style) as bar,
    ):
        if style:  # a new step or capture does not force a line out
            bar.set_postfix_str = partial(bar.set_postfix_str, refresh=False)
        try:
            # One intra-op thread on the CPU, as torch.utils.benchmark.Timer: on a shared machine a
            # parallel op otherwise waits for a descheduled sibling thread.
            torch.set_num_threads(1 if device.type == "cpu" else threads)
            for mode in build_order(config.modes):
                bar.set_postfix_str(f"{mode}: capture")
                runners[mode] = _make_runner(mode, toy, config.batch_sizes, device, bar.set_postfix_str)
                bar.set_postfix_str(f"{mode}: prefill")
                _prefill(runners[mode], prompts, toy.max_num_batched_tokens)
                if mode == "reduce_overhead":  # after the prefill, so only decode shapes are recorded
                    skips = _cudagraph_skips()
                    runners[mode].forward_model = ReduceOverheadForward(runners[mode].model)
                    for batch_size in config.batch_sizes:  # compiled, then recorded, then replayed
                        for _ in range(3):
                            runners[mode].execute(_prepare(runners[mode], mode, batch_size, decode))
                    torch.cuda.synchronize(device)
                    environment["reduce_overhead_cudagraph_skips"] = _cudagraph_skips() - skips
            for round_index, repeats in enumerate(rounds):
                for mode, batch_size in keys:
                    bar.set_postfix_str(f"round {round_index + 1}/{len(rounds)}: {mode}, batch {batch_size}")
                    prepared = _prepare(runners[mode], mode, batch_size, decode)
                    # Full warmup first; later rounds re-warm briefly (other runners ran in between).
                    warmup = config.warmup if round_index == 0 else min(config.warmup, _REWARM)
                    samples[mode, batch_size].extend(time_steps(runners[mode], prepared, rotations, warmup, repeats))
                    bar.update(1)
            rows = [_row(runners[m], m, b, samples[m, b], config, decode) for m, b in keys]
            if "none" in runners:
                environment["max_abs_diff_vs_eager"] = _check_outputs(runners, config.batch_sizes, decode)
            bar.set_postfix_str("profiling kernels")
            windows = profile_steps(
                lambda m, b: partial(runners[m].execute, _prepare(runners[m], m, b, decode)),
                rows,
                config.profile_steps,
                device.type == "cuda",
            )
            if device.type == "cuda":  # FULL's and compiled FULL's replays, kernel by kernel (the last step)
                weights = linear_bytes(next(iter(runners.values())).model)
                environment["kernel_breakdown"] = {
                    f"{m}/{b}": breakdown(windows[m, b, config.profile_steps - 1], weights)
                    for m, b in keys
                    if m in ("full", "compiled_full") and (m, b, config.profile_steps - 1) in windows
                }
            bar.set_postfix_str("memory bandwidth")
            environment.update(roofline(next(iter(runners.values())).model, measure_bandwidth(device)))
        finally:
            torch.set_num_threads(threads)
            for runner in runners.values():
                runner.close()
    return BenchResult(
        rows, environment, {**asdict(config), "toy_config": toy_dict(toy), "capture_sizes": list(config.batch_sizes)}
    )


def build_order(modes: Sequence[str]) -> list[str]:
    """The peer first: torch's graph trees free cuBLAS's workspaces when they record, and an engine graph
    captured earlier would keep using a freed one (an illegal address on the H200)."""
    return sorted(modes, key=lambda m: m != "reduce_overhead")


class ReduceOverheadForward:
    """``model`` through ``torch.compile(mode="reduce-overhead")``, its linears unfused; each call marks a new step."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._compiled = torch.compile(fresh_forward(model), mode="reduce-overhead")

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        with fused_linears(False):  # the peer a user would pick: the plain model's cuBLAS linears, even when fused
            return self._compiled(input_ids, positions)


def capture_safe(runner: ModelRunner, prepared: PreparedStep) -> PreparedStep:
    """``prepared`` with capture-safe metadata in its buffers: the peer's graphs freeze sizes, as FULL's."""
    batch = prepared.input_batch
    block_table = runner.block_tables.block_table[: batch.num_reqs]
    slot_mapping = runner.block_tables.slot_mapping[: batch.num_tokens_after_padding]
    metadata = prepare_attn(batch, block_table, slot_mapping, runner.attn_groups, for_capture=True)
    return replace(prepared, attn_metadata=metadata)


def _cudagraph_skips() -> int:
    from torch._dynamo.utils import counters  # how often inductor declined CUDA graphs: a peer must not

    return int(counters["inductor"].get("cudagraph_skips", 0))


def _make_runner(
    mode: str, toy: ToyConfig, capture_sizes: tuple[int, ...], device: torch.device, status: Callable[[str], Any]
) -> ModelRunner:
    """A runner for ``mode``'s row with a graph for every batch size measured; the plain model's
    PIECEWISE is the breakable flavor."""
    kind = BENCH_MODES[mode]
    cc = bench_compilation(kind.cg_mode, capture_sizes, device.type, breakable=kind.flavor != "compiled")
    return ModelRunner(toy, cc, device=device, progress=lambda d: status(f"captured {d}"))


def _prefill(runner: ModelRunner, prompts: list[list[int]], max_tokens: int) -> None:
    """Give every request its prompt, eagerly, as many requests per step as the token budget allows."""
    per_step = max(1, max_tokens // len(prompts[0]))
    for start in range(0, len(prompts), per_step):
        ids = range(start, min(start + per_step, len(prompts)))
        for i in ids:
            runner.add_request(f"req{i}")
        runner.step({f"req{i}": prompts[i] for i in ids}, eager=True)


def _prepare(runner: ModelRunner, mode: str, batch_size: int, decode: list[int]) -> PreparedStep:
    """One decode token for each of the first ``batch_size`` requests; checks it runs as asked, unpadded.

    ``prepare_step`` does not advance the requests, so every batch size decodes at the same position.
    """
    kind = BENCH_MODES[mode]
    prepared = runner.prepare_step({f"req{i}": [decode[i]] for i in range(batch_size)})
    desc = prepared.descriptor
    assert desc.cg_mode is kind.cg_mode and desc.num_tokens == batch_size, f"{desc} for {mode} at batch {batch_size}"
    return capture_safe(runner, prepared) if mode == "reduce_overhead" else prepared


def _check_outputs(runners: dict[str, ModelRunner], batch_sizes: Sequence[int], decode: list[int]) -> dict[str, float]:
    """Per mode, the largest difference of its logits from eager's over every batch size: a row that
    computes something else is no faster way to do the same step. Every runner holds the same weights
    and caches and decodes the same tokens at the same positions."""
    diffs = {}
    for mode, runner in runners.items():
        per_size = []
        for batch_size in batch_sizes:
            reference = runners["none"].execute(_prepare(runners["none"], "none", batch_size, decode))[:batch_size]
            logits = runner.execute(_prepare(runner, mode, batch_size, decode))[:batch_size]
            per_size.append((logits.float() - reference.float()).abs().max().item())
        diffs[mode] = worst(per_size)  # a NaN stays NaN (max() would drop it)
    return diffs


@contextmanager
def _uncounted(segments: Sequence[GraphSegment], counter: OpCounter) -> Iterator[None]:
    """While active, replaying one of ``segments`` adds nothing to ``counter``: a segment is one
    launch whatever it holds (the simulator re-runs its ops; a GPU launches one graph)."""

    def paused(replay: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            counter.active = False
            try:
                replay()
            finally:
                counter.active = True

        return run

    for segment in segments:
        segment.replay = paused(segment.replay)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for segment in segments:
            del segment.replay  # the class's method again


def count_launches(runner: ModelRunner, prepared: PreparedStep) -> tuple[int, int, int, int]:
    """(launches, kernels, graph segments, eager breaks) of one step, counted structurally: each graph
    segment replayed is one launch, each op run outside the segments (attention at the breaks) is one."""
    desc = prepared.descriptor
    triton_before = triton_launches()  # Triton kernels run outside graphs; those inside never call Python
    graphs = [] if desc.cg_mode is CUDAGraphMode.NONE else runner.captured_graphs(desc)
    counter = OpCounter()
    segments = [step for graph in graphs for step in graph.steps if isinstance(step, GraphSegment)]
    with _uncounted(segments, counter), counter:
        runner.execute(prepared)
    eager_ops = counter.count + triton_launches() - triton_before
    # The eager breaks: a breakable graph's eager steps, or the splitting ops between compiled pieces.
    compiled = runner.compiled_backend
    breaks = (
        sum(item.is_splitting_graph for item in compiled.items)
        if compiled is not None and desc.cg_mode is CUDAGraphMode.PIECEWISE
        else sum(graph.num_eager_breaks for graph in graphs)
    )
    return len(segments) + eager_ops, sum(s.num_ops for s in segments) + eager_ops, len(segments), breaks


def _row(
    runner: ModelRunner, mode: str, batch_size: int, samples: Samples, config: BenchConfig, decode: list[int]
) -> dict[str, Any]:
    prepared = _prepare(runner, mode, batch_size, decode)
    peer = mode == "reduce_overhead"  # torch's graph trees: no structure of ours to count (the profiler can)
    launches, kernels, segments, breaks = (math.nan,) * 4 if peer else count_launches(runner, prepared)
    # FULL graphs froze capture-safe metadata: the aten body reads the model's whole key range there (a toy
    # artefact); the Triton kernel stops at the live seq_lens, as vLLM's, in every mode.
    frozen = (BENCH_MODES[mode].cg_mode is CUDAGraphMode.FULL or peer) and config.kernels == "aten"
    key_range = config.max_model_len if frozen else prepared.input_batch.max_seq_len
    # In column order; the profiler fills kernel_floor_us (nan until then).
    backend = "cuda" if runner.device.type == "cuda" else "sim"
    main = (mode, batch_size, *stats(samples.device), math.nan, launches, backend)
    counts = (kernels, launches, segments, breaks, key_range, len(samples.device))
    return dict(zip((*CSV_COLUMNS, *EXTRA_COLUMNS), (*main, stats(samples.enqueue)[0], *counts), strict=True))
