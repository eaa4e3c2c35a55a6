"""Pictures of the toy engine: paged caches, captured graphs, dispatch, divergence from eager. Figures are not
pyplot's (a notebook shows each once, a test needs no display); text pictures are strings."""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import matplotlib
import numpy as np
import torch
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import offset_copy

from cglab import __version__
from cglab.batch import BatchExecutionDescriptor, CudagraphDispatcher, get_uniform_decode_token_count
from cglab.compilation_config import CompilationConfig
from cglab.config import OP_OF_KIND, CUDAGraphMode, ToyConfig, check_int, check_sizes
from cglab.errors import ConfigError
from cglab.graphs import CapturedGraph, get_backend
from cglab.lab.anatomy import Piece, steps_as_pieces
from cglab.lab.plots import MODE_COLORS, path_colors
from cglab.repro import ReproResult
from cglab.runner import ModelRunner, PreparedStep

__all__ = [
    "MAX_PADDING_TOKENS",
    "BatchShape",
    "describe_dispatch",
    "describe_environment",
    "describe_requests",
    "describe_spec_decode_sizes",
    "describe_step",
    "dispatch_cell",
    "draw_caches",
    "draw_divergence",
    "draw_graph_anatomy",
    "draw_padding",
]

MAX_PADDING_TOKENS = 10_000  # a padding picture's widest batch: wider only takes longer to draw
DPI = 100  # fixed, so a figure's text form ("<Figure size 900x300 with 1 Axes>") is the same everywhere
_FREE, _RESERVED = (1.0, 1.0, 1.0), (0.9, 0.9, 0.9)  # reserved: in a request's block, not reached yet
_MISSING = (0.85, 0.1, 0.1)  # the request reached this slot, yet the cache row was never written
# A step's pieces in the colours of the modes they run like (never a capture path's red or blue): an eager
# step runs as mode NONE does, a graph replays what it recorded as a FULL graph does.
_EAGER, _SEGMENT = MODE_COLORS["none"], MODE_COLORS["full"]
_PALETTE = ("#59a14f", "#76b7b2", "#edc948", "#b07aa1", "#9c755f", "#bab0ac", "#4e79a7", "#ff9da7")  # requests
_MARKER_RISE_PT, _MARKER_PT = 7, 7  # a ▼ sits this far above the caches, this tall: clear of its title


def expect(value: object, kind: type, what: str) -> None:
    """A toolkit argument of the wrong kind gets one ConfigError saying what to pass instead."""
    if not isinstance(value, kind):
        raise ConfigError(f"{what}; got {type(value).__name__}")


def describe_environment(device: str = "cpu") -> str:
    """Versions and the graph backend a notebook runs on, one per line."""
    backend = get_backend("auto", device)
    compiler = CompilationConfig().resolve(ToyConfig(), torch.device(device), ()).backend
    cuda = torch.version.cuda or "none (CPU build)"
    try:  # a plain PyTorch install (a GPU box's, say) may lack it; only the widget cells need it
        import ipywidgets

        widgets = ipywidgets.__version__
    except ImportError:
        widgets = "not installed (widgets off)"
    return (
        f"cglab {__version__}, Python {platform.python_version()}, torch {torch.__version__} (CUDA {cuda})\n"
        f"matplotlib {matplotlib.__version__}, ipywidgets {widgets}\n"
        f"device: {device}; graph backend: {backend.name} = {backend.label}\n"
        f"torch.compile compiles the pieces with: {compiler}"
    )


def describe_requests(runner: ModelRunner) -> str:
    """One line per request: tokens stored, the blocks it owns (its block-table row) and their slots."""
    bs = runner.config.block_size
    return "\n".join(
        f"{r.req_id}: {r.num_computed_tokens:2d} tokens in blocks "
        + ", ".join(f"{b} (slots {b * bs}-{b * bs + bs - 1})" for b in r.block_ids)
        for r in runner.requests.values()
    )


def describe_step(prepared: PreparedStep) -> str:
    """What a prepared step wrote into the persistent buffers, padding included."""
    expect(
        prepared,
        PreparedStep,
        "describe_step takes what ModelRunner.prepare_step returns, e.g. "
        "describe_step(runner.prepare_step({'req0': [1]}))",
    )
    batch, desc = prepared.input_batch, prepared.descriptor
    slot_mapping = next(iter(prepared.attn_metadata.values())).slot_mapping
    return (
        f"{desc}: {batch.num_tokens} real token(s) in {len(prepared.requests)} request(s)\n"
        f"  query_start_loc {batch.query_start_loc.tolist()}\n"
        f"  seq_lens        {batch.seq_lens.tolist()}\n"
        f"  slot_mapping    {slot_mapping.tolist()}"
    )


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
    """Every cache as a row of slots coloured by owning request; red: reached but never written (the
    bug's signature); grey: reserved. ``highlight_slots`` get a ▼ above the rows."""
    expect(runner, ModelRunner, "draw_caches takes the ModelRunner whose caches to draw")
    if (
        isinstance(highlight_slots, (str, bytes))
        or not isinstance(highlight_slots, Sequence)
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in highlight_slots)
    ):
        raise ConfigError(
            f"highlight_slots must be a list of slot numbers, e.g. last_written_slots(runner), got {highlight_slots!r}"
        )
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

    fig = Figure(figsize=(max(7.0, 0.22 * num_slots + 4.0), 0.45 * len(states) + 1.8), dpi=DPI)
    ax = fig.add_subplot()
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
        legend.append(
            Line2D(
                [],
                [],
                ls="none",
                marker="v",
                color="black",
                ms=_MARKER_PT,
                label="slot the last step wrote\n(its slot mapping)",
            )
        )
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    ax.set_title(title or "paged caches (triangles: the slots this step writes)", pad=_MARKER_RISE_PT + _MARKER_PT + 4)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------ what a captured forward is made of


def _short_op(op: str) -> str:
    """``"cglab::unified_attention"`` -> ``"attn"``: the layer kind whose kernel the op is."""
    kinds = {name: kind for kind, name in OP_OF_KIND.items()}
    return kinds.get(op, op.split("::")[-1].lstrip("_"))


def draw_graph_anatomy(graphs: Mapping[str, CapturedGraph | Sequence[Piece]]) -> Figure:
    """Each graph (or its ``graph_pieces``) as its replay sequence: graphs (width = ops) and eager steps."""
    if not isinstance(graphs, Mapping) or not graphs:
        raise ConfigError(
            "draw_graph_anatomy takes a dict {label: captured graph or its pieces} with at least one "
            "graph, e.g. {str(d): graph_pieces(runner, d) for d in runner.graph_replays()}"
        )
    fig = Figure(figsize=(9, 0.9 * len(graphs) + 1.2), dpi=DPI)
    ax = fig.add_subplot()
    rows = [steps_as_pieces(g) if isinstance(g, CapturedGraph) else list(g) for g in graphs.values()]
    longest = max(sum(p.num_ops for p in pieces if not p.eager) for pieces in rows)
    eager_width = max(5.0, 0.05 * longest)  # wide enough for its label whatever the scale
    height, widest = 0.55, 0.0
    for y, pieces in zip(range(len(rows) - 1, -1, -1), rows):
        x = 0.0
        for piece in pieces:
            empty = not piece.eager and not piece.num_ops  # a graph that recorded nothing: hatched white
            width = eager_width if piece.eager else max(piece.num_ops, 1)
            ax.barh(
                y,
                width,
                left=x,
                height=height,
                color=_EAGER if piece.eager else "white" if empty else _SEGMENT,
                edgecolor="black",
                hatch="//" if empty else "",
            )
            ax.text(
                x + width / 2,
                y,
                _short_op(piece.op) if piece.eager else str(piece.num_ops),
                ha="center",
                va="center",
                fontsize=7 if piece.eager else 8,
                color="black" if empty else "white",
            )
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
    ax.legend(
        handles=[
            Patch(color=_SEGMENT, label="graph: replays what it recorded"),
            Patch(color=_EAGER, label="eager step: its Python runs, reading live metadata"),
        ],
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
        ncol=2,
        fontsize="small",
        frameon=False,
    )
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class BatchShape:
    """A batch as the dispatcher sees it; ``by_shape``: the rule before vLLM PR #51865 (equal query lengths
    are enough)."""

    label: str
    query_lens: tuple[int, ...]
    prefilling: tuple[bool, ...] = ()  # per request; missing entries: decoding
    by_shape: bool = False

    @property
    def num_reqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    def uniform_token_count(self) -> int | None:
        """What the runner passes to dispatch: the tokens per request of a uniform decode batch, else None."""
        return get_uniform_decode_token_count(self.query_lens, not self.by_shape and any(self.prefilling))


DISPATCH_POLICIES = (
    CUDAGraphMode.FULL,
    CUDAGraphMode.FULL_AND_PIECEWISE,
    CUDAGraphMode.FULL_DECODE_ONLY,
    CUDAGraphMode.PIECEWISE,
)


def dispatch_cell(desc: BatchExecutionDescriptor) -> str:
    """A descriptor as ``describe_dispatch`` prints it: ``FULL 4/4 u=1`` (mode, tokens/requests, uniform
    token count), ``PIECEWISE 8`` (any number of requests), ``eager`` for NONE."""
    if desc.cg_mode is CUDAGraphMode.NONE:
        return "eager"
    reqs = "" if desc.num_reqs is None else f"/{desc.num_reqs}"
    uniform = "" if desc.uniform_token_count is None else f" u={desc.uniform_token_count}"
    return f"{desc.cg_mode.name} {desc.num_tokens}{reqs}{uniform}"


def describe_dispatch(
    capture_sizes: Sequence[int],
    max_num_reqs: int,
    shapes: Sequence[BatchShape],
    policies: Sequence[CUDAGraphMode] = DISPATCH_POLICIES,
) -> str:
    """A table: one row per batch shape, one column per policy, each cell the graph dispatch picks
    (``dispatch_cell``); ``uniform`` is the batch's ``uniform_token_count`` (``-``: None). Short cells keep
    it within the 107 characters a notebook's output area holds beside JupyterLab's file browser."""
    dispatchers = [CudagraphDispatcher(p, capture_sizes, max_num_reqs) for p in policies]
    header = ["batch", "uniform", *(p.name for p in policies)]
    rows = [header]
    for shape in shapes:
        uniform = shape.uniform_token_count()
        descs = [d.dispatch(shape.num_reqs, shape.num_tokens, uniform) for d in dispatchers]
        rows.append([shape.label, "-" if uniform is None else str(uniform), *map(dispatch_cell, descs)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        f"capture sizes {tuple(sorted(capture_sizes))}, max_num_reqs={max_num_reqs}",
        "each cell: the graph's mode, tokens/requests (PIECEWISE: any requests), u=1 if for uniform decode",
    ]
    for i, row in enumerate(rows):
        lines.append(" | ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def describe_spec_decode_sizes(
    capture_sizes: Sequence[int],
    num_speculative_tokens: int,
    max_num_reqs: int,
    policy: CUDAGraphMode = CUDAGraphMode.FULL_AND_PIECEWISE,
) -> str:
    """The target's graphs under speculative decoding as vLLM's two model runners choose them, one line each.

    v1 (``adjust_cudagraph_sizes_for_spec_decode``, when the policy decodes in FULL) rounds every capture
    size up to a multiple of K + 1, drops those above the largest (K + 1 alone if none is left; none fits:
    a start-up error) and captures every mode at the rest. v2 keeps the sizes for PIECEWISE and rounds only
    the FULL uniform-decode graphs (``uniform_decode_sizes``), as ``cglab`` does."""
    sizes = sorted(check_sizes("capture size", capture_sizes, distinct=True))
    q = check_int("num_speculative_tokens", num_speculative_tokens) + 1
    v1 = sizes
    if policy.decode_mode() is CUDAGraphMode.FULL:
        v1 = sorted({r for r in (-(-s // q) * q for s in sizes) if r <= sizes[-1]})
        v1 = v1 or ([q] if q <= sizes[-1] else [])
    lines = [f"capture sizes {tuple(sizes)}, K = {q - 1}, max_num_reqs = {max_num_reqs}, {policy.name}"]
    for runner, ladder in (("v1", v1), ("v2", sizes)):
        descs = CudagraphDispatcher(policy, ladder, check_int("max_num_reqs", max_num_reqs), q).capture_descriptors()
        graphs = [
            f"{m.name} {', '.join(str(d.num_tokens) for d in reversed(descs) if d.cg_mode is m)}"
            for m in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)
            if any(d.cg_mode is m for d in descs)
        ]
        lines.append(f"model runner {runner}: {' | '.join(graphs) if ladder else 'start-up error, no size left'}")
    return "\n".join(lines)


def draw_padding(dispatcher: CudagraphDispatcher, max_tokens: int) -> Figure:
    """The graph size each batch size runs in, and the padded rows it costs (eager past the last size),
    for batches of 1 to ``max_tokens`` tokens (at most ``MAX_PADDING_TOKENS``)."""
    expect(
        dispatcher,
        CudagraphDispatcher,
        "draw_padding takes a CudagraphDispatcher, e.g. CudagraphDispatcher("
        "CUDAGraphMode.PIECEWISE, (1, 2, 4, 8), max_num_reqs=8)",
    )
    check_int("max_tokens (the largest batch drawn)", max_tokens, 1, MAX_PADDING_TOKENS)
    tokens = np.arange(1, max_tokens + 1)
    fig = Figure(figsize=(8, 3.4), dpi=DPI)
    ax = fig.add_subplot()
    modes = [m for m in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL) if m in dispatcher.policy.runtime_modes()]
    for mode, style in zip(modes, ("-", "--")):
        uniform = mode is CUDAGraphMode.FULL
        padded = [dispatcher.dispatch(n, n, uniform_token_count=1 if uniform else None) for n in tokens]
        size = np.array([d.num_tokens if d.cg_mode is not CUDAGraphMode.NONE else np.nan for d in padded])
        color = MODE_COLORS[mode.name.lower()]  # the mode's colour in every picture, never a capture path's
        ax.step(tokens, size, where="mid", ls=style, color=color, label=f"{mode.name} graph size")
        ax.fill_between(tokens, tokens, size, step="mid", color=color, alpha=0.15)
    ax.plot(tokens, tokens, color="black", lw=0.8, label="real tokens (no padding)")
    ax.set_xlabel("tokens in the batch")
    ax.set_ylabel("tokens the graph computes")
    ax.set_title("padding to the next capture size (shaded: wasted rows; no line: runs eagerly)")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def draw_divergence(results: Mapping[str, ReproResult]) -> Figure:
    """Left: each decode step's logit difference from eager; right: each cache's after the last step. One
    log scale with the tolerance marked, so rounding stays small beside a divergence; legacy red, fixed blue."""
    if not isinstance(results, Mapping) or not results or not all(isinstance(r, ReproResult) for r in results.values()):
        raise ConfigError(
            "draw_divergence takes a dict {label: ReproResult} with at least one run, e.g. "
            "{'legacy': run_repro(legacy_skip_attn=True), 'fixed': run_repro()}"
        )
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
    steps_ax.set_ylim(floor / 2, ceiling)
    steps_ax.set_xlabel("decode step")
    steps_ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no tick at 2.5
    steps_ax.set_ylabel("max |replay - eager| (logits)")
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
