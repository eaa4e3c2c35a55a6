"""Off the lesson's path, for speed: after ``install()`` equal models share one dynamo trace, each running its own
backend on it. vLLM's compile cache (``vllm/compilation/caching.py``) saves a compiled forward to disk instead."""

from __future__ import annotations

import inspect
import re
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from itertools import chain
from typing import Any, NamedTuple
from unittest.mock import patch

import torch
from torch import nn

from cglab.compilation.wrapper import CompiledModel, compile_forward, trace
from cglab.errors import CaptureError
from cglab.forward_context import forward_context_has_metadata

PLAIN_COMPILE = CompiledModel.compile
MAX_TRACES = 32  # a long session's distinct models; the oldest trace goes first

# L['self']._modules['layers']._modules['0']._parameters['weight'], L['input_ids'], L['input_ids'].size()[0]
_SOURCE = re.compile(
    r"L\['(\w+)'\]((?:\._modules\['[^']+'\])*)(?:\._(parameters|buffers)\['([^']+)'\])?"
    r"(?:\.size\(\)\[(\d+)\])?"
)


class Trace(NamedTuple):
    """Dynamo's graph, where each placeholder comes from (its source name), the token count traced at."""

    graph: torch.fx.GraphModule
    sources: list[str]
    num_tokens: int


_TRACES: OrderedDict[Hashable, Trace] = OrderedDict()


def _bind(sources: Sequence[str], model: nn.Module) -> list[Callable[[Sequence[torch.Tensor]], Any]]:
    """Per placeholder, how to read it at a call: a parameter or buffer of ``model``, an input or its size."""
    arg_names = [name for name in inspect.signature(type(model).forward).parameters if name != "self"]
    getters: list[Callable[[Sequence[torch.Tensor]], Any]] = []
    for text in sources:
        match = _SOURCE.fullmatch(text)
        if match and match[1] == "self" and match[3]:
            path = ".".join(re.findall(r"_modules\['([^']+)'\]", match[2]))
            tensors, name = getattr(model.get_submodule(path), f"_{match[3]}"), match[4]
            getters.append(lambda inputs, tensors=tensors, name=name: tensors[name])
        elif match and match[1] in arg_names and not (match[2] or match[3]):
            i, dim = arg_names.index(match[1]), match[5]
            getters.append(lambda inputs, i=i, dim=dim: inputs[i] if dim is None else inputs[i].size(int(dim)))
        else:
            raise CaptureError(
                f"the traced graph reads {text}, which cglab cannot pass to it: forward may read the model's "
                "parameters and buffers and its tensor arguments only; keep other state out of it"
            )
    return getters


def _tensor_meta(tensor: torch.Tensor, skip_dims: int = 0) -> tuple[Any, ...]:
    return tuple(tensor.shape[skip_dims:]), tensor.stride()[skip_dims:], tensor.dtype, str(tensor.device)


def _forward_code(module: nn.Module) -> tuple[Any, ...]:
    """``forward`` and the functions it calls by global name: a patched one is another object."""
    forward = type(module).forward
    names = getattr(forward, "__code__", None) and forward.__code__.co_names or ()
    found = (getattr(forward, "__globals__", {}).get(name) for name in names)
    return forward, *(obj for obj in found if callable(obj) and not isinstance(obj, type))


def trace_fingerprint(model: nn.Module, inputs: Sequence[torch.Tensor]) -> Hashable | None:
    """What dynamo's trace depends on (None: cannot tell), the forward context (``python_guards``) included."""
    modules = []
    for name, module in model.named_modules():
        if module._forward_hooks or module._forward_pre_hooks:
            return None
        items = sorted((k, v) for k, v in vars(module).items() if not k.startswith("_"))
        attrs = tuple((k, _tensor_meta(v) if isinstance(v, torch.Tensor) else repr(v)) for k, v in items)
        if any(" at 0x" in str(text) for _, text in attrs):  # an object without a value repr: no way to tell
            return None
        modules.append((name, type(module), _forward_code(module), attrs))
    tensors = tuple((name, _tensor_meta(t)) for name, t in chain(model.named_parameters(), model.named_buffers()))
    state = (forward_context_has_metadata(), torch.is_inference_mode_enabled(), torch.is_grad_enabled())
    return tuple(modules), tensors, tuple(_tensor_meta(t, 1) for t in inputs), state


def disabled() -> AbstractContextManager[Any]:
    """Every model compiled inside traces for itself (a start-up benchmark measures a first start)."""
    return patch.object(CompiledModel, "compile", PLAIN_COMPILE)


def _compile(model: CompiledModel, *inputs: torch.Tensor) -> torch.Tensor:
    """``CompiledModel.compile`` with the cache: reuse the trace of an equal model, or trace and save it."""
    fingerprint = trace_fingerprint(model.model, inputs) if model.backend.compiler == "eager" else None
    saved = _TRACES.get(fingerprint)
    if saved is not None:  # the same graph through this model's own backend: its own pieces, wrappers
        _TRACES.move_to_end(fingerprint)
        model.backend(saved.graph, [])
        _use(model, saved, reused=True)
        return model._compiled(*inputs)
    traced: list[Trace] = []
    backend, num_tokens = model.backend, inputs[0].shape[0]

    def record(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        # Dynamo keeps this function for the life of the process: it must not hold the model. It reads
        # the placeholders' sources while it may: dynamo drops them once this returns.
        args = [node.meta.get("grapharg") for node in gm.graph.find_nodes(op="placeholder")]
        traced.append(Trace(gm, [arg.source.name if arg and arg.source else "?" for arg in args], num_tokens))
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


def _use(model: CompiledModel, saved: Trace, reused: bool) -> None:
    """From now on ``model`` calls the backend's split graph itself: no frame evaluation, no guards."""
    getters, split_gm = _bind(saved.sources, model.model), model.backend.split_gm
    assert split_gm is not None
    model._compiled = lambda *inputs: split_gm(*[get(inputs) for get in getters])[0]
    model.traced_num_tokens, model.trace_reused = saved.num_tokens, reused


def install() -> None:
    """Share traces between equal models from now on, in this process."""
    CompiledModel.compile = _compile  # type: ignore[method-assign]
