"""``cglab::unified_attention`` as one Triton launch: store this batch's keys and values, then attend
over the block table up to each request's live ``seq_len``, read on the device, so a FULL graph reads
only live keys at every replay. vLLM's Triton ``unified_attention`` attends only (reading
``seqused_k``); its KV write is a separate op, ``unified_kv_cache_update``. Storing in the same launch
is the toy's choice, as its aten body does.

Same result as the aten body in ``cglab/layers/attention.py``, padding rows included (they attend over
the last request's keys, as there), except that a ``slot_mapping == -1`` row stores nothing: the aten
body writes it into the spare last row, which nothing reads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cglab.kernels.pdl import pdl_options, wait_for_previous_kernels
from cglab.metadata import AttentionMetadata

_KEYS_PER_ITERATION = 64  # a decode row of up to 64 keys reads them in one pass (one chain of dependent loads)


@triton.jit
def _attention_kernel(
    query,
    key,
    value,
    output,
    k_cache,
    v_cache,
    slot_mapping,
    query_start_loc,
    seq_lens,
    block_table,
    key_limit,
    num_tokens,
    num_reqs,
    max_seq_len,
    scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_cache_slot,
    stride_cache_head,
    stride_table,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_KEY_LIMIT: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernels(PDL)  # the queries, keys and values are the projection's output
    token = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    slot = tl.load(slot_mapping + token)
    if slot >= 0:  # a padding row (PAD_SLOT_ID) stores nothing
        cache_row = slot * stride_cache_slot + head * stride_cache_head + d
        tl.store(k_cache + cache_row, tl.load(key + token * stride_kt + head * stride_kh + d, mask=d_ok), mask=d_ok)
        tl.store(v_cache + cache_row, tl.load(value + token * stride_vt + head * stride_vh + d, mask=d_ok), mask=d_ok)

    # This row's request: how many requests end at or before it (the aten body's searchsorted), clamped
    # so that padding rows belong to the last request.
    r = tl.arange(0, BLOCK_R)
    ends = tl.load(query_start_loc + 1 + r, mask=r < num_reqs, other=num_tokens + 1)
    request = tl.minimum(tl.sum((ends <= token).to(tl.int32), axis=0), num_reqs - 1)
    seq_len = tl.load(seq_lens + request)
    query_start = tl.load(query_start_loc + request)
    query_end = tl.load(query_start_loc + request + 1)
    position = seq_len - (query_end - token)
    first_new = seq_len - (query_end - query_start)  # position of the request's first row in this batch
    # Causal and live: keys up to this row's position, below seq_len (and the host-side width, as aten).
    limit = tl.minimum(tl.minimum(position + 1, seq_len), max_seq_len)
    if HAS_KEY_LIMIT:  # a lazily planned kernel reads only the key blocks its plan gives
        limit = tl.minimum(limit, tl.load(key_limit + request))

    q = tl.load(query + token * stride_qt + head * stride_qh + d, mask=d_ok, other=0.0).to(tl.float32)
    running_max = tl.full([1], float("-inf"), tl.float32)
    running_sum = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for start in range(0, limit, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        live = n < limit
        block = tl.load(block_table + request * stride_table + n // BLOCK_SIZE, mask=live, other=0)
        key_slot = block * BLOCK_SIZE + n % BLOCK_SIZE
        # A key this launch stores is read from the inputs: another program writes it to the cache, in
        # no order relative to this one. Only if its row really stores that slot (dummy rows store none).
        row = query_start + (n - first_new)
        fresh = live & (n >= first_new) & (row < num_tokens)
        fresh = fresh & (tl.load(slot_mapping + row, mask=fresh, other=-1) == key_slot)
        cached = live & (fresh == 0)
        new_kv = fresh[:, None] & d_ok[None, :]
        old_kv = cached[:, None] & d_ok[None, :]
        cache_at = key_slot[:, None] * stride_cache_slot + head * stride_cache_head + d[None, :]
        k = (
            tl.load(key + row[:, None] * stride_kt + head * stride_kh + d[None, :], mask=new_kv, other=0.0)
            + tl.load(k_cache + cache_at, mask=old_kv, other=0.0)
        ).to(tl.float32)
        v = (
            tl.load(value + row[:, None] * stride_vt + head * stride_vh + d[None, :], mask=new_kv, other=0.0)
            + tl.load(v_cache + cache_at, mask=old_kv, other=0.0)
        ).to(tl.float32)
        scores = tl.where(live, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=0))
        rescale = tl.exp(running_max - new_max)
        weights = tl.exp(scores - new_max)
        running_sum = running_sum * rescale + tl.sum(weights, axis=0)
        acc = acc * rescale + tl.sum(weights[:, None] * v, axis=0)
        running_max = new_max
    # No visible key: zero, as the aten body's uniform weights over zeroed values.
    out = acc / tl.maximum(running_sum, 1e-30)
    tl.store(output + token * stride_ot + head * stride_oh + d, out.to(output.dtype.element_ty), mask=d_ok)


def unified_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    output: torch.Tensor,
    kv_cache: torch.Tensor,
    md: AttentionMetadata,
) -> None:
    """Launch the kernel over (token row, head); ``kv_cache`` is ``[2, blocks, block_size, heads, dim]``."""
    num_tokens, num_heads, head_dim = query.shape
    if num_tokens == 0:
        return
    block_size = kv_cache.shape[2]
    k_cache, v_cache = kv_cache[0].flatten(0, 1), kv_cache[1].flatten(0, 1)  # views: [slots, heads, dim]
    num_reqs = md.seq_lens.shape[0]
    # The plan is made here as in the aten body (on the first call), so both read the same key blocks.
    key_limit = md.plan.blocks_to_read(md.seq_lens, block_size) * block_size if md.plan is not None else md.seq_lens
    for t in (query, key, value, output):
        assert t.stride(2) == 1, "the kernel reads head_dim contiguously"
    _attention_kernel[(num_tokens, num_heads)](
        query,
        key,
        value,
        output,
        k_cache,
        v_cache,
        md.slot_mapping,
        md.query_start_loc,
        md.seq_lens,
        md.block_table,
        key_limit,
        num_tokens,
        num_reqs,
        md.max_seq_len,
        head_dim**-0.5,
        *(t.stride(dim) for t in (query, key, value, output) for dim in (0, 1)),  # stride_qt, stride_qh, ...
        *k_cache.stride()[:2],  # stride_cache_slot, stride_cache_head
        md.block_table.stride(0),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_R=triton.next_power_of_2(num_reqs),
        BLOCK_N=_KEYS_PER_ITERATION,
        HAS_KEY_LIMIT=md.plan is not None,
        **pdl_options(),
    )
