"""Timing decode steps (CUDA events on a GPU, the host clock on the CPU) and the statistics the results
report: median, p10, p90."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cglab.runner import ModelRunner, PreparedStep

__all__ = ["Samples", "split", "stats", "time_steps"]


@dataclass
class Samples:
    """Per-step microseconds: device time (CUDA events; the host clock on the CPU), and host time until
    ``execute`` returned (launching, before waiting)."""

    device: list[float] = field(default_factory=list)
    enqueue: list[float] = field(default_factory=list)

    def extend(self, other: Samples) -> None:
        self.device += other.device
        self.enqueue += other.enqueue


def stats(values: Sequence[float]) -> tuple[float, float, float]:
    """Median (one descheduled step drags a mean far away), 10th and 90th percentile, to the nanosecond."""
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return round(statistics.median(values), 3), round(deciles[0], 3), round(deciles[-1], 3)


def split(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` near-equal positive counts."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def time_steps(
    runner: ModelRunner, prepared: PreparedStep, rotations: torch.Tensor, warmup: int, repeats: int
) -> Samples:
    """Time ``repeats`` steps of ``prepared`` after ``warmup`` untimed ones, each from an idle device (so an
    eager step's device time includes the GPU's waits for launches), with new token ids each (untimed)."""
    cuda = runner.device.type == "cuda"
    input_ids = runner.input_buffers.input_ids[: prepared.num_tokens]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(runner.device)

    for i in range(warmup):
        input_ids.copy_(rotations[i % len(rotations), : prepared.num_tokens])
        runner.execute(prepared)
    sync()
    out = Samples()
    events: list[tuple[Any, Any]] = []
    gc_was_enabled = gc.isenabled()
    # The young generations only: they hold what the warm-up left. A full collection walks every object in
    # the process (about 0.5 s a row once dynamo has traced a few models), and disabling is what keeps
    # collections out of the timed steps.
    gc.collect(1)
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
            out.enqueue.append((t1 - t0) / 1e3)
            if cuda:
                events.append((start, end))
            else:
                out.device.append((time.perf_counter_ns() - t0) / 1e3)
    finally:
        if gc_was_enabled:
            gc.enable()
    out.device += [start.elapsed_time(end) * 1e3 for start, end in events]
    return out
