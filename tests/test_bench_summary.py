"""How the benchmark summarises what it measured, on known numbers: the timed samples' median and
deciles, and the kernel floor summed from (fake) profiler records, exact to the value."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch

from cglab.bench import profiling
from cglab.bench.profiling import MARKER, Window, attribute, profile_steps
from cglab.bench.timing import split, stats

CPU, CUDA = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        ([4.0, 100.0, 1.0, 3.0, 2.0], (3.0, 1.4, 61.6)),  # one slow outlier: the mean would be 22
        ([10.0, 1.0, 4.0, 2.0], (3.0, 1.3, 8.2)),  # even count: the middle two averaged (the mean is 4.25)
        ([7.0] * 5, (7.0, 7.0, 7.0)),
        ([0.1234567, 0.1234567, 1.0], (0.123, 0.123, 0.825)),  # rounded to the nanosecond
    ],
)
def test_stats_are_median_and_inclusive_deciles(samples: list[float], expected: tuple[float, float, float]) -> None:
    assert stats(samples) == expected


@pytest.mark.parametrize(
    ("total", "parts", "expected"),
    [(10, 1, [10]), (10, 3, [4, 3, 3]), (300, 10, [30] * 10), (7, 7, [1] * 7), (11, 4, [3, 3, 3, 2])],
)
def test_split_gives_every_repeat_once(total: int, parts: int, expected: list[int]) -> None:
    """The timing rounds take exactly ``--repeats`` samples: one too many would be recorded silently."""
    assert split(total, parts) == expected and sum(expected) == total


@dataclass
class _Range:
    start: float
    end: float

    def elapsed_us(self) -> float:
        return self.end - self.start


@dataclass
class _Event:
    """What ``_attribute`` reads of a torch.profiler event."""

    name: str
    start: float
    end: float
    device_type: torch.autograd.DeviceType = CPU
    self_cpu_time_total: float = 0.0
    id: int = 0
    activity_type: str | None = None
    time_range: _Range = field(init=False)

    def __post_init__(self) -> None:
        self.time_range = _Range(self.start, self.end)


def _markers(*spans: tuple[str, float, float]) -> list[_Event]:
    return [_Event(f"{MARKER}{key}", start, end) for key, start, end in spans]


def test_cpu_kernel_floor_is_the_summed_self_time_of_the_steps_aten_ops() -> None:
    events = _markers(("full/1/0", 0, 100), ("full/1/1", 100, 200)) + [
        _Event("aten::mm", 10, 20, self_cpu_time_total=7.5, id=1),
        _Event("aten::add", 30, 40, self_cpu_time_total=2.25, id=2),
        _Event("cglab::short_conv", 10, 60, self_cpu_time_total=50.0, id=3),  # not an aten op
        _Event("aten::mm", 110, 130, self_cpu_time_total=4.0, id=4),
        _Event("aten::mm", 300, 310, self_cpu_time_total=99.0, id=5),  # outside every step
    ]
    windows = attribute(events, cuda=False)
    first, second = windows["full", 1, 0], windows["full", 1, 1]
    assert (first.time_us, first.events, first.ids) == (9.75, 2, {1, 2})
    assert (second.time_us, second.events, second.ids) == (4.0, 1, {4})


@pytest.mark.parametrize(
    ("labelled", "expected"),
    [(True, (6.5, 3, {7, 8})), (False, (46.5, 4, {7, 8, 9}))],
    ids=["torch labels activities", "torch 2.11: no labels, every device event"],
)
def test_cuda_kernel_floor_is_the_summed_kernel_durations(labelled: bool, expected: tuple) -> None:
    events = _markers(("piecewise/2/0", 0, 100)) + [
        _Event(f"{MARKER}piecewise/2/0", 0, 100, device_type=CUDA),  # the range's GPU-side copy
        _Event("gemm", 10, 13, device_type=CUDA, id=7, activity_type="kernel"),  # two kernels of
        _Event("add", 20, 21.5, device_type=CUDA, id=7, activity_type="kernel"),  # one graph launch
        _Event("Memcpy", 40, 42, device_type=CUDA, id=8, activity_type="gpu_memcpy"),
        _Event("overhead", 50, 90, device_type=CUDA, id=9, activity_type="gpu_user_annotation"),
        _Event("aten::mm", 5, 95, self_cpu_time_total=80.0, id=10),  # host time: not device work
    ]
    for event in events if not labelled else ():
        event.activity_type = None
    step = attribute(events, cuda=True)["piecewise", 2, 0]
    assert (step.time_us, step.events, step.ids) == expected


def test_profiled_row_takes_the_median_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-step floors 5, 7 and 100 us: the row's floor is 7 (the mean would be 37.333)."""
    windows = {("full", 1, k): Window(time_us=t, events=1) for k, t in enumerate((5.0, 100.0, 7.0))}
    monkeypatch.setattr(profiling, "attribute", lambda events, cuda: windows)
    runs = []
    row = {"mode": "full", "batch_size": 1, "kernel_floor_us": math.nan}
    profile_steps(lambda mode, batch_size: lambda: runs.append((mode, batch_size)), [row], 3, False)
    assert row["kernel_floor_us"] == 7.0
    assert runs == [("full", 1)] * 4  # one unprofiled run after the prepare, then the three profiled ones
