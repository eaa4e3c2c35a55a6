"""``cglab::fused_linear``: one linear layer with its neighbours folded in, for small decode batches. An
RMSNorm before it (prologue), SiLU or SiLU-times-up on its input, a residual add after it (epilogue).

The aten body below is the readable version, what a CPU runs and the oracle of the Triton kernel
(``cglab/kernels/linear.py``), which runs up to ``MAX_ROWS`` rows in one launch. This is where the toy
leaves vLLM: vLLM runs bf16 linears through cuBLAS on Hopper (and its norms and activations as their own
kernels); a norm folded into the linear that follows is the megakernel designs' idea. Every linear of the
model is a ``Linear``: inside ``fused_linears``, one launch of this op instead of the norm, the matmul,
the activation and the add.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn import functional as F

from cglab.kernels import triton_kernel

__all__ = ["FUSED", "MAX_ROWS", "Linear", "fused_linear", "fused_linears", "linear_reference"]

# Up to 4 rows the Triton kernel, a GEMV that reduces the rows one by one; above, the aten body (cuBLAS): on an
# H200 the compiled FULL step took 135, 191, 279, 459 and 824 us at 1, 2, 4, 8 and 16 rows with the kernel, and
# the peer 453 to 371 us (data/README.md). vLLM's ROCm skinny GEMM wvSplitK also takes at most 4 rows.
MAX_ROWS = 4
MAX_K = 8192  # it holds the whole input row of a program's weight rows in registers
ACTIVATIONS = ("none", "silu", "silu_mul")


def linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    eps: float | None = None,
    act: str = "none",
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``residual + act(rms_norm(x)) @ weight.T``, each part optional; ``silu_mul`` takes ``x = [gate, up]``
    (and no norm: the norm's weight spans the linear's input, not half of it)."""
    assert act in ACTIVATIONS and (norm_weight is None or act != "silu_mul"), f"act {act!r} with a norm"
    if norm_weight is not None:
        x = F.rms_norm(x, (x.shape[-1],), norm_weight, eps)
    if act == "silu_mul":
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    elif act == "silu":
        x = F.silu(x)
    out = F.linear(x, weight)
    return out if residual is None else residual + out


@torch.library.custom_op("cglab::fused_linear", mutates_args=())
def fused_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    norm_weight: torch.Tensor | None,
    eps: float | None,
    act: str,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    """The Triton kernel for up to ``MAX_ROWS`` rows of CUDA tensors (Triton kernel set), else the aten body."""
    fits = x.shape[0] <= MAX_ROWS and weight.shape[1] <= MAX_K
    kernel = triton_kernel("fused_linear", x) if fits else None
    if kernel is not None:
        return kernel(x, weight, norm_weight, eps, act, residual)
    return linear_reference(x, weight, norm_weight, eps, act, residual)


@fused_linear.register_fake
def _(x, weight, norm_weight, eps, act, residual):  # noqa: ANN001, ANN202 (the op's signature above)
    return x.new_empty(x.shape[0], weight.shape[0])


class Linear(nn.Linear):
    """``nn.Linear`` without bias that takes its neighbours as arguments: ``residual + self(act(norm(x)))``.
    One ``cglab::fused_linear`` launch while ``FUSED.linears`` is on, else ``norm`` and the aten body: the
    calls ``nn.RMSNorm`` and ``nn.Linear`` make. A module, so a traced graph still names it (``lm_head``)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        norm: nn.RMSNorm | None = None,
        act: str = "none",
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not FUSED.linears:  # the modules' own calls: a trace of the step still shows the norm
            return linear_reference(x if norm is None else norm(x), self.weight, None, None, act, residual)
        return fused_linear(x, self.weight, getattr(norm, "weight", None), getattr(norm, "eps", None), act, residual)


class FUSED:  # noqa: N801 (a switch, read like a constant)
    """Whether a ``Linear`` launches ``cglab::fused_linear``: its forward reads ``FUSED.linears``, so torch.compile
    guards on it when it traces (a model built and captured with it on keeps its fused graphs)."""

    linears = False


@contextmanager
def fused_linears(fused: bool = True) -> Iterator[None]:
    """Inside the block every linear of the model is one ``cglab::fused_linear`` launch (``fused=False``: the
    aten body), the graphs captured there included."""
    before, FUSED.linears = FUSED.linears, fused
    try:
        yield
    finally:
        FUSED.linears = before
