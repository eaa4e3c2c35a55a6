"""Pictures of the toy engine: paged caches, captured graphs, padding, capture support, divergence from eager."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import offset_copy

from cglab.batch import CudagraphDispatcher
from cglab.config import CUDAGraphMode, dummy_query_lens
from cglab.cudagraph_support import AttentionCGSupport, can_build_metadata
from cglab.graphs import CapturedGraph
from cglab.lab.anatomy import Piece, steps_as_pieces
from cglab.lab.plots import MODE_COLORS, path_colors
from cglab.layer_registry import kind_of_op
from cglab.repro import ReproResult
from cglab.runner import ModelRunner

DPI = 100  # fixed, so a figure's text form ("<Figure size 900x300 with 1 Axes>") is the same everywhere
_FREE, _RESERVED = (1.0, 1.0, 1.0), (0.9, 0.9, 0.9)  # reserved: in a request's block, not reached yet
_MISSING = (0.85, 0.1, 0.1)  # red, what goes wrong: the request reached this slot, yet the row was never written
_CAN = to_rgb("#59a14f")  # the first request's green: a builder that can build the metadata
# A step's pieces in the colours of the modes they run like (never a capture path's red or blue): an eager
# step runs as mode NONE does, a graph replays what it recorded as a FULL graph does.
_EAGER, _SEGMENT = MODE_COLORS["none"], MODE_COLORS["full"]
_PALETTE = ("#59a14f", "#76b7b2", "#edc948", "#b07aa1", "#9c755f", "#bab0ac", "#4e79a7", "#ff9da7")  # requests
_MARKER_RISE_PT, _MARKER_PT = 7, 7  # a ▼ sits this far above the caches, this tall: clear of its title
_FOR_CAPTURE = (True, False)  # breakable PIECEWISE before and after vLLM PR #49364
_LEVEL_LABELS = {"UNIFORM_SINGLE_TOKEN_DECODE": "UNIFORM_SINGLE_\nTOKEN_DECODE", "UNIFORM_BATCH": "UNIFORM_\nBATCH"}


def new_figure(width: float, height: float) -> tuple[Figure, Axes]:
    """A figure of one Axes at the suite's fixed DPI."""
    # Not pyplot's: a notebook shows each figure once, and a test needs no display.
    fig = Figure(figsize=(width, height), dpi=DPI)
    return fig, fig.add_subplot()


def patch_legend(ax: Axes, colors: Mapping[str, object], loc: str, anchor: tuple[float, float]) -> None:
    """A frameless legend in two columns, one coloured patch per label, placed outside the data."""
    handles = [Patch(color=color, label=label) for label, color in colors.items()]
    ax.legend(handles=handles, loc=loc, bbox_to_anchor=anchor, ncol=2, fontsize="small", frameon=False)


def _rows_written(name: str, cache: torch.Tensor, num_slots: int, ratio: int) -> np.ndarray:
    """Per cache slot: has this cache row ever been written (any non-zero value)?"""
    t = cache.detach().float().cpu()
    if name.endswith("kv_cache"):  # [2, blocks, block_size, heads, dim]: keys and values share a slot
        written = (t.flatten(1, 2).flatten(2) != 0).any(-1).any(0)
    else:
        written = (t.flatten(1) != 0).any(-1)
    if name.endswith("compressed_cache"):  # one entry per `ratio` slots: stretch it over its group
        written = written.repeat_interleave(ratio)
    return written[:num_slots].numpy()


def draw_caches(runner: ModelRunner, highlight_slots: Sequence[int] = (), title: str = "") -> Figure:
    """Every cache as a row of slots coloured by owning request (red: reached, never written); ▼ marks slots."""
    bs, ratio = runner.config.block_size, runner.config.compress_ratio
    requests = list(runner.requests.values())
    used_blocks = max((b for r in requests for b in r.block_ids), default=0) + 1
    num_slots = used_blocks * bs
    owner = np.full(num_slots, -1)
    # Per slot: its request has a token there; the slot's compressor group is complete.
    stored, group_done = np.zeros((2, num_slots), dtype=bool)
    for i, r in enumerate(requests):
        pos = np.arange(len(r.block_ids) * bs)
        slots = [r.slot(p, bs) for p in pos]
        owner[slots], stored[slots] = i, pos < r.num_computed_tokens
        group_done[slots] = (pos // ratio + 1) * ratio <= r.num_computed_tokens
    colors = [to_rgb(_PALETTE[i % len(_PALETTE)]) for i in range(len(requests))]
    by_owner = np.array([*colors, _FREE])  # owner -1 (no request): free
    states = runner.state_tensors()
    image = np.ones((len(states), num_slots, 3))
    for row, (name, cache) in enumerate(states.items()):
        shown = (_rows_written(name, cache, num_slots, ratio) | (owner < 0))[:, None]  # written, or free
        expected = (group_done if name.endswith("compressed_cache") else stored)[:, None]
        image[row] = np.where(shown, by_owner[owner], np.where(expected, _MISSING, _RESERVED))

    # At most 8.4 inches (840 pixels): wider, the notebook would shrink it and its text with it.
    fig, ax = new_figure(min(8.4, max(7.0, 0.22 * num_slots + 4.0)), 0.45 * len(states) + 1.8)
    ax.imshow(image, aspect="auto", interpolation="nearest")
    for x in range(0, num_slots + 1, bs):
        ax.axvline(x - 0.5, color="black", lw=0.8)
    for y in range(len(states) + 1):
        ax.axhline(y - 0.5, color="white", lw=2)
    marked = [s for s in highlight_slots if 0 <= s < num_slots]
    # Placed in points above the top edge, not in rows: a row's height changes with the figure, the
    # title's pad does not.
    above = offset_copy(ax.get_xaxis_transform(), fig=fig, y=_MARKER_RISE_PT, units="points")
    ax.plot(marked, [1.0] * len(marked), "v", color="black", ms=_MARKER_PT, clip_on=False, transform=above)
    ax.set_ylim(len(states) - 0.5, -0.5)
    ax.set_yticks(range(len(states)), list(states))
    ax.set_xticks([b * bs + (bs - 1) / 2 for b in range(used_blocks)], [str(b) for b in range(used_blocks)])
    ax.set_xlabel(f"physical block (each holds {bs} slots; the compressed cache holds one entry per {ratio} slots)")
    legend = [Patch(color=c, label=r.req_id) for c, r in zip(colors, requests)]
    legend += [
        Patch(color=_MISSING, label="reached, never written"),
        Patch(color=_RESERVED, label="reserved"),
        Patch(fc=_FREE, ec="black", label="free"),
    ]
    if marked:
        label = "slot the last step wrote\n(its slot mapping)"
        legend.append(Line2D([], [], ls="none", marker="v", color="black", ms=_MARKER_PT, label=label))
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    ax.set_title(title or "paged caches (triangles: the slots this step writes)", pad=_MARKER_RISE_PT + _MARKER_PT + 4)
    fig.tight_layout()
    return fig


def _short_op(op: str) -> str:
    """``"cglab::unified_attention"`` -> ``"attn"``: the layer kind whose kernel the op is."""
    return kind_of_op(op) or op.split("::")[-1].lstrip("_")


def draw_graph_anatomy(graphs: Mapping[str, CapturedGraph | Sequence[Piece]]) -> Figure:
    """Each graph (or its ``graph_pieces``) as its replay sequence: graphs (width = ops) and eager steps."""
    fig, ax = new_figure(9, 0.9 * len(graphs) + 1.2)
    rows = [steps_as_pieces(g) if isinstance(g, CapturedGraph) else list(g) for g in graphs.values()]
    longest = max(sum(p.num_ops for p in pieces if not p.eager) for pieces in rows)
    eager_width = max(5.0, 0.05 * longest)  # wide enough for its label whatever the scale
    height, widest = 0.55, 0.0
    for y, pieces in zip(range(len(rows) - 1, -1, -1), rows):
        x = 0.0
        for piece in pieces:
            empty = not piece.eager and not piece.num_ops  # a graph that recorded nothing: hatched white
            width = eager_width if piece.eager else max(piece.num_ops, 1)
            color = _EAGER if piece.eager else "white" if empty else _SEGMENT
            ax.barh(y, width, left=x, height=height, color=color, edgecolor="black", hatch="//" if empty else "")
            label, size = (_short_op(piece.op), 7) if piece.eager else (str(piece.num_ops), 8)
            ink = "black" if empty else "white"
            ax.text(x + width / 2, y, label, ha="center", va="center", fontsize=size, color=ink)
            if not piece.eager and piece.name.startswith("submod"):
                ax.text(x + width / 2, y + height / 2 + 0.04, piece.name, ha="center", va="bottom", fontsize=7)
            x += width
        widest = max(widest, x)
    ax.set_yticks(range(len(graphs)), list(reversed(list(graphs))))
    ax.set_ylim(-0.6, len(graphs) - 0.25)
    # The axis ends where the longest row does: its ticks count ops, eager steps at their drawn width.
    ax.set_xlim(0, widest)
    ax.set_xlabel(
        f"replay order, left to right, in ops: a graph's width and number are the ops it recorded,\n"
        f"an eager step is drawn {eager_width:.3g} ops wide"
    )
    legend = {"graph: replays what it recorded": _SEGMENT, "eager step: its Python runs, reading live metadata": _EAGER}
    patch_legend(ax, legend, "lower center", (0.5, 1.0))
    fig.tight_layout()
    return fig


def draw_padding(dispatcher: CudagraphDispatcher, max_tokens: int) -> Figure:
    """The graph size each batch of 1 to ``max_tokens`` tokens runs in, and the padded rows it costs."""
    tokens = np.arange(1, max_tokens + 1)
    fig, ax = new_figure(8, 3.4)
    modes = [m for m in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL) if m in dispatcher.policy.runtime_modes()]
    for mode, style in zip(modes, ("-", "--")):
        uniform = mode is CUDAGraphMode.FULL
        padded = [dispatcher.dispatch(n, n, uniform_token_count=1 if uniform else None) for n in tokens]
        size = np.array([d.num_tokens if d.cg_mode is not CUDAGraphMode.NONE else np.nan for d in padded])
        color = MODE_COLORS[mode.name.lower()]  # the mode's colour in every picture, never a capture path's
        ax.step(tokens, size, where="mid", ls=style, color=color, label=f"{mode.name} graph size")
        ax.fill_between(tokens, tokens, size, step="mid", color=color, alpha=0.15)
    ax.plot(tokens, tokens, color="black", lw=0.8, label="real tokens (no padding)")
    ax.set(xlabel="tokens in the batch", ylabel="tokens the graph computes")
    ax.set_title("padding to the next capture size (shaded: wasted rows; no line: runs eagerly)")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class CaptureBatchSupport:
    """One capture size: its dummy batch and, per support level, can a builder build its metadata?"""

    # old: before vLLM PR #49364 (for_capture=True); fixed: after it.

    num_tokens: int
    query_lens: tuple[int, ...]
    old: dict[AttentionCGSupport, bool]
    fixed: dict[AttentionCGSupport, bool]

    @property
    def decode_shaped(self) -> bool:
        return all(q == 1 for q in self.query_lens)

    def describe_batch(self) -> str:
        """``"8 reqs x 2 tokens"``, ``"2 x 1 + 2 x 2 tokens"`` (the dummy split: the longer requests last)."""
        first, last, n = self.query_lens[0], self.query_lens[-1], len(self.query_lens)
        if first == last:
            return f"{n} req{'s' if n > 1 else ''} x {first} token{'s' if first > 1 else ''}"
        longer = self.query_lens.count(last)
        return f"{n - longer} x {first} + {longer} x {last} tokens"


def capture_support(max_num_reqs: int, capture_sizes: Sequence[int]) -> list[CaptureBatchSupport]:
    """The rows of ``draw_capture_support``, smallest capture size first, by ``can_build_metadata``."""
    rows = []
    for size in sorted(set(capture_sizes)):
        query_lens = tuple(dummy_query_lens(min(size, max_num_reqs), size))
        shape = {"num_reqs": len(query_lens), "num_tokens": size, "max_query_len": max(query_lens)}
        old, fixed = (
            {s: can_build_metadata(s, **shape, for_capture=f) for s in AttentionCGSupport} for f in _FOR_CAPTURE
        )
        rows.append(CaptureBatchSupport(size, query_lens, old, fixed))
    return rows


def draw_capture_support(max_num_reqs: int, capture_sizes: Sequence[int]) -> Figure:
    """``capture_support`` as a grid: can a builder of each level build breakable PIECEWISE capture's metadata?"""
    rows = capture_support(max_num_reqs, capture_sizes)
    levels = list(AttentionCGSupport)
    columns = 3 + 2 * len(levels)  # batch, old for_capture, old levels, fixed for_capture, fixed levels
    image = np.ones((len(rows), columns, 3))
    old_start, fixed_start = 2, 3 + len(levels)
    fig, ax = new_figure(12.5, 0.5 * len(rows) + 2.6)
    for y, row in enumerate(rows):
        cells = [(0, f"{row.describe_batch()}\n({'decode' if row.decode_shaped else 'prefill'}-shaped)", _RESERVED)]
        for start, for_capture, verdicts in zip((old_start, fixed_start), _FOR_CAPTURE, (row.old, row.fixed)):
            cells.append((start - 1, f"for_capture=\n{for_capture}", _RESERVED))
            cells += [
                (start + i, "can" if verdicts[level] else "fails", _CAN if verdicts[level] else _MISSING)
                for i, level in enumerate(levels)
            ]
        for x, text, color in cells:  # grey cells state plain facts (no verdict): black text
            image[y, x] = color
            ink = "black" if color == _RESERVED else "white"
            ax.text(x, y, text, ha="center", va="center", fontsize=7.5, color=ink)
    ax.imshow(image, aspect="auto", interpolation="nearest")
    for x in range(columns + 1):
        ax.axvline(x - 0.5, color="white", lw=2)
    for x in (old_start - 1, fixed_start - 1):  # the two halves: before the fix, after it
        ax.axvline(x - 0.5, color="black", lw=1.5)
    for y in range(len(rows) + 1):
        ax.axhline(y - 0.5, color="white", lw=2)
    ax.set_yticks(range(len(rows)), [f"{r.num_tokens} token{'s' if r.num_tokens > 1 else ''}" for r in rows])
    ax.set_ylabel("capture size")
    names = [_LEVEL_LABELS.get(level.name, level.name) for level in levels]
    labels = ["dummy batch", "before #49364", *names, "after #49364", *names]
    ax.set_xticks(range(columns), labels, fontsize=7.5)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    ax.set_title(
        f"breakable PIECEWISE capture, max_num_reqs={max_num_reqs}: can a builder of each "
        "cudagraph_support level build the metadata?",
        pad=12,
    )
    legend = {"can build it": _CAN, "fails at capture (MetadataBuildError)": _MISSING}
    patch_legend(ax, legend, "upper center", (0.5, -0.02))
    fig.tight_layout()
    return fig


def draw_divergence(results: Mapping[str, ReproResult]) -> Figure:
    """Each decode step's logit difference from eager, and each cache's after the last, on one log scale."""
    fig = Figure(figsize=(11, 3.6), dpi=DPI)
    steps_ax, state_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.3, 1]})
    floor, ceiling = 1e-9, 10.0  # exact agreement plotted at the floor of the log scale
    tolerance = min(r.tolerance for r in results.values())
    names = sorted({n for r in results.values() for n in r.state_diffs})
    height, base = 0.8 / len(results), floor / 2
    for i, (color, (label, result)) in enumerate(zip(path_colors(results.values()), results.items())):
        if result.error:  # nothing ran: a line or bars at the floor would read as exact agreement
            steps_ax.plot([], [], color=color, ls="none", marker="x", label=f"{label}: capture failed")
            continue
        diffs = np.maximum(np.asarray(result.step_diffs, dtype=float), floor)
        steps_ax.semilogy(np.arange(1, len(diffs) + 1), diffs, marker="o", ms=3, color=color, label=label)
        values = np.maximum([result.state_diffs.get(n, 0.0) for n in names], floor)
        state_ax.barh(np.arange(len(names)) + i * height, values - base, left=base, height=height, color=color)
    steps_ax.axhline(tolerance, color="gray", ls="--", lw=1, label="tolerance (rounding)")
    steps_ax.set(ylim=(floor / 2, ceiling), xlabel="decode step", ylabel="max |replay - eager| (logits)")
    steps_ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no tick at 2.5
    # Above the panels, not over the lines: the right panel uses the same colours.
    steps_ax.legend(
        fontsize="small", frameon=False, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=2, borderaxespad=0.2
    )
    state_ax.set_xscale("log")
    state_ax.set_xlim(base, ceiling)
    state_ax.axvline(tolerance, color="gray", ls="--", lw=1)
    state_ax.set_yticks(np.arange(len(names)) + height * (len(results) - 1) / 2, names, fontsize=8)
    state_ax.invert_yaxis()
    state_ax.set_xlabel("max |cache - eager cache| after the last step")
    failed = [
        f"{label}:\ncapture failed ({result.error.split(':')[0]}), no caches to compare"
        for label, result in results.items()
        if result.error
    ]
    if failed:
        steps_ax.set_yscale("log")  # no line may have set it
        state_ax.set_title("\n".join(failed), fontsize=8, color="gray", loc="right")
    fig.tight_layout()
    return fig
