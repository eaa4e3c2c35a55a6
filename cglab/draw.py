"""Pictures of the toy engine: its paged caches, its captured graphs, its divergence from eager.

Every function returns a ``matplotlib.figure.Figure`` that pyplot does not manage, so a notebook
shows it once (as the cell's value) and a test can draw it with no display at all. Text pictures
(``describe_requests``, ``describe_pieces``, ``trace_replay``: the Python calls one step runs)
return strings, so notebooks can print them and nbval can check them.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from torch import nn

from cglab.batch import BatchExecutionDescriptor, CudagraphDispatcher
from cglab.compilation import CUDAGraphWrapper, PiecewiseGraph
from cglab.compilation.backends import op_name
from cglab.config import OP_OF_KIND, CUDAGraphMode
from cglab.custom_ops import custom_op_impl, registered_op_names
from cglab.errors import ConfigError
from cglab.forward_context import get_forward_context
from cglab.graphs import CapturedGraph, EagerStep, GraphSegment
from cglab.model import ToyTransformer
from cglab.repro import ReproResult
from cglab.runner import ModelRunner, PreparedStep

__all__ = ["Piece", "describe_environment", "describe_pieces", "describe_replays", "describe_requests",
           "describe_step", "draw_caches", "draw_divergence", "draw_graph_anatomy", "draw_padding", "graph_pieces",
           "trace_replay"]

DPI = 100  # fixed, so a figure's text form ("<Figure size 900x300 with 1 Axes>") is the same everywhere
_FREE = (1.0, 1.0, 1.0)
_RESERVED = (0.9, 0.9, 0.9)  # in a request's block, not reached yet
_MISSING = (0.85, 0.1, 0.1)  # the request reached this slot, yet the cache row was never written
_EAGER = "#f28e2b"
_SEGMENT = "#4e79a7"


def _request_colors(n: int) -> list[tuple[float, float, float]]:
    palette = ["#59a14f", "#76b7b2", "#edc948", "#b07aa1", "#9c755f", "#bab0ac", "#4e79a7", "#ff9da7"]
    return [tuple(int(c[i : i + 2], 16) / 255 for i in (1, 3, 5)) for c in (palette * (n // len(palette) + 1))[:n]]


def describe_environment(device: str = "cpu") -> str:
    """Versions and the graph backend a notebook runs on, one per line."""
    import platform

    import matplotlib

    from cglab import __version__
    from cglab.graphs import get_backend

    backend = get_backend("auto", device)
    cuda = torch.version.cuda or "none (CPU build)"
    try:  # a plain PyTorch install (a GPU box's, say) may lack it; only the widget cells need it
        import ipywidgets

        widgets = ipywidgets.__version__
    except ImportError:
        widgets = "not installed (widgets off)"
    lines = [
        f"cglab {__version__}, Python {platform.python_version()}, torch {torch.__version__} (CUDA {cuda})",
        f"matplotlib {matplotlib.__version__}, ipywidgets {widgets}",
        f"device: {device}; graph backend: {backend.name} = {backend.label}",
    ]
    return "\n".join(lines)


def describe_requests(runner: ModelRunner) -> str:
    """One line per request: tokens stored, the blocks it owns (its block-table row) and their slots."""
    bs = runner.config.block_size
    lines = []
    for r in runner.requests.values():
        spans = ", ".join(f"{b} (slots {b * bs}-{b * bs + bs - 1})" for b in r.block_ids)
        lines.append(f"{r.req_id}: {r.num_computed_tokens:2d} tokens in blocks {spans}")
    return "\n".join(lines)


def describe_step(prepared: PreparedStep) -> str:
    """What a prepared step wrote into the persistent buffers, padding included."""
    batch, desc = prepared.input_batch, prepared.descriptor
    slot_mapping = next(iter(prepared.attn_metadata.values())).slot_mapping
    return "\n".join([
        f"{desc}: {batch.num_tokens} real token(s) in {len(prepared.requests)} request(s)",
        f"  query_start_loc {batch.query_start_loc.tolist()}",
        f"  seq_lens        {batch.seq_lens.tolist()}",
        f"  slot_mapping    {slot_mapping.tolist()}",
    ])


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
    """Every cache of the model as one row of slots, coloured by the request that owns the slot.

    A coloured cell holds data; red means the request has reached that slot but the cache row was
    never written (the signature of the missing-metadata bug); grey is reserved for later tokens.
    ``highlight_slots`` (this step's slot mapping) are marked with a triangle.
    """
    config = runner.config
    bs, ratio = config.block_size, config.compress_ratio
    requests = list(runner.requests.values())
    used_blocks = max((b for r in requests for b in r.block_ids), default=0) + 1
    num_slots = used_blocks * bs
    owner = np.full(num_slots, -1)
    stored = np.zeros(num_slots, dtype=bool)  # the request has a token at this slot
    group_done = np.zeros(num_slots, dtype=bool)  # the slot's compressor group is complete
    for i, r in enumerate(requests):
        for pos in range(len(r.block_ids) * bs):
            slot = r.slot(pos, bs)
            owner[slot] = i
            stored[slot] = pos < r.num_computed_tokens
            group_done[slot] = (pos // ratio + 1) * ratio <= r.num_computed_tokens
    colors = _request_colors(len(requests))
    states = runner.state_tensors()
    image = np.ones((len(states), num_slots, 3))
    for row, (name, cache) in enumerate(states.items()):
        written = _rows_written(name, cache, num_slots, ratio)
        expected = group_done if name.endswith("compressed_cache") else stored
        for slot in range(num_slots):
            if owner[slot] < 0:
                image[row, slot] = _FREE
            elif written[slot]:
                image[row, slot] = colors[owner[slot]]
            elif expected[slot]:
                image[row, slot] = _MISSING
            else:
                image[row, slot] = _RESERVED

    fig = Figure(figsize=(max(7.0, 0.22 * num_slots + 4.0), 0.45 * len(states) + 1.8), dpi=DPI)
    ax = fig.add_subplot()
    ax.imshow(image, aspect="auto", interpolation="nearest")
    for x in range(0, num_slots + 1, bs):
        ax.axvline(x - 0.5, color="black", lw=0.8)
    for y in range(len(states) + 1):
        ax.axhline(y - 0.5, color="white", lw=2)
    marked = [s for s in highlight_slots if 0 <= s < num_slots]
    ax.plot(marked, [-0.75] * len(marked), "v", color="black", ms=7, clip_on=False)
    ax.set_ylim(len(states) - 0.5, -0.5)
    ax.set_yticks(range(len(states)), list(states))
    ax.set_xticks([b * bs + (bs - 1) / 2 for b in range(used_blocks)], [str(b) for b in range(used_blocks)])
    ax.set_xlabel(f"physical block (each holds {bs} slots; the compressed cache holds one entry per {ratio} slots)")
    legend = [Patch(color=c, label=r.req_id) for c, r in zip(colors, requests)]
    legend += [Patch(color=_MISSING, label="reached, never written"), Patch(color=_RESERVED, label="reserved"),
               Patch(fc=_FREE, ec="black", label="free")]
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    ax.set_title(title or "paged caches (triangles: the slots this step writes)", pad=14)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------ what a captured forward is made of


@dataclass(frozen=True)
class Piece:
    """One step of a captured forward as it runs at replay: a graph, or Python run eagerly.

    ``name``: ``"submod_2"`` (a piece of the compiled split graph), ``"segment 1"`` (a breakable or
    FULL capture) or ``"eager step"``. ``op``: for an eager step, the op it runs; for a compiled
    graph piece, the custom ops frozen inside it. ``span``: the model modules a compiled piece
    covers, first to last (the plain model's segments carry no such record, so it stays empty).
    """

    name: str
    eager: bool  # runs its Python at every step (a splitting op, an eager break); nothing recorded
    num_ops: int = 0  # ops a graph recorded at capture (kernels on a GPU); 0 for an eager step
    op: str = ""
    span: str = ""


def _op_of_impl() -> dict[CodeType, str]:
    """The code of each cglab custom op's Python body -> the op's name (``"cglab::short_conv"``)."""
    found = {}
    for name in registered_op_names():
        impl = custom_op_impl(getattr(torch.ops.cglab, name.split("::")[1]).default)
        if impl is not None:
            found[inspect.unwrap(impl).__code__] = name
    return found


def _eager_op(step: EagerStep) -> str:
    """The op an eager step runs: a breakable capture keeps the op's Python body, a compiled
    forward's splitting-op step is named after its op (``"cglab::unified_attention (submod_1)"``)."""
    code = getattr(inspect.unwrap(step.fn), "__code__", None)
    return _op_of_impl().get(code) or step.name.split(" (")[0]


def _module_path(node: torch.fx.Node) -> str | None:
    """The model module an FX node was traced in (``"layers.1.mixer"``), from dynamo's record."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path = re.sub(r"^L\['self'\]\.?", "", list(stack.values())[-1][0])
    return ".".join(path.split(".")[:3]) or None  # "layers.2.mixer", not its out_proj


def _span_and_ops(gm: torch.fx.GraphModule) -> tuple[str, str]:
    """The first and last module a piece covers, and the custom ops it calls."""
    nodes = [n for n in gm.graph.nodes if n.op.startswith("call_")]
    paths = [p for p in map(_module_path, nodes) if p]
    ops = [n for n in map(op_name, nodes) if n]
    span = "" if not paths else paths[0] if paths[0] == paths[-1] else f"{paths[0]} … {paths[-1]}"
    return span, ", ".join(ops)


def _steps_as_pieces(graph: CapturedGraph) -> list[Piece]:
    pieces = []
    for step in graph.steps:
        if isinstance(step, EagerStep):
            pieces.append(Piece("eager step", True, op=_eager_op(step)))
        else:
            pieces.append(Piece(f"segment {sum(not p.eager for p in pieces)}", False, step.num_ops))
    return pieces


def _descriptor(runner: ModelRunner, desc: BatchExecutionDescriptor | None) -> BatchExecutionDescriptor:
    manager = runner.cudagraph_manager
    if manager is None or not manager.graphs:
        raise ConfigError("this runner captured no graphs (mode 'none', or closed); "
                          "build one with a graph mode such as 'piecewise'")
    if desc is None:
        return next(iter(manager.graphs))  # the first one captured: the largest of the first mode
    if desc not in manager.graphs:
        captured = ", ".join(map(str, manager.graphs))
        raise ConfigError(f"no graph was captured for {desc}; captured: {captured}")
    return desc


def graph_pieces(runner: ModelRunner, desc: BatchExecutionDescriptor | None = None) -> list[Piece]:
    """What the graph of ``desc`` (default: the first one captured) runs at replay, in order.

    Compiled PIECEWISE: one ``Piece`` per submodule of the split graph, named as the compiler named
    it; the pieces wrapped in a ``CUDAGraphWrapper`` are graphs, the splitting ops eager steps.
    Breakable PIECEWISE and FULL: the recorded segments and eager steps of the one capture.
    """
    desc = _descriptor(runner, desc)
    manager = runner.cudagraph_manager
    assert manager is not None
    graph, compiled = manager.graphs[desc].graph, manager.compiled
    if not isinstance(graph, PiecewiseGraph) or compiled is None:
        return _steps_as_pieces(graph)
    pieces = []
    for item in compiled.items:
        span, ops = _span_and_ops(item.graph)
        wrapper = compiled.wrappers.get(item.submod_name)
        if wrapper is None:
            pieces.append(Piece(item.submod_name, True, op=ops, span=span))
        else:
            pieces.append(Piece(item.submod_name, False, wrapper.entries[desc].graph.num_ops, ops, span))
    return pieces


def _flavor(runner: ModelRunner, desc: BatchExecutionDescriptor) -> str:
    if desc.cg_mode is CUDAGraphMode.FULL:
        compiled = runner.cudagraph_manager is not None and runner.cudagraph_manager.compiled is not None
        return f"one capture of the {'compiled ' if compiled else ''}model"
    if runner.use_breakable_cg:
        return "breakable, cut at its eager breaks"
    if not runner.splitting_ops:
        return "compiled, with no splitting op in this model"
    return f"compiled, split at {', '.join(runner.splitting_ops)}"


def _where(runner: ModelRunner) -> str:
    """Where a runner's graphs run, for output that differs by backend: ``simulator``, ``cuda``, ``eager``."""
    return "simulator" if runner.backend_name == "sim" else runner.backend_name


def describe_pieces(runner: ModelRunner, desc: BatchExecutionDescriptor | None = None) -> str:
    """``graph_pieces`` as text: one line per piece, graphs with their op counts, eager steps with
    their op; compiled pieces also with the modules they cover and the custom ops inside them."""
    desc = _descriptor(runner, desc)
    pieces = graph_pieces(runner, desc)
    where = _where(runner)
    graphs = [p for p in pieces if not p.eager]
    head = (f"{desc}, {_flavor(runner, desc)} ({where}): {len(graphs)} graph(s), "
            f"{sum(p.num_ops for p in graphs)} ops; {len(pieces) - len(graphs)} eager step(s)")
    width = max(len(p.name) for p in pieces)
    lines = [head]
    for p in pieces:
        if p.eager:
            where_op = f" at {p.span}" if p.span else ""
            lines.append(f"  {p.name:<{width}}  eager  {p.op}{where_op}: its Python runs at every step")
        else:
            inside = f"; inside: {p.op}" if p.op else ""
            covers = f"  {p.span}{inside}" if p.span else ""
            lines.append(f"  {p.name:<{width}}  graph  {p.num_ops:3d} ops{covers}")
    return "\n".join(lines)


def _short_op(op: str) -> str:
    """``"cglab::unified_attention"`` -> ``"attn"``: the layer kind whose kernel the op is."""
    kinds = {name: kind for kind, name in OP_OF_KIND.items()}
    return kinds.get(op, op.split("::")[-1].lstrip("_"))


def draw_graph_anatomy(graphs: Mapping[str, CapturedGraph | Sequence[Piece]]) -> Figure:
    """Each graph as its replay sequence: graphs (width = ops recorded) and eager steps.

    A value is a captured graph, or its ``graph_pieces`` (then compiled pieces carry their names).
    """
    fig = Figure(figsize=(9, 0.9 * len(graphs) + 1.2), dpi=DPI)
    ax = fig.add_subplot()
    rows = [_steps_as_pieces(g) if isinstance(g, CapturedGraph) else list(g) for g in graphs.values()]
    longest = max((sum(p.num_ops for p in pieces if not p.eager) for pieces in rows), default=0)
    eager_width = max(5.0, 0.05 * longest)  # wide enough for its label whatever the scale
    height = 0.55
    widest = 0.0
    for row, pieces in enumerate(rows):
        x = 0.0
        y = len(graphs) - 1 - row
        for piece in pieces:
            if piece.eager:
                ax.barh(y, eager_width, left=x, height=height, color=_EAGER, edgecolor="black")
                ax.text(x + eager_width / 2, y, _short_op(piece.op), ha="center", va="center", fontsize=7)
                x += eager_width
                continue
            width = max(piece.num_ops, 1)
            ax.barh(y, width, left=x, height=height, color=_SEGMENT if piece.num_ops else "white",
                    edgecolor="black", hatch="" if piece.num_ops else "//")
            ax.text(x + width / 2, y, str(piece.num_ops), ha="center", va="center", fontsize=8,
                    color="white" if piece.num_ops else "black")
            if piece.name.startswith("submod"):
                ax.text(x + width / 2, y + height / 2 + 0.04, piece.name, ha="center", va="bottom", fontsize=7)
            x += width
        widest = max(widest, x)
    ax.set_yticks(range(len(graphs)), list(reversed(list(graphs))))
    ax.set_ylim(-0.6, len(graphs) - 0.25)
    ax.set_xlim(0, widest * 1.02)
    ax.set_xlabel("replay order, left to right (a graph's width and number: the ops it recorded)")
    ax.legend(handles=[Patch(color=_SEGMENT, label="graph: replays what it recorded"),
                       Patch(color=_EAGER, label="eager step: its Python runs, reading live metadata")],
              loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize="small", frameon=False)
    fig.tight_layout()
    return fig


def describe_replays(runner: ModelRunner) -> str:
    """How often each compiled piece's graph has replayed, per PIECEWISE descriptor it was captured for."""
    compiled = runner.cudagraph_manager.compiled if runner.cudagraph_manager else None
    if compiled is None or not compiled.wrappers:
        raise ConfigError("no compiled PIECEWISE pieces here: build the runner with a policy that captures "
                          "PIECEWISE graphs and piecewise_flavor='compiled'")
    descs = list(next(iter(compiled.wrappers.values())).entries)
    headers = [f"tokens={d.num_tokens}" for d in descs]
    width = max(len(name) for name in compiled.wrappers)
    lines = [f"{'replays':<{width}}  " + "  ".join(headers)]
    for name, wrapper in compiled.wrappers.items():
        counts = [wrapper.entries[d].replays if d in wrapper.entries else "-" for d in descs]
        lines.append(f"{name:<{width}}  " + "  ".join(f"{c:>{len(h)}}" for c, h in zip(counts, headers)))
    return "\n".join(lines)


# ------------------------------------------------------------ which Python runs at replay


class _ReplayTracer:
    """A profile hook that notes the calls that matter in one step's replay, as an indented tree.

    It starts at ``ModelRunner.execute``, so the runner's own preparation (which runs at every step
    whatever the mode) is left out. Calls it has no label for are not listed, but their callees are.
    """

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        manager = runner.cudagraph_manager
        self.compiled = manager.compiled if manager else None
        self.kernels = _op_of_impl()
        self.module_names = {id(m): name for name, m in runner.model.named_modules()}
        self.forward_code = ToyTransformer.forward.__code__
        self.lines: list[str] = []
        self.stack: list[tuple[FrameType, bool]] = []  # frames entered since execute; True if listed
        self.started = self.done = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.done:
            return
        if event == "call":
            if not self.started:
                if frame.f_code is not ModelRunner.execute.__code__:
                    return
                self.started = True
            label = self.label(frame)
            if label is not None:
                depth = sum(listed for _, listed in self.stack)
                self.lines.append("  " * depth + label)
            self.stack.append((frame, label is not None))
        elif event == "return" and self.stack and self.stack[-1][0] is frame:
            self.stack.pop()
            self.done = not self.stack  # ModelRunner.execute returned

    def _parent_is_wrapper(self) -> bool:
        listed = [f for f, shown in self.stack if shown]
        return bool(listed) and isinstance(listed[-1].f_locals.get("self"), CUDAGraphWrapper)

    def label(self, frame: FrameType) -> str | None:
        code, this = frame.f_code, frame.f_locals.get("self")
        if code is ModelRunner.execute.__code__:
            return f"ModelRunner.execute: {frame.f_locals['prepared'].descriptor} ({_where(self.runner)})"
        if code in self.kernels:
            return f"{code.co_name}: the Python body of {self.kernels[code]}, run eagerly"
        if code.co_name == "replay" and isinstance(this, GraphSegment):
            return f"graph replay: {this.num_ops} ops, as recorded at capture"
        if code.co_name == "replay" and isinstance(this, PiecewiseGraph):
            return "PiecewiseGraph.replay: calls the compiled forward again"
        if code.co_name == "replay" and isinstance(this, CapturedGraph):
            return None if self._parent_is_wrapper() else "CapturedGraph.replay: the recorded steps, in order"
        if code.co_name == "replay" and isinstance(this, EagerStep):
            return "EagerStep.replay"
        if code.co_name == "__call__" and isinstance(this, CUDAGraphWrapper):
            mode = get_forward_context().cg_mode
            if mode is this.runtime_mode:
                return f"CUDAGraphWrapper({this.name}): replays its graph for this descriptor"
            return f"CUDAGraphWrapper({this.name}): mode {mode.name} is not its own, so it runs the piece"
        if code.co_name == "forward" and isinstance(this, torch.fx.GraphModule) and self.compiled is not None:
            if this is self.compiled.split_gm:
                return "split graph forward (Python generated by the compiler): calls the submodules in order"
            item = next((i for i in self.compiled.items if i.graph is this), None)
            if item is None:
                return None
            what = "a splitting op" if item.is_splitting_graph else "a piece, run eagerly"
            return f"{item.submod_name}.forward (generated Python of {what})"
        if code.co_name == "forward" and isinstance(this, ToyTransformer) and code != self.forward_code:
            return "ToyTransformer.forward, as rewritten by dynamo: calls the compiled graph"
        if code.co_name == "forward" and isinstance(this, nn.Module) and id(this) in self.module_names:
            name = self.module_names[id(this)]
            return f"{type(this).__name__}.forward" + (f" ({name})" if name else "")
        return None


def trace_replay(runner: ModelRunner, scheduled: Mapping[str, Sequence[int]], eager: bool = False) -> str:
    """Run one step (``runner.step(scheduled, eager)``) and list the Python calls that run while it
    executes: the graph machinery, generated code, model modules and op bodies, nested as called.
    The runner's preparation of the step (buffers, metadata, dispatch) is left out."""
    tracer = _ReplayTracer(runner)
    previous: Callable[..., Any] | None = sys.getprofile()
    sys.setprofile(tracer)
    try:
        runner.step(scheduled, eager=eager)
    finally:
        sys.setprofile(previous)
    return "\n".join(tracer.lines)


def draw_padding(dispatcher: CudagraphDispatcher, max_tokens: int) -> Figure:
    """The graph size each batch size runs in, and the padded rows it costs (eager past the last size)."""
    tokens = np.arange(1, max_tokens + 1)
    fig = Figure(figsize=(8, 3.4), dpi=DPI)
    ax = fig.add_subplot()
    modes = [m for m in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL) if m in dispatcher.policy.runtime_modes()]
    for mode, style in zip(modes, ("-", "--")):
        uniform = mode is CUDAGraphMode.FULL
        padded = [dispatcher.dispatch(n, n, uniform_decode=uniform) for n in tokens]
        size = np.array([d.num_tokens if d.cg_mode is not CUDAGraphMode.NONE else np.nan for d in padded])
        ax.step(tokens, size, where="mid", ls=style, label=f"{mode.name} graph size")
        ax.fill_between(tokens, tokens, size, step="mid", alpha=0.15)
    ax.plot(tokens, tokens, color="black", lw=0.8, label="real tokens (no padding)")
    ax.set_xlabel("tokens in the batch")
    ax.set_ylabel("tokens the graph computes")
    ax.set_title("padding to the next capture size (shaded: wasted rows; no line: runs eagerly)")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def draw_divergence(results: Mapping[str, ReproResult]) -> Figure:
    """Left: replay-vs-eager logit difference at every decode step. Right: each cache's difference
    from the eager reference after the last step."""
    fig = Figure(figsize=(11, 3.6), dpi=DPI)
    steps_ax, state_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.3, 1]})
    floor = 1e-9  # exact agreement plotted at the floor of the log scale
    tolerance = min((r.tolerance for r in results.values()), default=1e-4)
    for label, result in results.items():
        diffs = np.maximum(np.asarray(result.step_diffs, dtype=float), floor)
        steps_ax.semilogy(np.arange(1, len(diffs) + 1), diffs, marker="o", ms=3, label=label)
    steps_ax.axhline(tolerance, color="gray", ls="--", lw=1, label="tolerance (rounding)")
    steps_ax.set_ylim(floor / 2, 10)
    steps_ax.set_xlabel("decode step")
    steps_ax.set_ylabel("max |replay - eager| (logits)")
    steps_ax.legend(fontsize="small", frameon=False)
    names = sorted({n for r in results.values() for n in r.state_diffs})
    height = 0.8 / max(len(results), 1)
    for i, (label, result) in enumerate(results.items()):
        values = [result.state_diffs.get(n, 0.0) for n in names]
        state_ax.barh(np.arange(len(names)) + i * height, values, height=height, label=label)
    state_ax.set_yticks(np.arange(len(names)) + height * (len(results) - 1) / 2, names, fontsize=8)
    state_ax.invert_yaxis()
    state_ax.set_xlabel("max |cache - eager cache| after the last step")
    state_ax.legend(fontsize="small", frameon=False, loc="lower right")
    fig.tight_layout()
    return fig
