"""Compiling the model once for every token count (vLLM: ``support_torch_compile`` in
``vllm/compilation/decorators.py`` and ``TorchCompileWithNoGuardsWrapper`` in ``wrapper.py``).

The token dimension is marked dynamic, so dynamo traces one graph with a symbolic size; then, as vLLM
does, every guard is dropped: that graph serves every later call, whatever its size or dispatch mode.
"""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from cglab.compilation.backends import CglabBackend
from cglab.compilation.cuda_graph import CUDAGraphWrapper
from cglab.compilation_config import CompilationConfig
from cglab.config import CUDAGraphMode
from cglab.errors import CaptureError
from cglab.forward_context import forward_context_has_metadata
from cglab.graphs import GraphBackend


def fresh_forward(model: nn.Module) -> Callable[..., torch.Tensor]:
    """``model.forward`` with a code object of its own: dynamo caps the graphs it keeps per code object."""
    # Marked here, before the first trace, not with a decorator: that imports dynamo (2 s) in every process.
    torch.compiler.assume_constant_result(forward_context_has_metadata)
    fn = type(model).forward
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__qualname__, copy.__doc__ = fn.__qualname__, fn.__doc__
    return types.MethodType(copy, model)


def _size_oblivious() -> contextlib.AbstractContextManager[None]:
    config = torch.fx.experimental._config
    if "backed_size_oblivious" in getattr(config, "_config", {}):
        return config.patch(backed_size_oblivious=True)
    return contextlib.nullcontext()


def compile_forward(model: nn.Module, backend: Callable[..., Any]) -> Callable[..., Any]:
    """``model.forward`` through ``torch.compile`` with ``backend``, every guard dropped."""
    return torch.compile(
        fresh_forward(model),
        backend=backend,
        fullgraph=True,
        dynamic=False,
        options={"guard_filter_fn": lambda guards: [False for _ in guards]},
    )


def trace(compiled: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> Any:
    """The first call of ``compiled``: dynamo traces it with the token dimension of ``inputs`` symbolic."""
    for tensor in inputs:
        torch._dynamo.mark_dynamic(tensor, 0)
    try:
        with _size_oblivious():
            return compiled(*inputs)
    except torch._dynamo.exc.TorchDynamoException as exc:
        if isinstance(getattr(exc, "inner_exception", None), CaptureError):  # raised by the backend
            raise exc.inner_exception from None
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise CaptureError(
            f"torch.compile could not trace the model into one graph ({first}). The model's Python outside "
            "its custom ops is traced once for every size: keep host reads (.item(), printing) and "
            "data-dependent branches out of it, inside a custom op or before the step; or use "
            "piecewise_flavor='breakable', which does not compile"
        ) from exc


class CompiledModel:
    """Calls the model through ``torch.compile`` with ``backend``. The first call traces ``forward`` and hands
    the graph to ``backend``, which splits and wraps it; every later call runs that code, with no guard."""

    trace_reused = False  # set by the trace cache that tests and notebooks install (caching.py)

    def __init__(self, model: nn.Module, backend: CglabBackend) -> None:
        self.model = model
        self.backend = backend
        # Wall time of the call that compiled (tracing, splitting, compiling the pieces, one run):
        # vLLM logs this apart from capture time, since caches can remove it and nothing else.
        self.compile_seconds: float | None = None
        self.traced_num_tokens: int | None = None  # the size dynamo traced at (its hint for every size)
        # Built at the first call: a model whose trace is reused (caching.py) never needs torch.compile's wrapper.
        self._compiled: Callable[..., Any] | None = None

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self.compile_seconds is not None:
            return self._compiled_forward()(*inputs)
        start = time.perf_counter()
        self.traced_num_tokens = inputs[0].shape[0]
        try:
            return self.compile(*inputs)
        finally:  # also when the run after the trace raised (a strict layer): the trace itself is done
            self.compile_seconds = time.perf_counter() - start

    def compile(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The first call: trace, split, compile the pieces, and run once (the trace cache replaces this)."""
        return trace(self._compiled_forward(), inputs)

    def _compiled_forward(self) -> Callable[..., Any]:
        if self._compiled is None:
            self._compiled = compile_forward(self.model, self.backend)
        return self._compiled


def build_forward_model(model: nn.Module, cc: CompilationConfig, graph_backend: GraphBackend | None) -> Any:
    """What every step calls, for a resolved ``cc``: the model; or the model through torch.compile, split
    at ``cc.splitting_ops`` (a wrapper per piece under PIECEWISE); or (breakable) one breakable wrapper."""
    if graph_backend is None:
        return model
    piecewise = CUDAGraphMode.PIECEWISE in cc.cudagraph_mode.runtime_modes()
    if not cc.use_breakable_cg:
        backend = CglabBackend(
            graph_backend,
            cc.splitting_ops,
            piecewise=piecewise,
            compiler=cc.backend,
            check_addresses=cc.check_addresses,
        )
        return CompiledModel(model, backend)
    if piecewise:
        return CUDAGraphWrapper(
            model, graph_backend, type(model).__name__, check_addresses=cc.check_addresses, breakable=True
        )
    return model


def piecewise_wrappers(forward_model: object) -> list[CUDAGraphWrapper]:
    """The wrappers holding ``build_forward_model``'s PIECEWISE graphs."""
    if isinstance(forward_model, CompiledModel):
        return list(forward_model.backend.wrappers.values())
    return [forward_model] if isinstance(forward_model, CUDAGraphWrapper) else []
