"""What graphs cannot remove: a decode step from eager to the roofline as a waterfall, one bar per
lever, from recorded benchmark runs (``data/``), which a CPU reads as well as a GPU."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from cglab.bench import BenchResult
from cglab.bench.modes import BENCH_MODES
from cglab.lab.plots import MODE_COLORS

__all__ = ["plot_waterfall", "waterfall"]


def waterfall(base: BenchResult, levers: dict[str, BenchResult], batch_size: int = 1) -> list[tuple[str, float]]:
    """``(label, median us)`` at ``batch_size``: eager, FULL and compiled FULL of ``base``, compiled FULL of
    each lever's run (in order, each on top of the ones before it), the peer, and the roofline."""
    rows = {r["mode"]: r["median_us"] for r in base.rows if r["batch_size"] == batch_size}
    steps = [(BENCH_MODES[m].label, rows[m]) for m in ("none", "full", "compiled_full") if m in rows]
    for label, run in levers.items():
        found = [r["median_us"] for r in run.rows if (r["mode"], r["batch_size"]) == ("compiled_full", batch_size)]
        steps += [(f"+ {label}", found[0])] if found else []
    steps += [(BENCH_MODES["reduce_overhead"].label, rows["reduce_overhead"])] if "reduce_overhead" in rows else []
    return [*steps, ("roofline", base.environment["roofline_us"])]


def plot_waterfall(steps: list[tuple[str, float]], title: str) -> Figure:
    """One horizontal bar per step, log-scaled (eager is tens of times the roofline), each with its µs and
    its multiple of the roofline (the last step)."""
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(steps) + 1))
    labels, values = zip(*steps)
    colors = {BENCH_MODES[m].label: c for m, c in MODE_COLORS.items()} | {"roofline": "black"}
    ax.barh(range(len(steps)), values, color=[colors.get(label, "#1f78b4") for label in labels])  # a lever: blue
    for i, value in enumerate(values):
        ax.text(value * 1.05, i, f"{value:.0f} µs ({value / values[-1]:.1f}x)", va="center", fontsize=8)
    ax.set_yticks(range(len(steps)), labels)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(values[-1] / 2, max(values) * 4)
    ax.set_xlabel("decode step, µs (median; log scale)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
