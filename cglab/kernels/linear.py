"""``cglab::fused_linear`` as one Triton launch for a few rows (``fused_linear.MAX_ROWS``): a GEMV-like kernel.

Each program owns ``ROWS_PER_PROGRAM`` output features: it loads their weight rows whole (all of K at
once), then for every input row applies the prologue (RMSNorm, or SiLU / SiLU-times-up), reduces over K
and applies the epilogue (the residual add). The tiles depend on the weight's shape only, never on the
number of rows, and each row is reduced alone, so a row's result has the same bits whatever the batch
(batch invariance: a padded batch gives the unpadded rows' bits). Intermediate results are rounded to the
tensors' dtype where the aten body rounds them (``linear_reference``); the reduction runs in fp32 (no TF32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cglab.kernels.pdl import pdl_options, wait_for_previous_kernels

ROWS_PER_PROGRAM = 2  # output features per program: many programs, so every SM streams weights
# Warps per program. The 33 linears alone as one captured chain on an H200, 1 row (8 rows): 2 warps 136 us (294),
# 4 warps 113 us (315), cuBLAS 236 us (160); data/README.md has the bench's numbers. Tiles and warps depend on
# nothing else, so a row keeps its bits in any batch.
NUM_WARPS = 4
_ACT = {"none": 0, "silu": 1, "silu_mul": 2}


@triton.jit
def _fused_linear_kernel(
    x,
    weight,
    norm_weight,
    residual,
    out,
    rows,
    n_out,
    k_in,
    stride_x,
    stride_w,
    stride_r,
    stride_o,
    eps,
    NORM: tl.constexpr,
    ACT: tl.constexpr,
    RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    n_ok, k_ok = n < n_out, k < k_in
    w = tl.load(weight + n[:, None] * stride_w + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    w = w.to(tl.float32)
    dtype = out.dtype.element_ty
    if NORM:
        g = tl.load(norm_weight + k, mask=k_ok, other=0.0).to(tl.float32)
    wait_for_previous_kernels(PDL)  # after the weights, no kernel's output: loaded while the previous one drains
    for m in range(rows):
        a = tl.load(x + m * stride_x + k, mask=k_ok, other=0.0).to(tl.float32)
        if NORM:  # as F.rms_norm: in fp32, rounded, then scaled
            a = a * tl.rsqrt(tl.sum(a * a, axis=0) / k_in + eps)
            a = (a.to(dtype).to(tl.float32) * g).to(dtype).to(tl.float32)
        if ACT == 1:
            a = (a * tl.sigmoid(a)).to(dtype).to(tl.float32)
        if ACT == 2:  # x is [gate, up]: silu(gate), rounded, times up
            up = tl.load(x + m * stride_x + k_in + k, mask=k_ok, other=0.0).to(tl.float32)
            a = ((a * tl.sigmoid(a)).to(dtype).to(tl.float32) * up).to(dtype).to(tl.float32)
        acc = tl.sum(w * a[None, :], axis=1)
        if RESIDUAL:  # the linear's output rounded first, as ``residual + out`` adds two tensors
            r = tl.load(residual + m * stride_r + n, mask=n_ok, other=0.0).to(tl.float32)
            acc = acc.to(dtype).to(tl.float32) + r
        tl.store(out + m * stride_o + n, acc.to(dtype), mask=n_ok)


def fused_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    norm_weight: torch.Tensor | None,
    eps: float | None,
    act: str,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    """Launch one program per ``ROWS_PER_PROGRAM`` output features; ``x`` is ``[rows, K]`` (``[rows, 2K]``
    for ``silu_mul``), ``weight`` ``[N, K]``, the result ``[rows, N]``."""
    n_out, k_in = weight.shape
    out = torch.empty((x.shape[0], n_out), dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    assert x.stride(-1) == 1 and weight.stride(-1) == 1, "the kernel reads rows contiguously"
    assert residual is None or residual.stride(-1) == 1
    _fused_linear_kernel[(triton.cdiv(n_out, ROWS_PER_PROGRAM),)](
        x,
        weight,
        norm_weight if norm_weight is not None else weight,  # unread without NORM
        residual if residual is not None else out,  # unread without RESIDUAL
        out,
        *(x.shape[0], n_out, k_in),  # rows, n_out, k_in
        x.stride(0),
        weight.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        torch.finfo(torch.float32).eps if eps is None else eps,  # F.rms_norm's default: fp32's epsilon
        NORM=norm_weight is not None,
        ACT=_ACT[act],
        RESIDUAL=residual is not None,
        BLOCK_N=ROWS_PER_PROGRAM,
        BLOCK_K=triton.next_power_of_2(k_in),
        num_warps=NUM_WARPS,
        **pdl_options(),
    )
    return out
