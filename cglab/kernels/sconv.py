"""``cglab::short_conv`` as one Triton launch, as vLLM's Inkling ``fused_sconv`` is: store each token's
input at its slot and convolve it with the ``kernel_size - 1`` inputs before it, in one kernel.

Same result as the aten body in ``cglab/layers/sconv.py``, except that a ``slot_mapping == -1`` row stores
nothing (the aten body writes it into the spare last row, which nothing reads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cglab.kernels.pdl import pdl_options, wait_for_previous_kernels
from cglab.kernels.rows import load_slots, row_channel_grid
from cglab.metadata import ShortConvMetadata


@triton.jit
def _short_conv_kernel(
    x,
    output,
    conv_state,
    weight,
    slot_mapping,
    tap_slots,
    hidden,
    stride_xt,
    stride_ot,
    stride_state,
    stride_weight,
    stride_taps,
    KERNEL_SIZE: tl.constexpr,
    BLOCK_TAPS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernels(PDL)
    token = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    c_ok = c < hidden
    x_row = tl.load(x + token * stride_xt + c, mask=c_ok, other=0.0)
    slot = tl.load(slot_mapping + token)
    if slot >= 0:  # a padding row (PAD_SLOT_ID) stores nothing
        tl.store(conv_state + slot * stride_state + c, x_row, mask=c_ok)
    # Taps oldest first, each read from the row that stores it if it is in this batch; taps before the
    # sequence start (-1) are zero.
    j = tl.arange(0, BLOCK_TAPS)
    j_ok = j < KERNEL_SIZE - 1
    taps = tl.load(tap_slots + token * stride_taps + j, mask=j_ok, other=-1)
    rows = token - (KERNEL_SIZE - 1 - j)
    values = load_slots(x, conv_state, slot_mapping, rows, taps, c, c_ok, stride_xt, stride_state)
    weights = tl.load(
        weight + j[:, None] * stride_weight + c[None, :], mask=j_ok[:, None] & c_ok[None, :], other=0.0
    ).to(tl.float32)
    last = tl.load(weight + (KERNEL_SIZE - 1) * stride_weight + c, mask=c_ok, other=0.0).to(tl.float32)
    acc = tl.sum(values * weights, axis=0) + x_row.to(tl.float32) * last
    tl.store(output + token * stride_ot + c, acc.to(output.dtype.element_ty), mask=c_ok)


def short_conv(
    x: torch.Tensor, output: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, md: ShortConvMetadata
) -> None:
    """Launch the kernel over (token row, block of channels); tensors are ``[rows, hidden]``."""
    launch = row_channel_grid((x, output, conv_state, weight))
    if launch is None:
        return
    grid, block = launch
    _short_conv_kernel[grid](
        x,
        output,
        conv_state,
        weight,
        md.slot_mapping,
        md.tap_slots,
        x.shape[1],
        *(t.stride(0) for t in (x, output, conv_state, weight, md.tap_slots)),  # stride_xt, ..., stride_taps
        KERNEL_SIZE=weight.shape[0],
        BLOCK_TAPS=triton.next_power_of_2(max(weight.shape[0] - 1, 1)),
        BLOCK_H=block,
        **pdl_options(),
    )
