"""The launch grid the row-wise kernels share (short conv, compressor): one program per token row and
block of channels."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton

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
