"""Compiling the model once for every token count (vLLM: ``support_torch_compile`` in
``vllm/compilation/decorators.py`` and ``TorchCompileWithNoGuardsWrapper`` in ``wrapper.py``).

The token dimension of the inputs is marked dynamic, so dynamo traces one graph with a symbolic
size ``s0``; ``backed_size_oblivious`` stops it from specialising sizes 0 and 1 while tracing. Then,
as vLLM does, every guard is dropped: the one compiled graph serves every later call, whatever its
size, and also under a graph backend's dispatch mode (a guard would see that as a reason to
trace again). Graphs are then captured per size from that one compiled graph.
"""

from __future__ import annotations

import contextlib
import inspect
import time
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from cglab.compilation import caching
from cglab.compilation.backends import CglabBackend
from cglab.compilation.cuda_graph import CUDAGraphWrapper
from cglab.compilation_config import CompilationConfig
from cglab.config import CUDAGraphMode
from cglab.errors import CaptureError
from cglab.graphs import GraphBackend


def fresh_forward(model: nn.Module) -> Callable[..., torch.Tensor]:
    """``model.forward`` with a code object of its own.

    Dynamo keeps compiled graphs per code object, and caps how many it keeps. vLLM has one model per
    process; a notebook or a test session here builds dozens, each with its own backend, and would hit
    that cap. A private copy of the code gives every model its own cache, freed with the model.
    """
    fn = type(model).forward
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__qualname__, copy.__doc__ = fn.__qualname__, fn.__doc__
    return types.MethodType(copy, model)


def _size_oblivious() -> contextlib.AbstractContextManager[None]:
    config = torch.fx.experimental._config
    if "backed_size_oblivious" in getattr(config, "_config", {}):
        return config.patch(backed_size_oblivious=True)
    return contextlib.nullcontext()


class _Recorder:
    """What dynamo hands its graph to: notes where each placeholder comes from (dynamo drops that once
    it returns), then runs the backend. Dynamo keeps every backend for the life of the process, so
    this holds no model: only the backend and the graph (its tensors are fakes)."""

    def __init__(self, backend: CglabBackend, arg_names: list[str]) -> None:
        self.backend, self.arg_names = backend, arg_names
        self.traced: tuple[torch.fx.GraphModule, caching.GraphInputs] | None = None

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.traced = gm, caching.GraphInputs.of(caching.placeholder_sources(gm), self.arg_names)
        return self.backend(gm, example_inputs)


class CompiledModel:
    """Calls the model through ``torch.compile`` with ``backend``; the token dimension is symbolic.

    The first call traces (or reuses the trace of an identical model, ``caching.py``); every later
    call runs the backend's split graph directly, as vLLM's wrapper runs the compiled code."""

    def __init__(self, model: nn.Module, backend: CglabBackend) -> None:
        self.model = model
        self.backend = backend
        # Wall time of the call that compiled (tracing, splitting, compiling the pieces, one run):
        # vLLM logs this apart from capture time, since caches can remove it and nothing else.
        self.compile_seconds: float | None = None
        self.traced_num_tokens: int | None = None  # the size dynamo traced at (its hint for every size)
        self.trace_reused = False  # the trace came from an identical model's (no dynamo run)
        self._arg_names = [name for name in inspect.signature(type(model).forward).parameters if name != "self"]
        self._bound: list[Any] | None = None
        self._recorder = _Recorder(backend, self._arg_names)
        self._compiled = torch.compile(
            fresh_forward(model),
            backend=self._recorder,
            fullgraph=True,
            dynamic=False,
            options={"guard_filter_fn": lambda guards: [False for _ in guards]},
        )

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Run the model on ``inputs`` (token ids, positions and, for a drafter, hidden states), each
        with the token count as its first dimension."""
        if self._bound is not None:
            assert self.backend.split_gm is not None
            return self.backend.split_gm(*caching.call_args(self._bound, inputs))[0]
        start = time.perf_counter()
        # Inductor compiles the pieces inside dynamo's tracing context: only the eager pieces share.
        fingerprint = caching.trace_fingerprint(self.model, inputs) if self.backend.compiler == "eager" else None
        trace = caching.cached_trace(fingerprint)
        try:
            if trace is not None:  # the same graph through this model's own backend: its own pieces, wrappers
                self.backend(trace.graph, [])
                self._use(trace, start, reused=True)
                return self(*inputs)
            self.traced_num_tokens = inputs[0].shape[0]
            return self._trace(inputs)
        finally:  # also when the run after the trace raised (a strict layer): the trace itself is done
            if self._recorder.traced is not None and self._bound is None:
                trace = caching.Trace(*self._recorder.traced, num_tokens=inputs[0].shape[0])
                caching.save_trace(fingerprint, trace)
                self._use(trace, start, reused=False)

    def _use(self, trace: caching.Trace, start: float, reused: bool) -> None:
        self._bound = trace.inputs.bind(self.model)
        self.traced_num_tokens, self.trace_reused = trace.num_tokens, reused
        self.compile_seconds = time.perf_counter() - start

    def _trace(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        for tensor in inputs:
            torch._dynamo.mark_dynamic(tensor, 0)
        try:
            with _size_oblivious():
                return self._compiled(*inputs)
        except torch._dynamo.exc.TorchDynamoException as exc:
            if isinstance(getattr(exc, "inner_exception", None), CaptureError):  # raised by _Recorder
                raise exc.inner_exception from None
            first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise CaptureError(
                f"torch.compile could not trace the model into one graph ({first}). The model's Python outside "
                "its custom ops is traced once for every size: keep host reads (.item(), printing) and "
                "data-dependent branches out of it, inside a custom op or before the step; or use "
                "piecewise_flavor='breakable', which does not compile"
            ) from exc


def build_forward_model(model: nn.Module, cc: CompilationConfig, graph_backend: GraphBackend) -> nn.Module:
    """What every step calls, for a resolved ``cc`` that captures graphs: the model through torch.compile,
    split at ``cc.splitting_ops`` with a ``CUDAGraphWrapper`` per piece where the policy captures PIECEWISE
    graphs; or (breakable) the plain model, inside one breakable wrapper where it does. The target and
    the drafter both build theirs here (a splitting op the drafter lacks matches no node)."""
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
