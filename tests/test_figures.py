"""The figures' layout, checked with matplotlib's own renderer: no two labels overlap, no legend or
label covers a plotted point, and a capture path's colour never stands for a mode."""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from cglab import ModelRunner, ToyConfig
from cglab.batch import CudagraphDispatcher
from cglab.bench import load_results
from cglab.config import CUDAGraphMode
from cglab.lab.draw import draw_caches, draw_padding
from cglab.lab.plots import (
    MODE_COLORS,
    path_colors,
    plot_kernel_floor,
    plot_kernel_sets,
    plot_ladder,
    plot_latency,
    plot_overview,
    plot_piecewise_break_cost,
    plot_speedup,
)
from cglab.lab.widgets import latency_explorer

DATA = Path(__file__).resolve().parents[1] / "data"
LADDERS = ["h200_ladder_8x1024_bf16", "h200_ladder_small_fp32"]  # what notebook 05 plots


def _drawn(fig: Figure) -> Figure:
    """The figure drawn once on an Agg canvas: laid out (constrained layout too), so extents are final."""
    FigureCanvasAgg(fig).draw()
    return fig


def _texts(fig: Figure) -> list[Text]:
    """Every visible, non-empty text; tick labels only for ticks inside the view, which are drawn."""
    tick_labels: set[int] = set()
    shown: list[Text] = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                tick_labels.update((id(tick.label1), id(tick.label2)))
                if low <= tick.get_loc() <= high and tick.get_visible():
                    shown += [label for label in (tick.label1, tick.label2) if label.get_visible()]
    shown += [t for t in fig.findobj(Text) if id(t) not in tick_labels and t.get_visible()]
    return [t for t in shown if t.get_text().strip()]


def _overlapping_texts(fig: Figure) -> list[tuple[str, str]]:
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in _texts(fig)]
    return [(a, b) for i, (a, box_a) in enumerate(boxes) for b, box_b in boxes[i + 1 :] if box_a.overlaps(box_b)]


def _points(fig: Figure) -> np.ndarray:
    """Every plotted line's points (markers, corners), in display coordinates."""
    found = [line.get_transform().transform(line.get_xydata()) for ax in fig.axes for line in ax.get_lines()]
    points = np.concatenate(found) if found else np.empty((0, 2))
    return points[np.isfinite(points).all(axis=1)]


def _covered(box: Bbox, points: np.ndarray) -> int:
    return int(box.count_contains(points))


def _overview(name: str) -> Figure:
    fig = plot_overview(load_results(DATA / name))
    plt.close(fig)  # drawn here, never shown
    return _drawn(fig)


def _explorer(name: str) -> Figure:
    return _drawn(latency_explorer(load_results(DATA / name)))


FIGURES = {"overview": _overview, "latency explorer": _explorer}


@functools.cache
def _figure(figure: str, name: str) -> Figure:
    """``FIGURES[figure](name)``, drawn once for the two layout tests, which only read it."""
    return FIGURES[figure](name)


@pytest.mark.parametrize("name", LADDERS)
@pytest.mark.parametrize("figure", FIGURES)
def test_no_two_labels_overlap(figure: str, name: str) -> None:
    fig = _figure(figure, name)
    assert _overlapping_texts(fig) == []


@pytest.mark.parametrize("name", LADDERS)
@pytest.mark.parametrize("figure", FIGURES)
def test_legends_and_labels_cover_no_plotted_point(figure: str, name: str) -> None:
    fig = _figure(figure, name)
    renderer = fig.canvas.get_renderer()
    points = _points(fig)
    assert len(points) > 40  # every mode at every batch size
    for ax in fig.axes:
        legend = ax.get_legend()
        assert legend is not None and _covered(legend.get_window_extent(renderer), points) == 0
        for text in ax.texts:  # the kernel floor's percentages, and any other label on an axes
            assert _covered(text.get_window_extent(renderer), points) == 0, text.get_text()


def test_the_kernel_floor_labels_one_row_per_mode() -> None:
    ax = plot_kernel_floor(load_results(DATA / LADDERS[0]))
    _drawn(ax.figure)
    plt.close(ax.figure)
    rows = {round(t.get_window_extent().y0) for t in ax.texts if t.get_text().endswith("%")}
    assert len(rows) == 2  # FULL and compiled FULL, each on its own line
    assert sum(t.get_text().endswith("%") for t in ax.texts) == 2 * 9  # one label per batch size


def test_the_kernel_sets_share_one_scale_and_name_their_kernels() -> None:
    before, after = (load_results(DATA / f"h200_ladder_8x1024_bf16{kind}") for kind in ("", "_triton"))
    fig = plot_kernel_sets(before, after)
    plt.close(fig)
    _drawn(fig)
    assert _overlapping_texts(fig) == []
    left, right = fig.axes
    assert left.get_ylim() == right.get_ylim()
    assert left.get_title().startswith("the ops' aten bodies, batch 1 (2026-12-01)")
    assert right.get_title().startswith("the toy's Triton kernels, batch 1 (2026-12-02)")
    for ax in fig.axes:  # every bar's label inside its axes, under the legend
        inside, legend = ax.get_window_extent(), ax.get_legend().get_window_extent()
        labels = [t.get_window_extent() for t in ax.texts]
        assert len(labels) == 6 and all(inside.contains(b.x0, b.y1) and not b.overlaps(legend) for b in labels)


def _distance(a: object, b: object) -> float:
    return float(np.linalg.norm(np.subtract(to_rgb(a), to_rgb(b))))


def _colors(fig: Figure) -> list[object]:
    """The colours a figure's lines, bands, bars and texts are drawn in."""
    found: list[object] = []
    for ax in fig.axes:
        found += [c for line in ax.get_lines() for c in (line.get_color(), line.get_markerfacecolor())]
        found += [tuple(c) for coll in ax.collections for c in coll.get_facecolor()]
        found += [p.get_facecolor() for p in ax.patches]
        found += [t.get_color() for t in ax.texts]
    return [c for c in found if not (isinstance(c, str) and c == "none")]


PATHS = path_colors([SimpleNamespace(legacy_skip_attn=True), SimpleNamespace(legacy_skip_attn=False)])
LATENCY_PLOTS = (plot_latency, plot_speedup, plot_kernel_floor, plot_piecewise_break_cost, plot_ladder)


def test_modes_never_take_a_capture_paths_colour() -> None:
    assert len({to_rgb(c) for c in MODE_COLORS.values()}) == len(MODE_COLORS)
    for color in MODE_COLORS.values():
        assert min(_distance(color, path) for path in PATHS) > 0.3, color
    result = load_results(DATA / LADDERS[0])
    figures = [plot(result).figure for plot in LATENCY_PLOTS] + [plot_overview(result), latency_explorer(result)]
    figures.append(draw_padding(CudagraphDispatcher(CUDAGraphMode.FULL_AND_PIECEWISE, (1, 2, 4, 8), 8), 12))
    for fig in figures:
        used = _colors(fig)
        plt.close(fig)
        assert used and all(min(_distance(c, path) for path in PATHS) > 0.3 for c in used), fig
    latency = plot_latency(result)
    plt.close(latency.figure)
    assert {to_rgb(line.get_color()) for line in latency.get_lines() if line.get_marker() != "None"} == {
        to_rgb(MODE_COLORS[m]) for m in result.modes
    }


def test_the_caches_markers_clear_the_title_and_the_legend_names_them() -> None:
    runner = ModelRunner(ToyConfig(), "none")
    for i, length in enumerate((5, 9, 3)):  # notebook 02's decode loop: prefills, then decode steps
        runner.add_request(f"req{i}")
        runner.step({f"req{i}": list(range(1, length + 1))}, eager=True)
    for _ in range(4):
        runner.step({f"req{i}": [2] for i in range(3)})
    last_step = runner.block_tables.slot_mapping[:3].tolist()
    every_slot = list(range(0, 9 * runner.config.block_size, 2))  # some under the title, whatever its width
    for slots, title in ((last_step, ""), (every_slot, "a long title " * 8)):
        fig = _drawn(draw_caches(runner, slots, title=title))
        ax = fig.axes[0]
        (markers,) = [line for line in ax.get_lines() if line.get_marker() == "v"]
        marks = markers.get_window_extent()
        assert marks.y0 >= ax.get_window_extent().y1  # above the caches, not over a row
        assert not marks.overlaps(ax.title.get_window_extent())
        entries = dict(zip((t.get_text() for t in ax.get_legend().get_texts()), ax.get_legend().legend_handles))
        assert entries["slot the last step wrote\n(its slot mapping)"].get_marker() == "v"
