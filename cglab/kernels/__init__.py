"""Which kernels cglab's custom ops run: their aten bodies, or the toy's Triton kernels (this package).

The toy's choice: one launch per op (two for the compressor), prefill and decode alike; each kernel module
says how vLLM's kernels for the op split the work. The aten bodies stay as the readable version, the CPU
path, what the graph simulator records, and the oracle the Triton kernels are tested against. Which set
runs is decided here and nowhere else: each op asks ``triton_kernel(op, tensor)`` after its guards.
Triton is imported only when a kernel is asked for, so the CPU path never needs it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

from cglab.errors import ConfigError

if TYPE_CHECKING:  # no torch import at the top: the CLI checks options before it imports torch
    import torch

__all__ = [
    "KERNEL_SETS",
    "PDL_ENV",
    "check_kernels",
    "pdl_enabled",
    "triton_available",
    "triton_kernel",
    "triton_launches",
    "use_kernels",
]

KERNEL_SETS = ("aten", "triton")
# op name -> (module of this package, its launcher, kernels one call launches).
_LAUNCHERS = {
    "unified_attention": ("attention", "unified_attention", 1),
    "short_conv": ("sconv", "short_conv", 1),
    "compressor": ("compressor", "compressor", 2),
    "linear_attention": ("linear_attn", "linear_attention", 1),
    "fused_linear": ("linear", "fused_linear", 1),
}
PDL_ENV = "CGLAB_PDL"  # "0": no programmatic dependent launch (the bench's A/B switch)
_forced: str | None = None  # None: per call, Triton for CUDA tensors when it imports, aten otherwise
_launched = 0  # Triton kernels launched so far: invisible to a TorchDispatchMode, so counted here


@cache
def triton_available() -> bool:
    """Whether Triton can be imported, checked without importing it (an import costs seconds)."""
    return importlib.util.find_spec("triton") is not None


@cache
def pdl_enabled() -> bool:
    """Whether the Triton kernels that support it launch with programmatic dependent launch (PDL): the next
    kernel starts while the previous one drains, and waits (``gdc_wait``) only before reading its outputs.
    Needs a Hopper or newer GPU (and Triton 3.3 or newer, as the kernels do); ``CGLAB_PDL=0`` turns it off."""
    setting = os.environ.get(PDL_ENV, "1").strip()
    if setting not in ("0", "1"):
        raise ConfigError(f"{PDL_ENV}={setting!r}: set it to 0 (no programmatic dependent launch) or 1, or unset it")
    if setting == "0" or not triton_available():
        return False
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


def _default_kernels(device_type: str) -> str:
    return "triton" if device_type == "cuda" and triton_available() else "aten"


def check_kernels(kernels: str | None, device_type: str) -> str:
    """The kernel set a run on ``device_type`` uses: ``kernels`` if it can run there, else a ConfigError."""
    if kernels is None:
        return _default_kernels(device_type)
    if kernels not in KERNEL_SETS:
        raise ConfigError(f"kernels must be one of {', '.join(KERNEL_SETS)}, got {kernels!r}")
    if kernels == "triton" and device_type != "cuda":
        raise ConfigError(
            "kernels 'triton' need CUDA tensors (Triton compiles for the GPU); use kernels 'aten' on "
            f"the {device_type} device, or device 'cuda'"
        )
    if kernels == "triton" and not triton_available():
        raise ConfigError(
            "kernels 'triton' need the triton package, which is not importable here; install it "
            "(pip install triton) or use kernels 'aten'"
        )
    return kernels


@contextmanager
def use_kernels(kernels: str | None) -> Iterator[None]:
    """Run every custom op with ``kernels`` (``"aten"`` or ``"triton"``; None: the per-device default)
    inside the block. Forcing ``"triton"`` on CPU tensors needs Triton's interpreter (``TRITON_INTERPRET=1``
    set before triton is imported): the kernel tests do that; the engine never does."""
    global _forced
    before, _forced = _forced, kernels
    try:
        yield
    finally:
        _forced = before


def triton_kernel(op_name: str, tensor: torch.Tensor) -> Callable[..., Any] | None:
    """The Triton launcher of ``op_name`` if it should run for ``tensor`` (counted as launched); None:
    run the aten body."""
    global _launched
    if (_forced or _default_kernels(tensor.device.type)) != "triton":
        return None
    _launched += _LAUNCHERS[op_name][2]
    return _launcher(op_name)


def triton_launches() -> int:
    """Triton kernels launched by the ops so far in this process (the bench's launch count adds them)."""
    return _launched


def _launcher(op_name: str) -> Callable[..., Any]:
    module, function, _ = _LAUNCHERS[op_name]
    return getattr(importlib.import_module(f"cglab.kernels.{module}"), function)
