"""The profiler's view of a step: its kernel floor, kernels and launches. Each profiled step runs in a
named range and ends with a synchronisation, so each event is its step's by its midpoint."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from bisect import bisect_right
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["MARKER", "Window", "attribute", "profile_steps", "without_profiler_log_lines"]

MARKER = "cglab.bench/"
_WORK_ACTIVITIES = ("kernel", "gpu_memcpy", "gpu_memset")


@contextmanager
def without_profiler_log_lines() -> Iterator[None]:
    """Drop the ``USDT:`` lines torch's profiler writes to file descriptor 2 as it starts and stops (they
    would land in the CLI's stderr and a notebook's output), and pass every other line through."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        sys.stderr.flush()
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            os.write(2, b"".join(line for line in capture.readlines() if not line.startswith(b"USDT:")))


@dataclass
class Window:
    """What the profiler saw inside one profiled step."""

    time_us: float = 0.0
    events: int = 0
    ids: set[int] = field(default_factory=set)  # CUDA correlation ids: one per host launch
    kernels: list[tuple[str, float, float]] = field(default_factory=list)  # GPU work: (name, start us, end us)


def profile_steps(
    prepare: Callable[[str, int], Callable[[], None]], rows: list[dict[str, Any]], profile_steps: int, cuda: bool
) -> dict[tuple[str, int, int], Window]:
    """Fill each row's ``kernel_floor_us`` (on a GPU also ``launches`` and ``kernels``): the median over
    ``profile_steps`` profiled runs of the function ``prepare(mode, batch_size)`` returns, after one
    unprofiled run. A row in which a GPU's profiler saw nothing keeps nan and the structural counts.
    Returns what each profiled step saw, keyed ``(mode, batch_size, k)``."""
    from torch.profiler import ProfilerActivity, profile, record_function

    prof = profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])])
    with without_profiler_log_lines():
        prof.start()
    try:
        for row in rows:
            mode, batch_size = row["mode"], row["batch_size"]
            run = prepare(mode, batch_size)
            run()
            for k in range(profile_steps):
                with record_function(f"{MARKER}{mode}/{batch_size}/{k}"):
                    run()
                    if cuda:
                        torch.cuda.synchronize()
    finally:
        with without_profiler_log_lines():
            prof.stop()
    windows = attribute(prof.events(), cuda)
    for row in rows:
        per_step = [windows.get((row["mode"], row["batch_size"], k), Window()) for k in range(profile_steps)]
        if cuda and not all(w.events for w in per_step):
            continue  # a zero floor would be a lie
        row["kernel_floor_us"] = round(statistics.median(w.time_us for w in per_step), 3)
        if cuda:
            row["kernels"] = round(statistics.median(w.events for w in per_step))
            row["launches"] = round(statistics.median(len(w.ids) for w in per_step))
    return windows


def attribute(events: Any, cuda: bool) -> dict[tuple[str, int, int], Window]:
    """Sort the profiler's events into the profiled steps, by midpoint: on a GPU its device work (not the
    GPU-side copies of our named ranges); on a CPU the aten ops' own time."""
    spans = sorted(
        (e.time_range.start, e.time_range.end, (mode, int(bs), int(k)))
        for e in events
        if e.name.startswith(MARKER) and e.device_type == torch.autograd.DeviceType.CPU
        for mode, bs, k in [e.name[len(MARKER) :].split("/")]
    )
    if cuda:  # torch 2.13 labels activities (keep kernels, copies, fills); 2.11 leaves them None
        chosen = [
            e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(MARKER)
        ]
        if any(getattr(e, "activity_type", None) in _WORK_ACTIVITIES for e in chosen):
            chosen = [e for e in chosen if e.activity_type in _WORK_ACTIVITIES]
    else:
        chosen = [e for e in events if e.name.startswith("aten::")]
    starts = [span[0] for span in spans]
    windows = {span[2]: Window() for span in spans}
    for e in chosen:
        t = (e.time_range.start + e.time_range.end) / 2
        i = bisect_right(starts, t) - 1
        if i < 0 or t > spans[i][1]:
            continue
        window = windows[spans[i][2]]
        window.time_us += e.time_range.elapsed_us() if cuda else e.self_cpu_time_total
        window.events += 1
        window.ids.add(e.id)
        if cuda:
            window.kernels.append((e.name, e.time_range.start, e.time_range.end))
    return windows
