"""The torch.compile backend that splits the model at its splitting ops (vLLM: ``VllmBackend``,
``split_graph`` and ``PiecewiseBackend`` in ``vllm/compilation/``).

Dynamo traces the whole forward into one FX graph once, with a symbolic token count. The backend
cuts that graph before and after every call of an op named in ``splitting_ops`` (attention), so the
graph becomes a chain of submodules: pieces, and splitting ops between them. Each piece is compiled
(inductor on a GPU; on a CPU the FX piece runs as it is, so the simulator records its aten ops and
no C++ toolchain is needed) and, when the policy captures PIECEWISE graphs, wrapped in a
``CUDAGraphWrapper``. The splitting ops are neither compiled nor wrapped: they run eagerly at every
step, so they read the live metadata. Everything inside a piece is frozen at capture.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx.passes.split_module import split_module

from cglab.compilation.cuda_graph import CUDAGraphWrapper
from cglab.errors import CaptureError, ConfigError
from cglab.graphs import CapturedGraph, EagerStep, GraphBackend, GraphSegment
from cglab.graphs.capture_driver import Step

COMPILERS = ("eager", "inductor")
COMPILE_BACKEND_ENV = "CGLAB_COMPILE_BACKEND"


def auto_compiler(device_type: str) -> str:
    """What ``compile_backend="auto"`` means: ``$CGLAB_COMPILE_BACKEND`` where it is set, else inductor
    on CUDA (vLLM's) and eager on the CPU (the simulator records the FX pieces' aten ops, no C++
    toolchain needed). The notebooks set it to eager on a GPU (``cglab.lab.notebook.setup_notebook``)."""
    chosen = os.environ.get(COMPILE_BACKEND_ENV, "").strip().lower()
    if chosen and chosen not in COMPILERS:
        raise ConfigError(f"{COMPILE_BACKEND_ENV}={os.environ[COMPILE_BACKEND_ENV]!r} is not a compile backend; "
                          f"set it to {' or '.join(COMPILERS)}, or unset it (inductor on CUDA, eager on the CPU)")
    return chosen or ("inductor" if device_type == "cuda" else "eager")


def op_name(node: torch.fx.Node) -> str | None:
    """``"cglab::unified_attention"`` for a node that calls a custom op, else None."""
    target = node.target
    if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
        return target._schema.name
    return None


@dataclass
class SplitItem:
    submod_name: str  # "submod_3"
    graph_id: int
    is_splitting_graph: bool  # a splitting op: runs eagerly, never captured
    graph: torch.fx.GraphModule


def split_graph(gm: torch.fx.GraphModule, splitting_ops: Sequence[str]) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
    """Cut ``gm`` around every call of a splitting op; each such call becomes a submodule of its own."""
    subgraph_of: dict[torch.fx.Node, int] = {}
    splitting_ids: set[int] = set()
    current = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "call_function" and node.target is operator.getitem and node.args[0] in subgraph_of:
            subgraph_of[node] = subgraph_of[node.args[0]]  # unpacking a result stays with its producer
        elif op_name(node) in splitting_ops:
            current += 1
            subgraph_of[node] = current
            splitting_ids.add(current)
            current += 1
        else:
            subgraph_of[node] = current
    split_gm = split_module(gm, None, lambda node: subgraph_of[node], keep_original_order=True)
    items = []
    for name, submod in split_gm.named_children():
        graph_id = int(name.removeprefix("submod_"))
        items.append(SplitItem(name, graph_id, graph_id in splitting_ids, submod))
    return split_gm, items


def splitting_op_called(item: SplitItem) -> str:
    """The op a splitting submodule calls (for display)."""
    names = [n for n in (op_name(node) for node in item.graph.graph.nodes) if n]
    return ", ".join(names) or item.submod_name


class CglabBackend:
    """A ``torch.compile`` backend: split, compile each piece, wrap each piece for PIECEWISE capture.

    ``compiler``: ``"eager"`` runs each FX piece as it is (CPU); ``"inductor"`` compiles it for the
    symbolic token count, once (GPU). ``piecewise=False`` (FULL-only policies) keeps the graph whole.
    """

    def __init__(self, graph_backend: GraphBackend, splitting_ops: Sequence[str], *, piecewise: bool,
                 compiler: str = "eager", check_addresses: bool = False) -> None:
        self.graph_backend = graph_backend
        self.splitting_ops = tuple(splitting_ops) if piecewise else ()
        self.piecewise = piecewise
        self.compiler = compiler
        self.check_addresses = check_addresses
        self.num_compiles = 0
        self.split_gm: torch.fx.GraphModule | None = None
        self.items: list[SplitItem] = []
        self.wrappers: dict[str, CUDAGraphWrapper] = {}

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.num_compiles += 1
        self.split_gm, self.items = split_graph(gm, self.splitting_ops)
        pieces = [item.submod_name for item in self.items if not item.is_splitting_graph]
        if self.compiler == "inductor":
            _InductorPieces(self.split_gm, pieces).run(*example_inputs)
        if self.piecewise:
            for name in pieces:
                runnable = getattr(self.split_gm, name)
                wrapper = CUDAGraphWrapper(runnable, self.graph_backend, name, check_addresses=self.check_addresses)
                # Not setattr: a GraphModule child must be a Module, and the wrapper is not one.
                self.split_gm.__dict__[name] = wrapper
                self.wrappers[name] = wrapper
        return self.split_gm

    def piecewise_graph(self, desc: Any, run: Callable[[], torch.Tensor], output: torch.Tensor) -> PiecewiseGraph:
        """What capturing ``desc`` made, as one replayable object (see ``PiecewiseGraph``)."""
        pieces: list[tuple[str, Step]] = []
        for item in self.items:
            wrapper = self.wrappers.get(item.submod_name)
            if wrapper is None:
                pieces.append((item.submod_name, SplittingOpStep(item.submod_name, splitting_op_called(item))))
            else:
                pieces.extend((item.submod_name, step) for step in wrapper.entries[desc].graph.steps)
        return PiecewiseGraph(self, desc, pieces, run, output)


class SplittingOpStep(EagerStep):
    """A splitting op between two pieces: it runs eagerly inside every compiled forward."""

    def __init__(self, submod_name: str, op: str) -> None:
        super().__init__(lambda: None, (), {})
        self.name = f"{op} ({submod_name})"


class PiecewiseGraph(CapturedGraph):
    """The graphs of one descriptor under compiled PIECEWISE: one per piece, splitting ops between.

    There is no single graph to launch: ``replay()`` runs the compiled forward again, where each
    piece's wrapper replays its graph and each splitting op runs eagerly with the live metadata.
    """

    def __init__(self, backend: CglabBackend, desc: Any, pieces: list[tuple[str, Step]],
                 run: Callable[[], torch.Tensor], output: torch.Tensor) -> None:
        super().__init__(backend.graph_backend.name, [step for _, step in pieces], f"compiled PIECEWISE {desc}")
        self.pieces = pieces  # (submodule name, its graph segment or its splitting op), in order
        self._backend, self._desc, self._run, self.output = backend, desc, run, output

    def describe(self) -> str:
        head, *_ = super().describe().splitlines()
        lines = [f"{name}: {step.num_ops} ops (graph{', empty' if not step.num_ops else ''})"
                 if isinstance(step, GraphSegment) else f"{name}: eager {step.name.split(' (')[0]}"
                 for name, step in self.pieces]
        return "\n".join([head, *lines])

    def replay(self) -> None:
        if self._is_reset:
            raise CaptureError("this graph was reset (its memory freed); capture it again to replay")
        out = self._run()
        if out is not self.output:  # the last piece's static output, unless a splitting op ends the model
            self.output.copy_(out)

    def reset(self) -> None:
        for wrapper in self._backend.wrappers.values():
            wrapper.release(self._desc)
        self._run = lambda: self.output
        self._is_reset = True


class _InductorPieces(torch.fx.Interpreter):
    """Runs the split graph on the fake inputs dynamo traced with and compiles each piece with
    inductor on the way, for the symbolic shapes it sees there (so sizes share one compiled piece)."""

    def __init__(self, split_gm: torch.fx.GraphModule, pieces: list[str]) -> None:
        super().__init__(split_gm)
        self.pieces = set(pieces)

    def run(self, *args: Any) -> Any:  # type: ignore[override]
        from torch._dispatch.python import enable_python_dispatcher
        from torch._guards import detect_fake_mode

        fake_mode = detect_fake_mode()
        fake_args = [fake_mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with fake_mode, enable_python_dispatcher():
            return super().run(*fake_args)

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        output = super().call_module(target, args, kwargs)
        if target in self.pieces:
            from torch._inductor.compile_fx import compile_fx

            submod = self.fetch_attr(target)
            self.module.__dict__[target] = compile_fx(submod, list(args))
        return output
