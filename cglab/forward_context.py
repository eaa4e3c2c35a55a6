"""The forward context: per-step state layers read instead of arguments (vLLM: ``vllm/forward_context.py``).
What makes the bug possible: a layer cannot tell a profiling run from a capture without metadata."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
def set_forward_context(
    attn_metadata: dict[str, Any] | None,
    cg_mode: CUDAGraphMode = CUDAGraphMode.NONE,
    batch_descriptor: BatchExecutionDescriptor | None = None,
) -> Iterator[ForwardContext]:
    """Make ``attn_metadata`` visible to every layer for the duration of one forward pass."""
    context = ForwardContext(attn_metadata, cg_mode, batch_descriptor)
    token = _CURRENT.set(context)
    try:
        yield context
    finally:
        _CURRENT.reset(token)  # restores the enclosing context, so nested passes still work


def forward_context_has_metadata() -> bool:
    """Whether this step has metadata: the plain-Python guard (``python_guards=True``), which dynamo decides
    once, at trace time, as it reads vLLM's module global (hence ``torch.compiler.assume_constant_result``,
    applied where a model is compiled: ``cglab/compilation/wrapper.py``)."""
    return get_forward_context().attn_metadata is not None


def layer_metadata(layer_name: str, strict: bool) -> Any | None:
    """This layer's metadata, or None (a guarded layer skips its work; ``strict`` raises: the loud bug)."""
    metadata = get_forward_context().attn_metadata
    if metadata is not None:
        return metadata[layer_name]
    if strict:
        raise MissingMetadataError(
            f"{layer_name} needs attention metadata (slot mapping, block table) but the forward context has "
            "none. During capture this means the inputs were prepared with the legacy skip_attn path; build "
            "metadata at capture: prepare_inputs_to_capture(..., full_cudagraph) as in vLLM PR #49364."
        )
    return None
