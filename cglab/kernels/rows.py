"""What the row-wise kernels share (short conv, compressor): the launch grid, one program per token row and
block of channels, and the read of cached rows that this launch may be storing."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

CHANNELS_PER_PROGRAM = 128


def row_channel_grid(tensors: Sequence[torch.Tensor]) -> tuple[tuple[int, int], int] | None:
    """``(grid, channels per program)`` over the first tensor's ``[rows, hidden]``; None when there are
    no rows. Every tensor must be contiguous along its channels, which the kernels read in blocks."""
    rows, hidden = tensors[0].shape
    if rows == 0:
        return None
    for t in tensors:
        assert t.stride(-1) == 1, "the kernels read channels contiguously"
    block = min(CHANNELS_PER_PROGRAM, triton.next_power_of_2(hidden))
    return (rows, triton.cdiv(hidden, block)), block


@triton.jit
def load_slots(inputs, cache, slot_mapping, rows, slots, c, c_ok, stride_input, stride_cache):
    """The float32 values at cache ``slots`` (zero for -1) over channels ``c``. A slot that this launch stores
    is read from the input row that stores it: another program writes the cache, in no order relative to this one."""
    fresh = (slots >= 0) & (rows >= 0)
    fresh = fresh & (tl.load(slot_mapping + rows, mask=fresh, other=-1) == slots)
    cached = (slots >= 0) & (fresh == 0)
    new = tl.load(inputs + rows[:, None] * stride_input + c[None, :], mask=fresh[:, None] & c_ok[None, :], other=0.0)
    old = tl.load(cache + slots[:, None] * stride_cache + c[None, :], mask=cached[:, None] & c_ok[None, :], other=0.0)
    return (new + old).to(tl.float32)
