"""The toy's kernels as torch custom ops (vLLM: ``direct_register_custom_op``): dynamo never traces inside
one, so a ``metadata is None`` guard in an op is decided when it runs (at capture too)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

NAMESPACE = "cglab"

# op overload -> the Python function behind it. The graph backends run this function (instead of
# the op as one opaque call) so that they see, record and count the kernels inside it, as a GPU does.
_IMPLS: dict[Any, Callable[..., Any]] = {}


def direct_register_custom_op(op_name: str, impl: Callable[..., None], mutates_args: Iterable[str]) -> Any:
    """Register ``impl``, which writes into ``mutates_args`` and returns None, as ``torch.ops.cglab.<op_name>``."""
    op = torch.library.custom_op(f"{NAMESPACE}::{op_name}", impl, mutates_args=tuple(mutates_args))
    _IMPLS[getattr(torch.ops, NAMESPACE).__getattr__(op_name).default] = impl
    return op


def custom_op_impl(func: Any) -> Callable[..., Any] | None:
    """The Python body of a cglab custom op, or None for any other op."""
    return _IMPLS.get(func)


def registered_op_names() -> list[str]:
    """``["cglab::compressor", ...]``: every op a ``splitting_ops`` list may name."""
    return sorted(f"{NAMESPACE}::{op._schema.name.split('::')[1]}" for op in _IMPLS)
