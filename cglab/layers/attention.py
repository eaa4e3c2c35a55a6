"""Paged attention, the custom op ``cglab::unified_attention`` that PIECEWISE graphs split at (vLLM:
``unified_attention_with_output``, ``vllm/compilation/breakable_cudagraph.py``): it runs eagerly on live
metadata (why attention-only models never noticed the bug). The aten body reads keys up to the host-side
``max_seq_len`` (a toy artefact); the Triton kernel stops at each request's ``seq_lens``, as vLLM's do."""

from __future__ import annotations

import torch
from torch import nn

from cglab.config import ToyConfig
from cglab.custom_ops import direct_register_custom_op
from cglab.errors import CaptureError
from cglab.forward_context import layer_metadata
from cglab.graphs import eager_break_during_capture
from cglab.kernels import triton_kernel
from cglab.kernels.fused_linear import Linear
from cglab.metadata import AttentionMetadata, slots_at, token_requests_and_positions

_MASKED = -1e30  # finite: a row with nothing visible gets uniform weights over zeroed values, not NaN


@eager_break_during_capture
def _unified_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    output: torch.Tensor,
    kv_cache: torch.Tensor,
    layer_name: str,
    max_model_len: int,
) -> None:
    """Store keys and values at ``slot_mapping``, then attend over each token's history, into ``output``
    (only a caller's buffer survives between PIECEWISE segments)."""
    md: AttentionMetadata | None = layer_metadata(layer_name, False)
    if md is None:  # profiling run: no batch to attend over (vLLM's backends return zeros)
        output.zero_()
        return
    block_size = kv_cache.shape[2]
    _check_rows_hold(md, layer_name, block_size, max_model_len)
    kernel = triton_kernel("unified_attention", query)
    if kernel is not None:  # CUDA: one launch that stops at the live seq_lens (cglab/kernels); the oracle is below
        kernel(query, key, value, output, kv_cache, md)
        return
    num_tokens, num_heads, head_dim = query.shape
    k_cache, v_cache = kv_cache[0].flatten(0, 1), kv_cache[1].flatten(0, 1)  # [slots + 1, heads, dim]
    # Padding rows carry PAD_SLOT_ID (-1), which indexes the spare last row: no branch needed.
    k_cache[md.slot_mapping] = key
    v_cache[md.slot_mapping] = value

    request, position = token_requests_and_positions(md.query_start_loc, md.seq_lens, num_tokens)
    key_pos = torch.arange(md.max_seq_len, device=query.device)  # the kernel's key range: host-side width
    visible = (key_pos[None, :] <= position[:, None]) & (key_pos[None, :] < md.seq_lens[request][:, None])
    if md.plan is not None:
        # A lazily planned kernel, like FlashMLA's decode kernel: it plans on its first call (when the
        # plan is empty), reuses the plan afterwards, and reads only the key blocks the plan gives.
        key_blocks = md.plan.blocks_to_read(md.seq_lens, block_size)
        visible = visible & (key_pos[None, :] < key_blocks[request][:, None] * block_size)
    slots = slots_at(md.block_table, request[:, None], key_pos[None, :], block_size)
    keys, values = k_cache[slots], v_cache[slots]  # [tokens, keys, heads, dim]
    values = torch.where(visible[..., None, None], values, 0)
    scores = torch.einsum("thd,tkhd->thk", query, keys) * head_dim**-0.5
    scores = torch.where(visible[:, None, :], scores, _MASKED)
    output.copy_(torch.einsum("thk,tkhd->thd", scores.softmax(-1), values))


def _check_rows_hold(md: AttentionMetadata, layer_name: str, block_size: int, max_model_len: int) -> None:
    """A request longer than its block-table row reads past it: only a dummy capture batch split as before
    vLLM PR #49751 is that long, where FA3 hit an illegal address and #49364 was reverted. Checked on the host,
    from ``max_seq_len``, so no faulting kernel poisons a notebook's CUDA context."""
    row = md.block_table.shape[1]
    if md.max_seq_len <= row * block_size:
        return
    seq_lens = md.seq_lens.tolist()  # only here: an eager break may read the host
    request = max(range(len(seq_lens)), key=seq_lens.__getitem__)
    blocks = -(-seq_lens[request] // block_size)
    raise CaptureError(
        f"{layer_name}: request {request} of this batch has {seq_lens[request]} tokens, above max_model_len "
        f"({max_model_len}), so attention would read block_table[{request}][{row}..{blocks - 1}], past the "
        f"{row} blocks of its row: an illegal address on a GPU. This is the crash that got vLLM PR #49364 "
        "reverted; #49751 splits the dummy batch so that no request exceeds max_model_len (drop "
        "pre_49751_dummy_split)"
    )


unified_attention = direct_register_custom_op(
    "unified_attention", _unified_attention, mutates_args=("output", "kv_cache")
)


class Attention(nn.Module):
    """Pre-norm attention block with a paged KV cache ``[2, num_blocks, block_size, heads, dim]``
    plus one spare block whose last row absorbs padded writes."""

    def __init__(self, config: ToyConfig, layer_name: str) -> None:
        super().__init__()
        self.layer_name = layer_name
        self.max_model_len = config.max_model_len
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.norm = nn.RMSNorm(config.hidden_size)
        self.qkv_proj = Linear(config.hidden_size, 3 * config.hidden_size)
        self.o_proj = Linear(config.hidden_size, config.hidden_size)
        self.register_buffer(
            "kv_cache",
            torch.zeros(2, config.num_blocks + 1, config.block_size, config.num_heads, config.head_dim),
            persistent=False,
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden, self.norm).view(-1, 3, self.num_heads, self.head_dim).unbind(1)
        out = torch.empty_like(q)
        unified_attention(q, k, v, out, self.kv_cache, self.layer_name, self.max_model_len)
        return self.o_proj(out.flatten(1), residual=hidden)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"kv_cache": self.kv_cache[:, :-1]}
