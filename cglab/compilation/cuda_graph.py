"""``CUDAGraphWrapper``: a runnable captured once per batch descriptor, replayed after.

vLLM: ``vllm/compilation/cuda_graph.py`` (one per compiled piece) and ``breakable_cudagraph.py`` (around
the whole model). In the forward context's mode it replays the descriptor's graph, or captures one;
in any other mode it just runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cglab.config import CUDAGraphMode
from cglab.errors import RELEASED, AddressChangedError, CaptureError
from cglab.forward_context import get_forward_context
from cglab.graphs import CapturedGraph, GraphBackend

# Whether wrappers may capture: a ContextVar, as the capture in progress is (``graphs.is_capturing``),
# so one thread's capture never lets another thread's wrappers record.
_CAPTURING_ENABLED: ContextVar[bool] = ContextVar("cglab_cudagraph_capturing_enabled", default=False)


@contextlib.contextmanager
def cudagraph_capturing_enabled() -> Iterator[None]:
    """Let wrappers capture new graphs; outside it, a PIECEWISE step with no graph is an error."""
    token = _CAPTURING_ENABLED.set(True)
    try:
        yield
    finally:
        _CAPTURING_ENABLED.reset(token)


@dataclass
class CUDAGraphEntry:
    graph: CapturedGraph
    output: Any  # the static output: the graph rewrites it at every replay
    input_addresses: list[int]  # data_ptr of each tensor argument at capture (the debug check)
    replays: int = 0  # how often this graph served a step (a test that never replays proves nothing)


class CUDAGraphWrapper(nn.Module):
    """Wraps ``runnable`` (a piece, or with ``breakable=True`` the whole model) for one runtime mode.
    ``check_addresses``: vLLM's debug check that tensor arguments live where they lived at capture."""

    def __init__(
        self,
        runnable: Callable[..., Any],
        backend: GraphBackend,
        name: str,
        runtime_mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE,
        check_addresses: bool = False,
        breakable: bool = False,
    ) -> None:
        assert runtime_mode is not CUDAGraphMode.NONE, "a wrapper must have a graph mode"
        super().__init__()
        self.runnable = runnable  # a submodule when it is one (an FX piece, the model)
        self.breakable = breakable
        self.backend = backend
        self.name = name
        self.runtime_mode = runtime_mode
        self.check_addresses = check_addresses
        self.entries: dict[Any, CUDAGraphEntry] = {}
        self.released = False

    def forward(self, *args: Any) -> Any:
        context = get_forward_context()
        if context.cg_mode is not self.runtime_mode:
            return self.runnable(*args)
        desc = context.batch_descriptor
        if desc is None:
            raise CaptureError(
                f"{self.name}: a {self.runtime_mode.name} step needs a batch descriptor in the "
                "forward context; pass it to set_forward_context(..., batch_descriptor=desc)"
            )
        entry = self.entries.get(desc)
        if entry is None:
            return self._capture(desc, args)
        if self.check_addresses:
            self._check(desc, entry, args)
        self._replay(entry)
        return entry.output

    def _replay(self, entry: CUDAGraphEntry) -> None:
        entry.graph.replay()
        entry.replays += 1

    def _capture(self, desc: Any, args: tuple[Any, ...]) -> Any:
        if self.released:
            raise CaptureError(f"{self.name} cannot replay {desc}: {RELEASED}")
        if not _CAPTURING_ENABLED.get():
            captured = ", ".join(map(str, self.entries)) or "none"
            raise CaptureError(
                f"{self.name} has no graph for {desc} (captured: {captured}) and graphs are only "
                "captured at start-up; dispatch the batch to a captured size or run it eagerly"
            )
        graph, output = self.backend.capture(lambda: self.runnable(*args), breakable=self.breakable)
        addresses = [a.data_ptr() for a in args if isinstance(a, torch.Tensor)]
        self.entries[desc] = CUDAGraphEntry(graph, output, addresses)
        return output

    def _check(self, desc: Any, entry: CUDAGraphEntry, args: tuple[Any, ...]) -> None:
        now = [a.data_ptr() for a in args if isinstance(a, torch.Tensor)]
        moved = [i for i, (a, b) in enumerate(zip(now, entry.input_addresses)) if a != b]
        if moved or len(now) != len(entry.input_addresses):
            raise AddressChangedError(
                f"{self.name}, {desc}: tensor argument(s) {moved} live elsewhere than at capture, so the graph "
                "would read stale memory; pass the same (persistent) tensors at every replay"
            )

    def release(self) -> None:
        """Drop every graph (their memory returns to the pool once nothing uses it)."""
        for entry in self.entries.values():
            entry.graph.reset()
        self.entries.clear()
        self.released = True
