"""The torch.compile backend that splits the model at its splitting ops (vLLM: ``VllmBackend``,
``split_graph`` and ``PiecewiseBackend`` in ``vllm/compilation/``).

Dynamo traces the whole forward into one FX graph once, with a symbolic token count. The backend
cuts that graph before and after every call of an op named in ``splitting_ops`` (attention), so the
graph becomes a chain of submodules: pieces, and splitting ops between them. Each piece is compiled
(inductor on a GPU; on a CPU the FX piece runs as it is, so the simulator records its aten ops and
no C++ toolchain is needed) and, when the policy captures PIECEWISE graphs, wrapped in a
``CUDAGraphWrapper``. The splitting ops are neither compiled nor wrapped: they run eagerly at every
PIECEWISE step, so they read the live metadata. The split stays under every policy: a FULL graph is
captured around the split model (vLLM #20059), and a batch with no graph runs it eagerly.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx.passes.split_module import split_module

from cglab.compilation.cuda_graph import CUDAGraphWrapper
from cglab.graphs import GraphBackend


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
    symbolic token count, once (GPU). ``piecewise=False`` (FULL-only policies) splits but wraps nothing.
    """

    def __init__(
        self,
        graph_backend: GraphBackend,
        splitting_ops: Sequence[str],
        *,
        piecewise: bool,
        compiler: str = "eager",
        check_addresses: bool = False,
    ) -> None:
        self.graph_backend = graph_backend
        self.splitting_ops = tuple(splitting_ops)
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
                wrapper = CUDAGraphWrapper(
                    getattr(self.split_gm, name), self.graph_backend, name, check_addresses=self.check_addresses
                )
                setattr(self.split_gm, name, wrapper)  # a submodule of the split graph, as upstream
                self.wrappers[name] = wrapper
        return self.split_gm


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
