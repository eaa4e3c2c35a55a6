"""Figures of benchmark results and speculative decoding runs, one question per Axes."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.transforms import ScaledTranslation

from cglab.bench import BENCH_MODES, BenchResult
from cglab.errors import ConfigError
from cglab.repro import ReproResult

SIM_LABEL = "CPU simulator: semantics only, not GPU speed"
# One colour per benchmark mode in every picture. None is the legacy path's red or the fixed path's blue
# (path_colors), so red and blue always name a capture path: PIECEWISE purples, FULL greens, the compiled
# flavour darker, eager grey and the torch.compile peer gold.
MODE_COLORS = {
    "none": "#7f7f7f",
    "piecewise": "#9467bd",
    "compiled_piecewise": "#4a2a78",
    "full": "#4daf4a",
    "compiled_full": "#0b4f12",
    "reduce_overhead": "#b8860b",
}
# Each mode's label, colour and marker (in MODE_COLORS' order: circle, square, diamond, triangles, cross).
_STYLE = {mode: (BENCH_MODES[mode].label, MODE_COLORS[mode], marker) for mode, marker in zip(MODE_COLORS, "osD^vx")}
_FLOOR_MODES = ("full", "compiled_full")  # one launch a step: what is left above their floors is inside the graph
_ROW_TOP_PT, _ROW_STEP_PT = 4, 10  # the kernel floor's label rows: below the top edge, apart (7 pt text)
# The share of the axes height kept free of data per label row: enough for the rows on axes 1.5 inches tall.
_ROW_BAND = 0.15
_LEGEND_BELOW = {"loc": "upper center", "bbox_to_anchor": (0.5, 0), "ncol": 2, "fontsize": 8, "frameon": False}


def plot_latency(result: BenchResult, ax: Axes | None = None) -> Axes:
    """Median decode-step latency per mode against batch size, with the p10-p90 band."""
    ax = _axes(ax)
    for mode in result.modes:
        _median_band(ax, result, mode, _STYLE[mode][0])
    _roofline(ax, result)
    ax.set_ylabel("step latency, µs (median; band: p10-p90)")
    ax.set_ylim(bottom=0)
    return _finish(ax, result, "Decode-step latency", _all_sizes(result))


def plot_speedup(result: BenchResult, ax: Axes | None = None) -> Axes:
    """Eager latency divided by each graph mode's, per batch size; the launch counts explain it."""
    ax = _axes(ax)
    if "none" not in result.modes:
        return _missing(ax, result, "Speed-up over eager", "needs the eager mode (none) in the run")
    eager, first = _by_size(result, "none", "median_us"), _all_sizes(result)[0]
    for mode in (m for m in result.modes if m != "none"):
        label, color, marker = _STYLE[mode]
        sizes, median = result.series(mode, "median_us")
        ratio = [eager[s] / m for s, m in zip(sizes, median)]
        launches = _launches(_by_size(result, mode, "launches")[first]) if sizes[0] == first else ""
        at_first = f": {ratio[0]:.1f}x, {launches}" if launches else ""
        ax.plot(sizes, ratio, marker=marker, color=color, label=label + at_first)
    ax.axhline(1.0, color="gray", linewidth=1, linestyle=":")
    ax.set_ylabel("speed-up over eager (median latency ratio)")
    ax.set_ylim(bottom=0)
    eager_launches = _launches(_by_size(result, "none", "launches").get(first, math.nan))
    legend_title = f"at batch {first} (eager: {eager_launches})"
    return _finish(ax, result, "Speed-up over eager", _all_sizes(result), legend_title=legend_title)


def plot_kernel_floor(result: BenchResult, ax: Axes | None = None) -> Axes:
    """FULL (and compiled FULL) replay latency against its kernel floor (launching for free), and the roofline."""
    ax = _axes(ax)
    title = "One-launch replays against the kernel floor"
    modes = [m for m in _FLOOR_MODES if m in result.modes]
    if not modes:
        return _missing(ax, result, title, "needs the FULL mode in the run")
    floors = {m: result.series(m, "kernel_floor_us")[1] for m in modes}
    if all(math.isnan(f) for floor in floors.values() for f in floor):
        return _missing(ax, result, title, "no kernel floor was recorded")
    what = "summed aten op CPU time, under the profiler" if result.backend == "sim" else "summed kernel time"
    highest = 0.0
    for row, mode in enumerate(modes):
        label, color, _ = _STYLE[mode]
        sizes, median, p90 = _median_band(ax, result, mode, f"{label} replay (median)")
        ax.plot(sizes, floors[mode], color=color, linestyle="--", marker=".", label=f"{label} kernel floor ({what})")
        highest = max([highest, *(v for v in (*median, *p90, *floors[mode]) if not math.isnan(v))])
        # One row of labels per mode in the band above the data, one per batch size: rows a fixed
        # distance apart never collide, and the band is kept free of curves by the y limit below.
        down = -_ROW_TOP_PT - _ROW_STEP_PT * row
        text = {"textcoords": "offset points", "va": "top", "fontsize": 7, "color": color}
        for s, m, f in zip(sizes, median, floors[mode]):
            if not math.isnan(f) and f > 0:
                over = f"{(m / f - 1) * 100:+.0f}%"
                ax.annotate(over, (s, 1), xycoords=ax.get_xaxis_transform(), xytext=(0, down), ha="center", **text)
        ax.annotate(label, (1, 1), xycoords="axes fraction", xytext=(4, down), ha="left", **text)
    _roofline(ax, result)
    ax.set_ylabel("µs per step (top rows: replay over its floor)")
    ax.set_ylim(0, highest / (1 - _ROW_BAND * len(modes)))
    return _finish(ax, result, title, _all_sizes(result))


def plot_ladder(result: BenchResult, batch_size: int | None = None, ax: Axes | None = None) -> Axes:
    """One bar per mode at one batch size (default: the smallest), with its launches, kernels and floor."""
    from cglab.bench.report import ladder

    ax = _axes(ax)
    batch_size = min(_all_sizes(result)) if batch_size is None else batch_size
    rows = ladder(result, batch_size)
    title = f"The ladder at batch {batch_size}"
    if not rows:
        return _missing(ax, result, title, f"no rows at batch {batch_size}")
    x = range(len(rows))
    ax.bar(x, [r["median_us"] for r in rows], color=[_STYLE[r["mode"]][1] for r in rows], alpha=0.8)
    for i, r in enumerate(rows):
        if not math.isnan(r["kernel_floor_us"]):
            label = "kernel floor" if i == 0 else None
            ax.hlines(r["kernel_floor_us"], i - 0.4, i + 0.4, color="black", linestyle="--", linewidth=1, label=label)
        text = f"{r['median_us']:.0f} µs\n{_count(r['launches'])} launches\n{_count(r['kernels'])} kernels"
        ax.annotate(text, (i, r["median_us"]), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    _roofline(ax, result)
    ax.set_xticks(list(x), [r["label"].replace(" ", "\n", 1) for r in rows], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(top=max(r["median_us"] for r in rows) * 6)  # room for the labels above the bars, and the legend
    ax.set_ylabel("step latency, µs (median, log scale)")
    ax.grid(True, axis="y", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper right")
    return _title(ax, result, title)


def plot_kernel_sets(before: BenchResult, after: BenchResult, batch_size: int | None = None) -> Figure:
    """The ladders of two runs side by side on one latency scale, each titled with its kernel set."""
    from cglab.bench.report import KERNEL_SET_LABELS, kernel_set

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True, layout="constrained")
    tallest = 0.0
    for ax, result in zip(axes, (before, after)):
        size = min(_all_sizes(result)) if batch_size is None else batch_size
        plot_ladder(result, size, ax)
        date = result.environment.get("date", "")[:10]
        _title(ax, result, f"{KERNEL_SET_LABELS[kernel_set(result)]}, batch {size}" + (f" ({date})" if date else ""))
        tallest = max([tallest] + [r["median_us"] for r in result.rows if r["batch_size"] == size])
    axes[0].set_ylim(top=tallest * 6)  # one scale for both, with room above the tallest bar for its labels
    return fig


def plot_piecewise_break_cost(result: BenchResult, ax: Axes | None = None) -> Axes:
    """What each eager break costs: (PIECEWISE - FULL) median latency divided by the breaks per step."""
    ax = _axes(ax)
    title = "PIECEWISE cost per eager break"
    if not {"piecewise", "full"} <= set(result.modes):
        return _missing(ax, result, title, "needs the PIECEWISE and FULL modes in the run")
    full = _by_size(result, "full", "median_us")
    rows = sorted(
        (r for r in result.rows if r["mode"] == "piecewise" and r["batch_size"] in full), key=lambda r: r["batch_size"]
    )
    breaks = [r.get("eager_breaks") or 0 for r in rows]
    if not rows or not all(breaks):
        return _missing(ax, result, title, "the PIECEWISE graphs have no eager break")
    sizes = [r["batch_size"] for r in rows]
    cost = [(r["median_us"] - full[r["batch_size"]]) / b for r, b in zip(rows, breaks)]
    _, color, marker = _STYLE["piecewise"]
    ax.plot(sizes, cost, marker=marker, color=color, label="(PIECEWISE - FULL) / eager breaks")
    ax.axhline(0.0, color="gray", linewidth=1, linestyle=":")
    first = rows[0]
    note = (
        f"{breaks[0]} eager breaks, {_count(first['launches'])} launches per PIECEWISE step "
        f"vs {_count(_by_size(result, 'full', 'launches')[sizes[0]])} for FULL (batch {sizes[0]})"
    )
    if "attn_key_range" in first:  # FULL reads its capture-time key range: more attention work at large batch
        full_keys = _by_size(result, "full", "attn_key_range")[sizes[0]]
        note += f"\nattention key range: FULL {_count(full_keys)} keys, PIECEWISE {_count(first['attn_key_range'])}"
    ax.set_ylabel("extra µs per eager break (median)")
    return _finish(ax, result, title, sizes, legend_title=note)


def plot_overview(result: BenchResult) -> Figure:
    """The four figures in a 2x2 grid."""
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5), layout="constrained")
    plot_latency(result, axes[0, 0])
    plot_speedup(result, axes[0, 1])
    plot_kernel_floor(result, axes[1, 0])
    plot_piecewise_break_cost(result, axes[1, 1])
    fig.suptitle(_on_device(f"cglab bench: {_model(result)}", result, ", "))
    return fig


_PATH_COLORS = {True: "tab:red", False: "tab:blue"}  # legacy capture, fixed capture
_SPARE_COLORS = ("tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")


def path_colors(results: Iterable[ReproResult]) -> list[str]:
    """One colour per run: legacy capture red, fixed capture blue, a second run of a kind the next spare."""
    colors: list[str] = []
    for result in results:
        color = _PATH_COLORS[bool(result.legacy_skip_attn)]
        if color in colors:
            color = next(c for c in _SPARE_COLORS if c not in colors)
        colors.append(color)
    return colors


def plot_tokens_per_step(results: Mapping[str, ReproResult], ax: Axes | None = None) -> Axes:
    """Tokens a request gains per speculative step, per run, against the eager reference and 1 and ``K + 1``."""
    if not results or any(not r.tokens_per_step for r in results.values()):
        raise ConfigError("plot_tokens_per_step needs speculative decoding results: run_spec_repro(...) for each run")
    ks = {r.num_speculative_tokens for r in results.values()}
    if len(ks) != 1:
        raise ConfigError(f"the runs have different numbers of speculative tokens ({sorted(ks)}); plot them apart")
    (k,) = ks
    ax = _axes(ax)
    for color, (label, result) in zip(path_colors(results.values()), results.items()):
        tokens = result.tokens_per_step
        label += f": {sum(tokens) / len(tokens):.2f} tokens/step, acceptance {result.acceptance_rate:.2f}"
        ax.plot(range(1, len(tokens) + 1), tokens, marker="o", color=color, label=label)
    # On top, dashed: a run that matches the eager drafter lies right under it.
    reference = next(iter(results.values())).reference_tokens_per_step
    label = f"eager drafter (reference): {sum(reference) / len(reference):.2f} tokens/step"
    ax.plot(range(1, len(reference) + 1), reference, color="black", linestyle="--", marker=".", zorder=3, label=label)
    for bound, text in ((1, "1: no speculation"), (k + 1, f"{k + 1}: every draft accepted")):
        ax.axhline(bound, color="gray", linewidth=1, linestyle=":")
        xy = (len(reference), bound)
        ax.annotate(text, xy, textcoords="offset points", xytext=(0, 3), ha="right", fontsize=7, color="gray")
    ax.set_ylim(0, k + 1.6)
    ax.set(xlabel="speculative step", ylabel="tokens per request per step (mean over the batch)")
    ax.set_title(f"Tokens per step, {k} speculative tokens, greedy verification", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    return ax


# ----------------------------------------------------------------------------------- helpers
def _axes(ax: Axes | None) -> Axes:
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4.5), layout="constrained")
    return ax


def _finish(ax: Axes, result: BenchResult, what: str, sizes: list[int], legend_title: str | None = None) -> Axes:
    ax.set_xscale("log", base=2)
    if sizes:
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
    ax.set_xlabel("batch size (requests, one decode token each)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        _legend_below(ax, legend_title)
    return _title(ax, result, what)


def _legend_below(ax: Axes, title: str | None) -> None:
    """The legend under the x-axis label, where it covers no curve; constrained layout makes room."""
    # The drop is counted in points from the tick and label fonts, so it clears them at any axes size.
    rc = plt.rcParams
    fonts = sum(FontProperties(size=rc[key]).get_size_in_points() for key in ("xtick.labelsize", "axes.labelsize"))
    # The ticks, their labels, the axis label, and a gap.
    drop = rc["xtick.major.size"] + rc["xtick.major.pad"] + rc["axes.labelpad"] + 1.2 * fonts + 4
    below = ax.transAxes + ScaledTranslation(0, -drop / 72, ax.figure.dpi_scale_trans)
    ax.legend(bbox_transform=below, title=title, title_fontsize=8, alignment="left", **_LEGEND_BELOW)


def _on_device(what: str, result: BenchResult, sep: str = "\n") -> str:
    """``what``, the device's name and, on the simulator, that its times say nothing of a GPU's: every title."""
    return f"{what}{sep}{result.device_name}" + (f"\n{SIM_LABEL}" if result.backend == "sim" else "")


def _title(ax: Axes, result: BenchResult, what: str) -> Axes:
    ax.set_title(_on_device(what, result), fontsize=10)
    return ax


def _median_band(ax: Axes, result: BenchResult, mode: str, label: str) -> tuple[list[int], list[float], list[float]]:
    """The median latency of ``mode`` with its p10-p90 band; the sizes, medians and p90s drawn."""
    _, color, marker = _STYLE[mode]
    sizes, median = result.series(mode, "median_us")
    p90 = result.series(mode, "p90_us")[1]
    ax.plot(sizes, median, marker=marker, color=color, label=label)
    ax.fill_between(sizes, result.series(mode, "p10_us")[1], p90, color=color, alpha=0.25, linewidth=0)
    return sizes, median, p90


def _missing(ax: Axes, result: BenchResult, what: str, why: str) -> Axes:
    ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", color="gray")
    ax.set(xticks=[], yticks=[])
    return _title(ax, result, what)


def _roofline(ax: Axes, result: BenchResult) -> None:
    """The weights read once per step at the measured bandwidth, if the result recorded it."""
    env = result.environment
    if env.get("roofline_us") is None:
        return
    label = (
        f"roofline: {env['weight_bytes'] / 1e6:.3g} MB of weights at "
        f"{env['memory_bandwidth_gb_s']:.0f} GB/s ({env['roofline_us']:.3g} µs)"
    )
    ax.axhline(env["roofline_us"], color="gray", linestyle="-.", linewidth=1.2, label=label)


def _by_size(result: BenchResult, mode: str, column: str) -> dict[int, float]:
    return dict(zip(*result.series(mode, column)))


def _all_sizes(result: BenchResult) -> list[int]:
    return sorted({r["batch_size"] for r in result.rows})


def _count(value: float) -> str:
    return "?" if math.isnan(value) else str(int(value))


def _launches(value: float) -> str:
    return "1 launch" if value == 1 else f"{_count(value)} launches"


def _model(result: BenchResult) -> str:
    c = result.config
    if not {"layers", "hidden_size", "dtype"} <= set(c):
        return "toy model"
    return f"{len(c['layers'].split(','))} layers, hidden {c['hidden_size']}, {c['dtype']}"
