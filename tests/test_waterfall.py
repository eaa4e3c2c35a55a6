"""Notebook 05's waterfall: the steps from eager to the roofline, read from recorded runs, exactly."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from cglab.bench import BenchResult  # noqa: E402
from cglab.lab.roofline import plot_waterfall, waterfall  # noqa: E402


def _run(medians: dict[str, float], batch_size: int = 1) -> BenchResult:
    rows = [{"mode": m, "batch_size": batch_size, "median_us": us} for m, us in medians.items()]
    return BenchResult(rows, {"roofline_us": 40.0}, {})


def test_the_waterfall_descends_from_eager_through_each_lever_to_the_roofline() -> None:
    base = _run({"none": 2000.0, "full": 400.0, "compiled_full": 350.0, "reduce_overhead": 420.0})
    levers = {"fused linear": _run({"compiled_full": 250.0}), "not at this size": _run({"compiled_full": 1.0}, 8)}
    steps = waterfall(base, levers, 1)
    assert steps == [
        ("eager (NONE)", 2000.0),
        ("FULL", 400.0),
        ("compiled FULL", 350.0),
        ("+ fused linear", 250.0),
        ('torch.compile "reduce-overhead"', 420.0),
        ("roofline", 40.0),
    ]
    fig = plot_waterfall(steps, "title")
    bars = fig.axes[0].patches
    assert [b.get_width() for b in bars] == [us for _, us in steps]
    assert fig.axes[0].texts[3].get_text() == "250 µs (6.2x)"  # 250 over the roofline's 40
