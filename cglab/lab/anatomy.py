"""The anatomy of a captured step: the pieces its graph is made of, and the Python that runs at replay."""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

import torch

from cglab.batch import BatchExecutionDescriptor
from cglab.compilation import CompiledModel, CUDAGraphWrapper
from cglab.compilation.backends import op_name
from cglab.config import CUDAGraphMode
from cglab.custom_ops import custom_op_impl, registered_op_names
from cglab.errors import ConfigError
from cglab.forward_context import get_forward_context
from cglab.graphs import CapturedGraph, EagerStep, GraphSegment
from cglab.runner import ModelRunner


@dataclass(frozen=True)
class Piece:
    """One step of a captured forward as it runs at replay: a graph, or Python run eagerly."""

    name: str  # "submod_2" (a piece of the split graph), "segment 1" (a breakable or FULL capture), "eager step"
    eager: bool  # runs its Python at every step (a splitting op, an eager break); nothing recorded
    num_ops: int = 0  # ops a graph recorded at capture (kernels on a GPU); 0 for an eager step
    op: str = ""  # an eager step's op; the custom ops frozen inside a compiled piece
    span: str = ""  # the model modules a compiled piece covers, first to last


def _op_of_impl() -> dict[CodeType, str]:
    """The code of each cglab custom op's Python body -> the op's name (``"cglab::short_conv"``)."""
    impls = {op: custom_op_impl(getattr(torch.ops.cglab, op.split("::")[1]).default) for op in registered_op_names()}
    return {inspect.unwrap(impl).__code__: op for op, impl in impls.items() if impl is not None}


def _eager_op(step: EagerStep) -> str:
    """The op an eager step runs: from its Python body (breakable) or its name (``"cglab::op (submod_1)"``)."""
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
    span = "" if not paths else paths[0] if paths[0] == paths[-1] else f"{paths[0]} … {paths[-1]}"
    return span, ", ".join(n for n in map(op_name, nodes) if n)


def steps_as_pieces(graph: CapturedGraph) -> list[Piece]:
    """A plain capture's steps, in order: its segments (graphs) and eager steps."""
    pieces: list[Piece] = []
    for step in graph.steps:
        if isinstance(step, EagerStep):
            pieces.append(Piece("eager step", True, op=_eager_op(step)))
        else:
            pieces.append(Piece(f"segment {sum(not p.eager for p in pieces)}", False, step.num_ops))
    return pieces


def _descriptor(runner: ModelRunner, desc: BatchExecutionDescriptor | None) -> BatchExecutionDescriptor:
    captured = runner.graph_replays()
    if not captured:
        raise ConfigError("this runner captured no graphs; build one with a graph mode such as 'piecewise'")
    if desc is None:
        return next(iter(captured))  # the first one captured: the largest of the first mode
    if desc not in captured:
        raise ConfigError(f"no graph was captured for {desc}; captured: {', '.join(map(str, captured))}")
    return desc


def graph_pieces(runner: ModelRunner, desc: BatchExecutionDescriptor | None = None) -> list[Piece]:
    """What the graph of ``desc`` (default: the first captured) runs at replay, in order."""
    desc, compiled = _descriptor(runner, desc), runner.compiled_backend
    # Compiled PIECEWISE: one piece per submodule of the split graph. Breakable PIECEWISE and FULL: the steps
    # of their one capture.
    if desc.cg_mode is CUDAGraphMode.FULL or compiled is None:  # one capture: FULL, or the breakable wrapper's
        return steps_as_pieces(runner.captured_graphs(desc)[0])
    pieces = []
    for item in compiled.items:
        span, ops = _span_and_ops(item.graph)
        wrapper = compiled.wrappers.get(item.submod_name)  # none around a splitting op: it runs eagerly
        num_ops = 0 if wrapper is None else wrapper.entries[desc].graph.num_ops
        pieces.append(Piece(item.submod_name, wrapper is None, num_ops, ops, span))
    return pieces


def _flavor(runner: ModelRunner, desc: BatchExecutionDescriptor) -> str:
    if desc.cg_mode is CUDAGraphMode.FULL:
        return f"one capture of the {'compiled, split ' if runner.compiled_backend is not None else ''}model"
    if runner.compilation_config.use_breakable_cg:
        return "breakable, cut at its eager breaks"
    if not runner.compilation_config.splitting_ops:
        return "compiled, with no splitting op in this model"
    return f"compiled, split at {', '.join(runner.compilation_config.splitting_ops)}"


def _where(runner: ModelRunner) -> str:  # for output that differs by backend: simulator, cuda, eager
    return "simulator" if runner.backend_name == "sim" else runner.backend_name


def describe_pieces(runner: ModelRunner, desc: BatchExecutionDescriptor | None = None) -> str:
    """``graph_pieces`` as text, one line per piece."""
    desc = _descriptor(runner, desc)
    pieces = graph_pieces(runner, desc)
    graphs = [p for p in pieces if not p.eager]
    lines = [  # two lines: each fits beside JupyterLab's file browser at 1280 pixels
        f"{desc}, {_flavor(runner, desc)} ({_where(runner)}):",
        f"  {len(graphs)} graph(s), {sum(p.num_ops for p in graphs)} ops; {len(pieces) - len(graphs)} eager step(s)",
    ]
    width = max(len(p.name) for p in pieces)
    for p in pieces:
        if p.eager:
            what = f"eager  {p.op}{f' at {p.span}' if p.span else ''}: its Python runs at every step"
        else:
            inside = f"; inside: {p.op}" if p.op else ""
            what = f"graph  {p.num_ops:3d} ops{f'  {p.span}{inside}' if p.span else ''}"
        lines.append(f"  {p.name:<{width}}  {what}")
    return "\n".join(lines)


def describe_replays(runner: ModelRunner) -> str:
    """How often each compiled piece's graph has replayed, per PIECEWISE descriptor it was captured for."""
    runner.check_open()
    compiled = runner.compiled_backend
    if compiled is None or not compiled.wrappers:
        raise ConfigError("no compiled PIECEWISE pieces: build one in a PIECEWISE mode with use_breakable_cg=False")
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
    """A profile hook noting, as an indented tree, the calls it has a label for from ``ModelRunner.execute`` on."""

    def __init__(self, runner: ModelRunner) -> None:
        self.where, self.kernels = _where(runner), _op_of_impl()
        # The label of each module whose forward runs Python worth listing: the model's, the compiler's.
        self.forwards = {
            id(m): f"{type(m).__name__}.forward" + (f" ({name})" if name else "")
            for name, m in runner.model.named_modules()
        }
        if (compiled := runner.compiled_backend) is not None:
            split = "split graph forward (Python generated by the compiler): calls the submodules in order"
            self.forwards[id(compiled.split_gm)] = split
            for item in compiled.items:
                what = "a splitting op" if item.is_splitting_graph else "a piece, run eagerly"
                self.forwards[id(item.graph)] = f"{item.submod_name}.forward (generated Python of {what})"
        self.lines: list[str] = []
        self.stack: list[tuple[FrameType, bool]] = []  # frames entered since execute; True if listed

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.stack and frame.f_code is not ModelRunner.execute.__code__:
            return
        if event == "call":
            label = self.label(frame.f_code, frame.f_locals)
            if label is not None:
                self.lines.append("  " * sum(listed for _, listed in self.stack) + label)
            self.stack.append((frame, label is not None))
        elif event == "return" and self.stack[-1][0] is frame:
            self.stack.pop()  # empty once ModelRunner.execute returned: later calls are not listed

    def label(self, code: CodeType, local: dict[str, Any]) -> str | None:
        this, name = local.get("self"), code.co_name
        if code is ModelRunner.execute.__code__:
            return f"ModelRunner.execute: {local['prepared'].descriptor} ({self.where})"
        if code in self.kernels:
            return f"{name}: the Python body of {self.kernels[code]}, run eagerly"
        if code is CompiledModel.__call__.__code__:
            return "CompiledModel: calls the compiled graph directly (dynamo traced the model once, at start-up)"
        if name == "run_fullgraph":
            return "CudaGraphManager.run_fullgraph: replays the FULL graph, no forward context"
        if name == "replay" and isinstance(this, GraphSegment):
            return f"graph replay: {this.num_ops} ops, as recorded at capture"
        if name == "replay" and isinstance(this, EagerStep):
            return "EagerStep.replay"
        if name == "replay" and isinstance(this, CapturedGraph):  # under a wrapper: the wrapper says it
            caller = next(f for f, listed in reversed(self.stack) if listed).f_locals.get("self")
            if not isinstance(caller, CUDAGraphWrapper):
                return "CapturedGraph.replay: the recorded steps, in order"
        if name == "forward" and isinstance(this, CUDAGraphWrapper):
            mode = get_forward_context().cg_mode
            what = "replays its graph for this descriptor"
            if mode is not this.runtime_mode:
                what = f"mode {mode.name} is not its own, so it runs the piece"
            return f"CUDAGraphWrapper({this.name}): {what}"
        return self.forwards.get(id(this)) if name == "forward" else None


def trace_replay(runner: ModelRunner, scheduled: Mapping[str, Sequence[int]], eager: bool = False) -> str:
    """Run ``runner.step(scheduled, eager)`` and list, nested as called, the Python its execution runs."""
    tracer = _ReplayTracer(runner)
    previous: Callable[..., Any] | None = sys.getprofile()
    sys.setprofile(tracer)
    try:
        runner.step(scheduled, eager=eager)
    finally:
        sys.setprofile(previous)
    return "\n".join(tracer.lines)
