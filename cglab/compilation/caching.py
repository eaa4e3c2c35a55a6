"""A test-speed device, off the lesson's path: models with equal fingerprints share one dynamo trace.

A notebook or a test session builds dozens of identical engines in one process, and dynamo's trace is
most of their start-up on a CPU. ``install()`` (called by the tests' conftest and ``setup_notebook``)
replaces ``CompiledModel.compile``: the first model of a fingerprint traces, and notes where each
placeholder of dynamo's graph reads its value (a parameter or buffer, an input or its size); later ones
run their own backend on that graph (their own split graph, pieces, wrappers and graphs) and call it
directly. vLLM's compile cache (``vllm/compilation/caching.py``) saves a compiled forward to disk under
a hash of the configs and the code instead, so that a restart runs no dynamo.
"""

from __future__ import annotations

import inspect
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch
from torch import nn

from cglab.compilation.wrapper import CompiledModel, compile_forward, trace
from cglab.errors import CaptureError
from cglab.forward_context import forward_context_has_metadata

DISABLE_ENV = "CGLAB_DISABLE_COMPILE_CACHE"  # vLLM: VLLM_DISABLE_COMPILE_CACHE
MAX_TRACES = 32  # a long session's distinct models; the oldest trace goes first
_disabled: ContextVar[bool] = ContextVar("cglab_compile_cache_disabled", default=False)

# L['self']._modules['layers']._modules['0']._parameters['weight'], L['input_ids'], L['input_ids'].size()[0]
_SOURCE = re.compile(
    r"L\['(\w+)'\]((?:\._modules\['[^']+'\])*)(?:\._(parameters|buffers)\['([^']+)'\])?"
    r"(?:\.size\(\)\[(\d+)\])?"
)


@dataclass(frozen=True)
class GraphInputs:
    """Where each placeholder of dynamo's graph reads its value at a call: the model's parameter or
    buffer at ``(module path, kind, name)``, or the call's input ``i`` (or its size along a dim)."""

    sources: tuple[tuple[Any, ...], ...]

    @classmethod
    def of(cls, source_names: Sequence[str], arg_names: Sequence[str]) -> GraphInputs:
        sources = []
        for text in source_names:
            match = _SOURCE.fullmatch(text)
            if (
                match is None
                or (match[1] != "self") == bool(match[2] or match[3])
                or (match[1] != "self" and match[1] not in arg_names)
                or (match[1] == "self" and not match[3])
            ):
                raise CaptureError(
                    f"the traced graph reads {text}, which cglab cannot pass to it: forward may read the model's "
                    "parameters and buffers and its tensor arguments only; keep other state out of it"
                )
            if match[1] == "self":
                path = tuple(re.findall(r"_modules\['([^']+)'\]", match[2]))
                sources.append(("model", path, f"_{match[3]}", match[4]))
            else:
                dim = None if match[5] is None else int(match[5])
                sources.append(("input", arg_names.index(match[1]), dim))
        return cls(tuple(sources))

    def bind(self, model: nn.Module) -> list[Any]:
        """Per placeholder: ``(dict, name)`` holding the model's tensor, read again at every call (a
        buffer may be replaced), or ``(input index, dim)``."""
        bound: list[Any] = []
        for source in self.sources:
            if source[0] == "model":
                _, path, kind, name = source
                module = model.get_submodule(".".join(path)) if path else model
                bound.append((getattr(module, kind), name))
            else:
                bound.append((source[1], source[2]))
        return bound


def call_args(bound: list[Any], inputs: Sequence[torch.Tensor]) -> list[Any]:
    """The graph's arguments for one call, in placeholder order."""
    return [
        key[name] if isinstance(key, dict) else (inputs[key] if name is None else inputs[key].size(name))
        for key, name in bound
    ]


@dataclass
class Trace:
    """Dynamo's graph of one model fingerprint, what it reads, and the token count it was traced at."""

    graph: torch.fx.GraphModule
    inputs: GraphInputs
    num_tokens: int


_TRACES: OrderedDict[Hashable, Trace] = OrderedDict()


def _tensor_meta(tensor: torch.Tensor, skip_dims: int = 0) -> tuple[Any, ...]:
    return tuple(tensor.shape[skip_dims:]), tensor.stride()[skip_dims:], tensor.dtype, str(tensor.device)


def _forward_code(module: nn.Module) -> tuple[Any, ...]:
    """The module's ``forward`` and the functions it calls by global name, as objects: a patched or
    redefined one is another object (vLLM hashes the source files dynamo traced)."""
    forward = type(module).forward
    names = getattr(forward, "__code__", None) and forward.__code__.co_names or ()
    found = (getattr(forward, "__globals__", {}).get(name) for name in names)
    return forward, *(obj for obj in found if callable(obj) and not isinstance(obj, type))


def trace_fingerprint(model: nn.Module, inputs: Sequence[torch.Tensor]) -> Hashable | None:
    """What dynamo's trace of ``model`` on ``inputs`` depends on, or None where it cannot be told:
    every module's type, ``forward`` code and plain attributes (configs, flags, layer names), every
    parameter's and buffer's shape, stride, dtype and device, the inputs' (their first dim is
    symbolic), and what the model reads from the forward context while it is traced
    (``python_guards`` layers decide there)."""
    if _disabled.get() or os.environ.get(DISABLE_ENV, "").strip() not in ("", "0"):
        return None
    modules = []
    for name, module in model.named_modules():
        if module._forward_hooks or module._forward_pre_hooks:
            return None
        attrs = []
        for key, value in sorted(vars(module).items()):
            if key.startswith("_"):
                continue
            text = _tensor_meta(value) if isinstance(value, torch.Tensor) else repr(value)
            if " at 0x" in str(text):  # an object without a value repr: no way to tell two apart
                return None
            attrs.append((key, text))
        modules.append((name, type(module), _forward_code(module), tuple(attrs)))
    tensors = tuple((name, _tensor_meta(t)) for name, t in chain(model.named_parameters(), model.named_buffers()))
    return (
        tuple(modules),
        tensors,
        tuple(_tensor_meta(t, 1) for t in inputs),
        forward_context_has_metadata(),
        torch.is_inference_mode_enabled(),
        torch.is_grad_enabled(),
    )


@contextmanager
def disabled() -> Iterator[None]:
    """Every model built inside traces for itself (a start-up benchmark measures a first start)."""
    token = _disabled.set(True)
    try:
        yield
    finally:
        _disabled.reset(token)


def _compile(model: CompiledModel, *inputs: torch.Tensor) -> torch.Tensor:
    """``CompiledModel.compile`` with the cache: reuse the trace of an equal model, or trace and save it."""
    fingerprint = trace_fingerprint(model.model, inputs) if model.backend.compiler == "eager" else None
    saved = _TRACES.get(fingerprint) if fingerprint is not None else None
    if saved is not None:  # the same graph through this model's own backend: its own pieces, wrappers
        _TRACES.move_to_end(fingerprint)
        model.backend(saved.graph, [])
        _use(model, saved, reused=True)
        return model._compiled(*inputs)
    traced: list[Trace] = []
    names = [name for name in inspect.signature(type(model.model).forward).parameters if name != "self"]
    backend, num_tokens = model.backend, inputs[0].shape[0]

    def record(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        # Dynamo keeps this function for the life of the process: it must not hold the model.
        # It reads the placeholders' sources while it may: dynamo drops them once this returns.
        sources = [_source_name(node) for node in gm.graph.find_nodes(op="placeholder")]
        traced.append(Trace(gm, GraphInputs.of(sources, names), num_tokens))
        return backend(gm, example_inputs)

    try:
        return trace(compile_forward(model.model, record), inputs)
    finally:  # also when the run after the trace raised (a strict layer): the trace itself is done
        if traced:
            _use(model, traced[0], reused=False)
            if fingerprint is not None:
                _TRACES[fingerprint] = traced[0]
                while len(_TRACES) > MAX_TRACES:
                    _TRACES.popitem(last=False)


def _source_name(node: torch.fx.Node) -> str:
    grapharg = node.meta.get("grapharg")
    return grapharg.source.name if grapharg is not None and grapharg.source is not None else node.name


def _use(model: CompiledModel, saved: Trace, reused: bool) -> None:
    """From now on ``model`` calls the backend's split graph itself: no frame evaluation, no guards."""
    bound, split_gm = saved.inputs.bind(model.model), model.backend.split_gm
    assert split_gm is not None
    model._compiled = lambda *inputs: split_gm(*call_args(bound, inputs))[0]
    model.traced_num_tokens, model.trace_reused = saved.num_tokens, reused


PLAIN_COMPILE = CompiledModel.compile


def install() -> None:
    """Share traces between equal models from now on, in this process."""
    CompiledModel.compile = _compile  # type: ignore[method-assign]
