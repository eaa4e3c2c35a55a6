"""``cglab::linear_attention`` as one Triton launch, prefill and decode alike (the toy's choice: vLLM's
linear-attention and Mamba ops run separate prefill and decode kernels): each program carries one
request's state tile through its new tokens and saves it.

Same result as the aten body in ``cglab/layers/linear_attn.py``: at most ``max_query_len`` tokens per
request (a host int a FULL graph freezes), ``slot_mapping == -1`` tokens read the state but do not update
it, rows of no request are zero; a request that updated nothing stores nothing (the aten body writes
the spare last entry, which nothing reads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cglab.kernels.pdl import pdl_options, wait_for_previous_kernels
from cglab.metadata import LinearAttentionMetadata

_VALUE_COLUMNS_PER_PROGRAM = 32


@triton.jit
def _linear_attention_kernel(
    query,
    key,
    value,
    decay,
    output,
    state_cache,
    slot_mapping,
    query_start_loc,
    seq_lens,
    state_indices,
    num_tokens,
    num_reqs,
    max_query_len,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_state,
    stride_state_head,
    stride_state_row,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_E: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernels(PDL)
    request = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)  # the state's rows (key dimension)
    e = tl.program_id(2) * BLOCK_E + tl.arange(0, BLOCK_E)  # this program's value columns
    d_ok = d < HEAD_DIM
    e_ok = e < HEAD_DIM
    zeros = tl.zeros([BLOCK_E], tl.float32)
    if request == num_reqs:  # the extra program: rows after the last request belong to none, zero
        for token in range(tl.load(query_start_loc + num_reqs), num_tokens):
            tl.store(output + token * stride_ot + head * stride_oh + e, zeros.to(output.dtype.element_ty), mask=e_ok)
    else:
        start = tl.load(query_start_loc + request)
        query_len = tl.load(query_start_loc + request + 1) - start
        tile = (d[:, None] < HEAD_DIM) & e_ok[None, :]
        state_at = (
            state_cache
            + tl.load(state_indices + request) * stride_state
            + head * stride_state_head
            + d[:, None] * stride_state_row
            + e[None, :]
        )
        fresh = tl.load(seq_lens + request) == query_len  # the first new token is the sequence's first
        state = tl.where(fresh, 0.0, tl.load(state_at, mask=tile, other=0.0).to(tl.float32))
        head_decay = tl.load(decay + head).to(tl.float32)
        updates = query_len * 0  # tokens that updated the state
        for j in range(0, query_len):
            token = start + j
            counted = j < max_query_len  # the aten body's loop ends there; later rows stay zero
            live = counted & (tl.load(slot_mapping + token) >= 0)
            q = tl.load(query + token * stride_qt + head * stride_qh + d, mask=d_ok, other=0.0).to(tl.float32)
            k = tl.load(key + token * stride_kt + head * stride_kh + d, mask=d_ok, other=0.0).to(tl.float32)
            v = tl.load(value + token * stride_vt + head * stride_vh + e, mask=e_ok, other=0.0).to(tl.float32)
            q = q / tl.maximum(tl.sqrt(tl.sum(q * q, axis=0)), 1e-12)
            k = k / tl.maximum(tl.sqrt(tl.sum(k * k, axis=0)), 1e-12)
            state = tl.where(live, head_decay * state + k[:, None] * v[None, :], state)
            updates += live.to(updates.dtype)
            out = tl.where(counted, tl.sum(q[:, None] * state, axis=0), zeros)
            tl.store(output + token * stride_ot + head * stride_oh + e, out.to(output.dtype.element_ty), mask=e_ok)
        if updates > 0:
            tl.store(state_at, state.to(state_cache.dtype.element_ty), mask=tile)


def linear_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    output: torch.Tensor,
    state_cache: torch.Tensor,
    md: LinearAttentionMetadata,
) -> None:
    """Launch over (request, plus one for the rows of none; head; block of value columns); ``state_cache``
    is ``[entries, heads, dim, dim]``."""
    num_tokens, num_heads, head_dim = query.shape
    num_reqs = md.state_indices.shape[0]
    for t in (query, key, value, output, state_cache):
        assert t.stride(-1) == 1, "the kernel reads head_dim contiguously"
    block_e = min(_VALUE_COLUMNS_PER_PROGRAM, triton.next_power_of_2(head_dim))
    _linear_attention_kernel[(num_reqs + 1, num_heads, triton.cdiv(head_dim, block_e))](
        query,
        key,
        value,
        decay,
        output,
        state_cache,
        md.slot_mapping,
        md.query_start_loc,
        md.seq_lens,
        md.state_indices,
        num_tokens,
        num_reqs,
        md.max_query_len,
        *(t.stride(dim) for t in (query, key, value, output) for dim in (0, 1)),  # stride_qt, stride_qh, ...
        *state_cache.stride()[:3],
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_E=block_e,
        **pdl_options(),
    )
