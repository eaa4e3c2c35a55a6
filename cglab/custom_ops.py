"""Registering the toy's kernels as torch custom ops (vLLM: ``direct_register_custom_op``).

A custom op is opaque to torch.compile: dynamo records one call and never traces the Python inside.
That is why a layer's ``if metadata is None`` guard, written inside its op, is decided when the op
*runs* (at capture, too), not when the model is traced. It is also what lets the compilation backend
find the ops listed in ``splitting_ops`` in the FX graph and split the graph there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

NAMESPACE = "cglab"

# op overload -> the Python function behind it. The graph backends run this function (instead of
# the op as one opaque call) so that they see, record and count the kernels inside it, as a GPU does.
_IMPLS: dict[Any, Callable[..., Any]] = {}


def direct_register_custom_op(op_name: str, impl: Callable[..., None], mutates_args: Iterable[str]) -> Any:
    """Register ``impl`` as ``torch.ops.cglab.<op_name>`` and return the op.

    ``impl`` writes its results into arguments listed in ``mutates_args`` and returns None: a
    mutating op with no outputs needs no fake (shape-only) implementation for tracing.
    """
    op = torch.library.custom_op(f"{NAMESPACE}::{op_name}", impl, mutates_args=tuple(mutates_args))
    _IMPLS[getattr(torch.ops, NAMESPACE).__getattr__(op_name).default] = impl
    return op


def custom_op_impl(func: Any) -> Callable[..., Any] | None:
    """The Python body of a cglab custom op, or None for any other op."""
    return _IMPLS.get(func)


def registered_op_names() -> list[str]:
    """``["cglab::compressor", ...]``: every op a ``splitting_ops`` list may name."""
    return sorted(f"{NAMESPACE}::{op._schema.name.split('::')[1]}" for op in _IMPLS)
