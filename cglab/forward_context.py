"""The forward context: per-step state that layers read instead of taking it as arguments.

vLLM: ``vllm/forward_context.py``. Layers call ``get_forward_context().attn_metadata`` to find
their metadata. That keeps model signatures clean, and it is exactly what makes the missing-metadata
bug possible: a layer cannot tell "profiling run" from "capture with no metadata built". When a layer
asks (inside its custom op, or in plain Python in ``forward``) decides which freeze it meets: at
capture, or when torch.compile traces (``forward_context_has_metadata``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from cglab.config import CUDAGraphMode
from cglab.errors import MissingMetadataError

if TYPE_CHECKING:
    from cglab.batch import BatchExecutionDescriptor


@dataclass
class ForwardContext:
    # layer name -> that layer's metadata; None on profiling runs (and, before the fix, at compiled PIECEWISE capture)
    attn_metadata: dict[str, Any] | None
    cg_mode: CUDAGraphMode = CUDAGraphMode.NONE
    batch_descriptor: BatchExecutionDescriptor | None = None


# The forward pass in progress in this thread/context, or None. A ContextVar, not a module global:
# a Jupyter kernel can run two widget callbacks at once on different threads, and with a global one
# thread's layers read the other thread's metadata (wrong shapes, wrong slots). Each thread (and each
# asyncio task) sees only the context it set, as in cglab/graphs/capture_driver.py.
_CURRENT: ContextVar[ForwardContext | None] = ContextVar("cglab_forward_context", default=None)


def get_forward_context() -> ForwardContext:
    """The context of the forward pass in progress (in this thread)."""
    context = _CURRENT.get()
    if context is None:
        raise RuntimeError("no forward context is set: run the model inside `with set_forward_context(...)`")
    return context


@contextmanager
def set_forward_context(attn_metadata: dict[str, Any] | None, cg_mode: CUDAGraphMode = CUDAGraphMode.NONE,
                        batch_descriptor: BatchExecutionDescriptor | None = None) -> Iterator[ForwardContext]:
    """Make ``attn_metadata`` visible to every layer for the duration of one forward pass."""
    context = ForwardContext(attn_metadata, cg_mode, batch_descriptor)
    token = _CURRENT.set(context)
    try:
        yield context
    finally:
        _CURRENT.reset(token)  # restores the enclosing context, so nested passes still work


@torch.compiler.assume_constant_result
def forward_context_has_metadata() -> bool:
    """Whether this step has attention metadata: the check a layer writes in plain Python in its
    ``forward`` (``ToyConfig(python_guards=True)``, as Inkling and DeepSeek V4 do).

    Eagerly and under breakable capture it is asked at every call. Under torch.compile dynamo asks it
    once, while it traces, and keeps the answer as a constant in the compiled graph: with guards
    dropped, nothing ever asks again. vLLM's forward context is a module global, which dynamo reads
    at trace time in the same way; this one is a ContextVar, which dynamo cannot read, so
    ``assume_constant_result`` gives the toy that same trace-time decision.
    """
    return get_forward_context().attn_metadata is not None


def layer_metadata(layer_name: str, strict: bool) -> Any | None:
    """This layer's metadata, or ``None`` when the step has none.

    A guarded layer (``strict=False``) treats ``None`` as a profiling run and skips its work. A strict
    layer refuses, which turns the silent bug into a loud one.
    """
    metadata = get_forward_context().attn_metadata
    if metadata is not None:
        return metadata[layer_name]
    if strict:
        raise MissingMetadataError(
            f"{layer_name} needs attention metadata (slot mapping, block table) but the forward context has "
            "none. During capture this means the inputs were prepared with the legacy skip_attn path; build "
            "metadata at capture: prepare_inputs_to_capture(..., full_cudagraph) as in vLLM PR #49364.")
    return None
