"""``cglab::compressor`` in Triton, the toy's split: one launch saves each token's state and folds every
completed group into its compressed entry, a second pools the entries each token may see. Two launches,
because a token may see an entry another row of the same batch completes, and only a launch boundary
orders one program's write before another's read. vLLM's DeepSeek V4 compressor is two kernels split
differently: ``save_partial_states``, then ``compress_norm_rope_store`` (compress, normalise, RoPE,
store); reading the entries is its sparse attention's job.

Same result as the aten body in ``cglab/layers/compressor.py``, except that ``-1`` slots (padding rows,
tokens that complete no group) store nothing: the aten body writes them into the spare last rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cglab.kernels.pdl import pdl_options, wait_for_previous_kernels
from cglab.kernels.rows import load_slots, row_channel_grid
from cglab.metadata import CompressorMetadata


@triton.jit
def _save_and_compress_kernel(
    kv,
    state_cache,
    compressed_cache,
    pool_logits,
    slot_mapping,
    group_slots,
    compress_slots,
    hidden,
    stride_kv,
    stride_state,
    stride_compressed,
    stride_groups,
    RATIO: tl.constexpr,
    BLOCK_RATIO: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernels(PDL)
    token = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    c_ok = c < hidden
    slot = tl.load(slot_mapping + token)
    if slot >= 0:  # a padding row (PAD_SLOT_ID) stores nothing
        tl.store(state_cache + slot * stride_state + c, tl.load(kv + token * stride_kv + c, mask=c_ok), mask=c_ok)
    entry_slot = tl.load(compress_slots + token)
    if entry_slot >= 0:  # this token completes a group
        i = tl.arange(0, BLOCK_RATIO)
        logits = tl.load(pool_logits + i, mask=i < RATIO, other=float("-inf")).to(tl.float32)
        weights = tl.exp(logits - tl.max(logits, axis=0))
        weights = weights / tl.sum(weights, axis=0)
        members = tl.load(group_slots + token * stride_groups + i, mask=i < RATIO, other=-1)
        # Members in this batch are the group's last RATIO rows, read from the rows that store them.
        rows = token - (RATIO - 1 - i)
        group = load_slots(kv, state_cache, slot_mapping, rows, members, c, c_ok, stride_kv, stride_state)
        entry = tl.sum(group * weights[:, None], axis=0)
        tl.store(
            compressed_cache + entry_slot * stride_compressed + c,
            entry.to(compressed_cache.dtype.element_ty),
            mask=c_ok,
        )


@triton.jit
def _pool_kernel(
    output,
    compressed_cache,
    visible_slots,
    hidden,
    num_groups,
    stride_out,
    stride_compressed,
    stride_visible,
    BLOCK_G: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernels(PDL)
    token = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    c_ok = c < hidden
    g = tl.arange(0, BLOCK_G)
    entries = tl.load(visible_slots + token * stride_visible + g, mask=g < num_groups, other=-1)
    visible = entries >= 0
    seen = tl.load(
        compressed_cache + entries[:, None] * stride_compressed + c[None, :],
        mask=visible[:, None] & c_ok[None, :],
        other=0.0,
    ).to(tl.float32)
    count = tl.maximum(tl.sum(visible.to(tl.float32), axis=0), 1.0)
    tl.store(output + token * stride_out + c, (tl.sum(seen, axis=0) / count).to(output.dtype.element_ty), mask=c_ok)


def compressor(
    kv: torch.Tensor,
    output: torch.Tensor,
    state_cache: torch.Tensor,
    compressed_cache: torch.Tensor,
    pool_logits: torch.Tensor,
    md: CompressorMetadata,
) -> None:
    """Launch both kernels over (token row, block of channels); tensors are ``[rows, hidden]``."""
    launch = row_channel_grid((kv, output, state_cache, compressed_cache))
    if launch is None:
        return
    (grid, block), hidden = launch, kv.shape[1]
    ratio = pool_logits.shape[0]
    _save_and_compress_kernel[grid](
        kv,
        state_cache,
        compressed_cache,
        pool_logits,
        md.slot_mapping,
        md.group_slots,
        md.compress_slots,
        hidden,
        *(t.stride(0) for t in (kv, state_cache, compressed_cache, md.group_slots)),  # stride_kv, ...
        RATIO=ratio,
        BLOCK_RATIO=triton.next_power_of_2(ratio),
        BLOCK_H=block,
        **pdl_options(),
    )
    num_groups = md.visible_slots.shape[1]
    _pool_kernel[grid](
        output,
        compressed_cache,
        md.visible_slots,
        hidden,
        num_groups,
        *(t.stride(0) for t in (output, compressed_cache, md.visible_slots)),
        BLOCK_G=triton.next_power_of_2(num_groups),
        BLOCK_H=block,
        **pdl_options(),
    )
