"""One dynamo trace per model fingerprint, then the traced graph called directly (vLLM: the compile
cache, ``vllm/compilation/caching.py``, which loads a compiled forward saved under a hash of the
configs and the code, so that a restart runs no dynamo; and the no-guards wrapper, which sends every
call after the first straight to the compiled code).

Dynamo turns ``forward`` into one FX graph whose placeholders are the model's parameters and buffers,
the call's tensors and the token count. After that one trace, ``GraphInputs`` reads those values
where dynamo's sources say they come from and calls the graph: no frame evaluation, no guards. A
notebook or a test session builds dozens of identical engines in one process, and dynamo's trace is
most of their start-up on a CPU, so models with equal ``trace_fingerprint`` share one trace. Every
engine still runs its own backend on it: its own split graph, pieces, wrappers and graphs.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch
from torch import nn

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


def placeholder_sources(graph: torch.fx.GraphModule) -> list[str]:
    """Dynamo's source of each placeholder, e.g. ``L['input_ids']``; read while the backend has the
    graph (dynamo drops these annotations once it returns)."""
    names = []
    for node in graph.graph.find_nodes(op="placeholder"):
        grapharg = node.meta.get("grapharg")
        names.append(grapharg.source.name if grapharg is not None and grapharg.source is not None else node.name)
    return names


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


def cached_trace(fingerprint: Hashable | None) -> Trace | None:
    if fingerprint is None or fingerprint not in _TRACES:
        return None
    _TRACES.move_to_end(fingerprint)
    return _TRACES[fingerprint]


def save_trace(fingerprint: Hashable | None, trace: Trace) -> None:
    if fingerprint is None:
        return
    _TRACES[fingerprint] = trace
    while len(_TRACES) > MAX_TRACES:
        _TRACES.popitem(last=False)
