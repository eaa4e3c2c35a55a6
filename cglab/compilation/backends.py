"""The torch.compile backend that splits the model at its splitting ops (vLLM: ``VllmBackend``,
``split_graph`` and ``PiecewiseBackend`` in ``vllm/compilation/``).

The backend cuts dynamo's one FX graph around every call of a ``splitting_ops`` op (attention): a chain
of pieces, each compiled and (PIECEWISE) wrapped in a ``CUDAGraphWrapper``, and splitting ops between
them, which run eagerly on live metadata. A FULL graph is captured around the split model (vLLM #20059).
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


class CglabBackend:
    """A ``torch.compile`` backend: split, compile each piece (``compiler``: ``"eager"`` runs the FX piece as
    it is), and wrap each piece for PIECEWISE capture (``piecewise=False``: wrap nothing)."""

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
    """Runs the split graph on dynamo's fake inputs, compiling each piece with inductor for the symbolic shapes."""

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
