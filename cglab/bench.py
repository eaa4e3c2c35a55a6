"""The replay-latency benchmark: one decode step per CUDA graph mode and batch size.

What is timed is ``ModelRunner.execute`` on a batch already written into the persistent buffers:
the graph replay (FULL, PIECEWISE) or the eager forward (NONE). Token ids are rotated between timed
steps, outside the timed region, so no step re-reads exactly the inputs of the one before.

* On a GPU each step is timed with CUDA events (device time, from the first launch to the last
  kernel) and with the host clock (what a caller waits for, the final synchronisation included).
  On the CPU simulator only the host clock exists, and the numbers say nothing about GPU speed.
* The *kernel floor* is the summed duration of one step's kernels (torch.profiler): what the step
  would cost if launching were free. On the CPU it is the summed self time of the aten ops.
* The *kernel span* runs from the step's first kernel start to its last kernel end: the floor plus
  the device's idle gaps between kernels. It is measured under the profiler, whose tracing slows
  launches a little, so it can exceed the timed median. ``enqueue_median_us`` is the host time
  until ``execute`` returns: close to the step's latency when the CPU's launching is what the step
  waits for, and an upper bound on a graph's launch latency.
* *Launches* are host submissions of GPU work per step: one per eager kernel, one per graph
  segment. On a GPU they are counted from the profiler (distinct CUDA correlation ids, since all
  kernels of one graph launch share the launch's id); ``counted_launches`` counts the same thing
  structurally, on every backend: graph segments replayed plus work-doing aten ops run outside them.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from cglab.config import CUDAGraphMode, ToyConfig, parse_layer_pattern
from cglab.environment import collect_environment
from cglab.errors import ConfigError
from cglab.forward_context import set_forward_context
from cglab.graphs import GraphSegment
from cglab.graphs.ops import OpCounter
from cglab.results import (
    CSV_COLUMNS,
    EXTRA_COLUMNS,
    FORMAT,
    RUNTIME_MODES,
    BenchResult,
    check_output,
    load_results,
    result_paths,
    save_results,
)
from cglab.runner import ModelRunner, PreparedStep, resolve_device

# The results file I/O lives in cglab.results; re-exported so `from cglab.bench import ...` keeps working.
__all__ = ["CSV_COLUMNS", "EXTRA_COLUMNS", "FORMAT", "RUNTIME_MODES", "BenchConfig", "BenchResult", "check_output",
           "load_results", "result_paths", "run_bench", "save_results"]

PIECEWISE_FLAVOR = "breakable"  # the flavor every recorded run in data/ measured (uncompiled model)
MAX_BATCH = 1024
_MARKER = "cglab.bench/"
_BLOCK_SIZE = 4
_ROTATIONS = 8  # distinct token-id sets cycled through the timed steps
_MAX_ROUNDS = 10  # timing rounds over all modes and batch sizes (see run_bench)
_REWARM = 3  # untimed steps before each later round


# Upper bounds: far above any run that ends in minutes, low enough that a typo (--repeats 1000000000,
# --hidden-size 1000000) fails here in one line instead of hanging or exhausting memory mid-run.
_BOUNDS = {"num_heads": (1, 256), "hidden_size": (1, 8192), "repeats": (5, 100_000), "warmup": (0, 10_000),
           "profile_steps": (1, 100), "prompt_len": (1, 8192), "max_model_len": (2, 8192)}
MAX_LAYERS = 256
MAX_MEMORY_GIB = 16  # the whole run, all runners; by this estimate the defaults need about 4 GiB


def _memory_estimate(toy: ToyConfig, n_layers: int, n_runners: int) -> int:
    """Rough bytes the run holds: per runner, weights (about 10 hidden^2 per layer), the paged caches
    (keys and values of every cache slot) and FULL attention's gather of max_model_len keys per request."""
    itemsize = 4 if toy.dtype == "float32" else 2
    h = toy.hidden_size
    per_layer = 10 * h * h + 2 * toy.num_blocks * toy.block_size * h + 2 * toy.max_num_reqs * toy.max_model_len * h
    return n_runners * n_layers * per_layer * itemsize


@dataclass(frozen=True)
class BenchConfig:
    """What to measure. The defaults are the GPU-sized model: 8 layers, hidden 1024, bf16, batch 1-256.

    ``max_model_len`` is small on purpose: a FULL graph's attention reads ``max_model_len`` keys
    (capture-safe metadata, fixed at capture), PIECEWISE and eager attention read the live
    ``prompt_len + 1``; a long key range would make the toy's gather, not launching, the story.
    Capture sizes equal the batch sizes, so no padding is ever timed.
    """

    layers: str = "sconv,attn,compressor,attn,sconv,attn,compressor,attn"
    hidden_size: int = 1024
    num_heads: int = 8
    dtype: str = "bfloat16"
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    modes: tuple[str, ...] = RUNTIME_MODES
    repeats: int = 300  # timed steps per mode and batch size
    warmup: int = 20  # untimed steps first (lazy init, clocks, caches)
    device: str = "cpu"
    prompt_len: int = 32  # history of every request before the timed decode step
    max_model_len: int = 128
    profile_steps: int = 3  # profiled steps per mode and batch size (kernel floor, launches)
    seed: int = 0
    quick: bool = False  # built by quick_preset(): a CPU run that ends in seconds

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "layers", ",".join(parse_layer_pattern(self.layers)))
        sizes = tuple(self.batch_sizes)
        if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or not 0 < s <= MAX_BATCH for s in sizes):
            raise ConfigError(f"batch sizes must be integers from 1 to {MAX_BATCH}, got {list(sizes)}")
        set_(self, "batch_sizes", tuple(sorted(set(sizes))))
        modes = {CUDAGraphMode.parse(m).value for m in (self.modes.split(",") if isinstance(self.modes, str)
                                                          else self.modes)}
        if not modes or not modes <= set(RUNTIME_MODES):
            raise ConfigError(f"modes must be some of {', '.join(RUNTIME_MODES)}, got {sorted(modes)}")
        set_(self, "modes", tuple(m for m in RUNTIME_MODES if m in modes))
        n_layers = len(self.layers.split(","))
        if n_layers > MAX_LAYERS:
            raise ConfigError(f"layers: {n_layers} layers exceed the limit of {MAX_LAYERS}; use a shorter pattern")
        for name, (low, high) in _BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"{name} must be an integer from {low} to {high}, got {value!r}")
        if self.max_model_len <= self.prompt_len:
            raise ConfigError(f"max_model_len ({self.max_model_len}) must exceed prompt_len ({self.prompt_len}): "
                              "the timed decode step adds one token")
        toy = self.toy_config()  # validates the model's shape now rather than mid-run
        gib = _memory_estimate(toy, n_layers, len(self.modes)) / 2**30
        if gib > MAX_MEMORY_GIB:
            raise ConfigError(f"this run would need about {gib:.0f} GiB ({len(self.modes)} runners of {n_layers} "
                              f"layers, hidden {self.hidden_size}, {toy.max_num_reqs} requests of up to "
                              f"{self.max_model_len} tokens), above the {MAX_MEMORY_GIB} GiB limit; use fewer "
                              "layers, a smaller hidden_size, fewer modes, smaller batch sizes or max_model_len")

    @classmethod
    def quick_preset(cls, **overrides: Any) -> BenchConfig:
        """The small CPU run (well under a minute): 4 layers, hidden 32, fp32, batch 1-8, 20 repeats."""
        quick = dict(layers="sconv,attn,compressor,attn", hidden_size=32, num_heads=2, dtype="float32",
                     batch_sizes=(1, 2, 4, 8), repeats=20, warmup=3, prompt_len=8, max_model_len=32, profile_steps=2)
        return cls(**{**quick, "quick": True, **overrides})

    def toy_config(self) -> ToyConfig:
        """The engine's config: one request per batch row, caches just large enough for the run."""
        pool = max(self.batch_sizes)
        blocks_per_request = -(-(self.prompt_len + 1) // _BLOCK_SIZE)
        return ToyConfig(layers=self.layers, hidden_size=self.hidden_size, num_heads=self.num_heads, dtype=self.dtype,
                         block_size=_BLOCK_SIZE, num_blocks=pool * blocks_per_request, max_num_reqs=pool,
                         max_model_len=self.max_model_len, max_num_batched_tokens=max(pool, self.prompt_len),
                         capture_sizes=self.batch_sizes, seed=self.seed)


# ----------------------------------------------------------------------------------- running
def run_bench(config: BenchConfig, progress: bool = True) -> BenchResult:
    """Measure every (mode, batch size): time the steps, count launches, then profile kernels.

    Timing runs in rounds that visit every mode and batch size in turn: a host's speed drifts over
    seconds (shared machines, clocks), and interleaving spreads any drift over all rows instead of
    biasing whichever ran during a slow spell. The profiler runs last, in one session, because its
    tracing slows launches (and may stay attached after the session): nothing is timed after it.
    """
    device = resolve_device(config.device)
    toy = config.toy_config()
    environment = collect_environment(device)  # the date is the run's start
    environment["piecewise_flavor"] = PIECEWISE_FLAVOR
    gen = torch.Generator().manual_seed(config.seed + 1)
    pool = toy.max_num_reqs
    prompts = torch.randint(0, toy.vocab_size, (pool, config.prompt_len), generator=gen).tolist()
    decode = torch.randint(0, toy.vocab_size, (pool,), generator=gen).tolist()
    rotations = torch.randint(0, toy.vocab_size, (_ROTATIONS, pool), generator=gen).to(device)
    rounds = _split(config.repeats, max(1, min(_MAX_ROUNDS, config.repeats // 10)))
    keys = [(mode, batch_size) for mode in config.modes for batch_size in config.batch_sizes]
    samples: dict[tuple[str, int], _Samples] = {key: _Samples() for key in keys}
    runners: dict[str, ModelRunner] = {}
    with _cpu_threads(1 if device.type == "cpu" else None), _progress_bar(len(rounds) * len(keys), progress) as status:
        try:
            for mode in config.modes:
                status(f"{mode}: capture")
                # The address guard is a debugging aid, off on CUDA by default: keep it out of the
                # timed replay on every backend so CPU and GPU time the same work. PIECEWISE is the
                # breakable flavor, whose launches are counted structurally (one per segment).
                runners[mode] = ModelRunner(toy, mode, device=device, check_addresses=False,
                                            piecewise_flavor=PIECEWISE_FLAVOR,
                                            progress=lambda d: status(f"captured {d}"))
                status(f"{mode}: prefill")
                _prefill(runners[mode], prompts, toy.max_num_batched_tokens)
            for round_index, repeats in enumerate(rounds):
                for mode, batch_size in keys:
                    status(f"round {round_index + 1}/{len(rounds)}: {mode}, batch {batch_size}")
                    prepared = _prepare(runners[mode], mode, batch_size, decode)
                    # Full warmup first; later rounds re-warm briefly (other runners ran in between).
                    warmup = config.warmup if round_index == 0 else min(config.warmup, _REWARM)
                    samples[mode, batch_size].extend(_time_steps(runners[mode], prepared, rotations, warmup, repeats))
                    status(None, 1)
            rows = [_row(mode, batch_size, environment["backend"], samples[mode, batch_size], config, runners[mode],
                         _prepare(runners[mode], mode, batch_size, decode)) for mode, batch_size in keys]
            status("profiling kernels")
            _profile(runners, rows, config, decode, environment)
        finally:
            for runner in runners.values():
                runner.close()
    return BenchResult(rows, environment, {**asdict(config), "toy_config": _toy_dict(toy)})


def _split(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` near-equal positive counts."""
    return [total // parts + (i < total % parts) for i in range(parts)]


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
    prepared = runner.prepare_step({f"req{i}": [decode[i]] for i in range(batch_size)})
    desc = prepared.descriptor
    if desc.cg_mode is not CUDAGraphMode.parse(mode) or desc.num_tokens != batch_size:
        raise ConfigError(f"batch {batch_size} dispatched to {desc}, not to an unpadded {mode.upper()} step; "
                          "the benchmark captures exactly the batch sizes it measures")
    return prepared


@dataclass
class _Samples:
    """Per-step microseconds: device time (CUDA events; the host clock on the CPU), host time until
    the result is ready, and host time until ``execute`` returned (launching, before waiting)."""

    device: list[float] = field(default_factory=list)
    host: list[float] = field(default_factory=list)
    enqueue: list[float] = field(default_factory=list)

    def extend(self, other: _Samples) -> None:
        self.device += other.device
        self.host += other.host
        self.enqueue += other.enqueue


def _time_steps(runner: ModelRunner, prepared: PreparedStep, rotations: torch.Tensor, warmup: int,
                repeats: int) -> _Samples:
    """Time ``repeats`` steps of ``prepared``, each from an idle device, after ``warmup`` untimed ones.

    Starting idle means the device time of an eager step includes the gaps in which the GPU waits
    for the CPU to launch: that is the cost being measured.
    """
    cuda = runner.device.type == "cuda"
    input_ids = runner.input_buffers.input_ids[: prepared.num_tokens]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(runner.device)

    for i in range(warmup):
        input_ids.copy_(rotations[i % len(rotations), : prepared.num_tokens])
        runner.execute(prepared)
    sync()
    out = _Samples()
    events: list[tuple[Any, Any]] = []
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # a collection inside a timed step is noise, not engine cost
    try:
        for i in range(repeats):
            input_ids.copy_(rotations[i % len(rotations), : prepared.num_tokens])  # untimed
            sync()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter_ns()
            if cuda:
                start.record()
            runner.execute(prepared)
            if cuda:
                end.record()
            t1 = time.perf_counter_ns()
            sync()
            out.host.append((time.perf_counter_ns() - t0) / 1e3)
            out.enqueue.append((t1 - t0) / 1e3)
            if cuda:
                events.append((start, end))
    finally:
        if gc_was_enabled:
            gc.enable()
    out.device = [start.elapsed_time(end) * 1e3 for start, end in events] if cuda else list(out.host)
    return out


def _count_launches(runner: ModelRunner, prepared: PreparedStep) -> tuple[int, int, int, int]:
    """(launches, kernels, graph segments, eager breaks) of one step, counted structurally.

    For a graph this opens up ``CapturedGraph.replay``'s loop: each segment is one launch, and the
    ops of each eager break are counted as they really run.
    """
    desc = prepared.descriptor
    if desc.cg_mode is CUDAGraphMode.NONE:
        with OpCounter() as counter:
            runner.execute(prepared)
        return counter.count, counter.count, 0, 0
    assert runner.cudagraph_manager is not None
    graph = runner.cudagraph_manager.graphs[desc].graph
    eager_ops = 0
    with torch.inference_mode(), set_forward_context(prepared.attn_metadata, desc.cg_mode, desc):
        for step in graph.steps:
            if isinstance(step, GraphSegment):
                step.replay()
                continue
            with OpCounter() as counter:
                step.replay()
            eager_ops += counter.count
    return graph.num_segments + eager_ops, graph.num_ops + eager_ops, graph.num_segments, graph.num_eager_breaks


def _row(mode: str, batch_size: int, backend: str, samples: _Samples, config: BenchConfig, runner: ModelRunner,
         prepared: PreparedStep) -> dict[str, Any]:
    launches, kernels, segments, breaks = _count_launches(runner, prepared)
    # FULL froze capture-safe metadata (the model's whole key range); the others read the live one.
    key_range = config.max_model_len if mode == "full" else prepared.input_batch.max_seq_len
    median, p10, p90 = _stats(samples.device)
    host_median, host_p10, host_p90 = _stats(samples.host)
    return {"mode": mode, "batch_size": batch_size, "median_us": median, "p10_us": p10, "p90_us": p90,
            "kernel_floor_us": math.nan, "launches": launches, "backend": backend,
            "host_median_us": host_median, "host_p10_us": host_p10, "host_p90_us": host_p90,
            "enqueue_median_us": _stats(samples.enqueue)[0], "kernel_span_us": math.nan, "kernels": kernels,
            "counted_launches": launches, "graph_segments": segments, "eager_breaks": breaks,
            "attn_key_range": key_range, "repeats": len(samples.device)}


def _stats(values: Sequence[float]) -> tuple[float, float, float]:
    """Median, 10th and 90th percentile, to the nanosecond (as saved, so a result equals its reload)."""
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return round(statistics.median(values), 3), round(deciles[0], 3), round(deciles[-1], 3)


# ----------------------------------------------------------------------------------- profiling
def _profile(runners: dict[str, ModelRunner], rows: list[dict[str, Any]], config: BenchConfig,
             decode: list[int], environment: dict[str, Any]) -> None:
    """Fill ``kernel_floor_us`` (and, on a GPU, ``launches`` and ``kernels``) from one profiler session.

    Each profiled step runs inside a named range and ends with a synchronisation, so every device
    event lies inside its step's range on the shared timeline: events are attributed by their
    midpoint. Per-step values are medians over ``profile_steps`` steps.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = environment["backend"] == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        for mode, runner in runners.items():
            for batch_size in config.batch_sizes:
                prepared = _prepare(runner, mode, batch_size, decode)
                runner.execute(prepared)  # re-prepared buffers: the first step after is not measured
                for k in range(config.profile_steps):
                    with record_function(f"{_MARKER}{mode}/{batch_size}/{k}"):
                        runner.execute(prepared)
                        if cuda:
                            torch.cuda.synchronize(runner.device)
    windows, diagnostics = _attribute(prof.events(), cuda)
    unseen = 0
    for row in rows:
        per_step = [windows.get((row["mode"], row["batch_size"], k), _Window()) for k in range(config.profile_steps)]
        if cuda and not all(w.events for w in per_step):
            unseen += 1  # keep the structural counts; a zero floor would be a lie
            continue
        row["kernel_floor_us"] = round(statistics.median(w.time_us for w in per_step), 3)
        row["kernel_span_us"] = round(statistics.median(w.last_end - w.first_start for w in per_step), 3)
        if cuda:
            row["kernels"] = round(statistics.median(w.events for w in per_step))
            row["launches"] = round(statistics.median(len(w.ids) for w in per_step))
    if cuda:
        environment["profiler_device_events"] = diagnostics
        if unseen:
            environment["profiler_note"] = (f"the profiler saw no GPU activity in {unseen} row(s): their "
                                            "kernel_floor_us is nan, launches and kernels are the structural counts")


@dataclass
class _Window:
    """What the profiler saw inside one profiled step."""

    time_us: float = 0.0
    events: int = 0
    ids: set[int] = field(default_factory=set)  # CUDA correlation ids: one per host launch
    # First start to last end: the floor plus the device's idle gaps between kernels.
    first_start: float = math.inf
    last_end: float = -math.inf


_WORK_ACTIVITIES = ("kernel", "gpu_memcpy", "gpu_memset")


def _attribute(events: Any, cuda: bool) -> tuple[dict[tuple[str, int, int], _Window], dict[str, Any]]:
    """Sort the profiler's events into the profiled steps, by midpoint; also say what was seen."""
    markers = [(e.name[len(_MARKER):].split("/"), e.time_range) for e in events
               if e.name.startswith(_MARKER) and e.device_type == torch.autograd.DeviceType.CPU]
    if cuda:  # GPU work, not the GPU-side copies of our named ranges
        device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                  and not e.name.startswith(_MARKER)]
        kinds = Counter(str(getattr(e, "activity_type", None)) for e in device)
        if any(k in kinds for k in _WORK_ACTIVITIES):  # torch labels activities: keep kernels, copies, fills
            device = [e for e in device if getattr(e, "activity_type", None) in _WORK_ACTIVITIES]
        chosen = device
    else:  # no device: the time spent inside aten ops
        kinds = Counter()
        chosen = [e for e in events if e.name.startswith("aten::")]
    spans = sorted((r.start, r.end, (mode, int(bs), int(k))) for (mode, bs, k), r in markers)
    starts = [span[0] for span in spans]
    windows = {span[2]: _Window() for span in spans}
    attributed = 0
    for e in chosen:
        t = (e.time_range.start + e.time_range.end) / 2
        i = bisect_right(starts, t) - 1
        if i < 0 or t > spans[i][1]:
            continue
        window = windows[spans[i][2]]
        window.time_us += e.time_range.elapsed_us() if cuda else e.self_cpu_time_total
        window.events += 1
        window.ids.add(e.id)
        window.first_start = min(window.first_start, e.time_range.start)
        window.last_end = max(window.last_end, e.time_range.end)
        attributed += 1
    return windows, {"activity_types": dict(kinds), "used": len(chosen), "attributed_to_steps": attributed}


def _toy_dict(toy: ToyConfig) -> dict[str, Any]:
    return {f.name: getattr(toy, f.name) for f in fields(toy) if f.init}


@contextmanager
def _cpu_threads(count: int | None) -> Iterator[None]:
    """One intra-op thread on the CPU, as ``torch.utils.benchmark.Timer`` defaults to: on a shared
    machine a parallel op otherwise waits for a descheduled sibling thread, and times explode."""
    if count is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def _progress_bar(total: int, enabled: bool) -> Iterator[Callable[..., None]]:
    """``status(text, advance=0)``: a tqdm bar over the measurements, or nothing when disabled."""
    if not enabled:
        yield lambda text=None, advance=0: None
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc="bench", unit="size") as bar:
        def status(text: str | None = None, advance: int = 0) -> None:
            if text is not None:
                bar.set_postfix_str(text)
            if advance:
                bar.update(advance)

        yield status
