"""Paged attention, the custom op ``cglab::unified_attention`` PIECEWISE graphs split at (vLLM:
``unified_attention_with_output``, ``vllm/compilation/breakable_cudagraph.py``); it runs eagerly at
every step and reads live metadata. The aten body's key range is the host-side ``max_seq_len``
(``max_model_len`` in capture metadata: a toy artefact); on CUDA the Triton kernel (``cglab/kernels``)
stops at each request's ``seq_lens``, read on the device, as vLLM's kernels do."""

from __future__ import annotations

import torch
from torch import nn

from cglab.config import ToyConfig
from cglab.custom_ops import direct_register_custom_op
from cglab.errors import CaptureError
from cglab.forward_context import get_forward_context
from cglab.graphs import eager_break_during_capture
from cglab.kernels import triton_kernel
from cglab.metadata import AttentionMetadata, slots_at, token_requests_and_positions

_MASKED = -1e30  # finite: a row with nothing visible gets uniform weights over zeroed values, not NaN


@eager_break_during_capture
def _unified_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor,
                       kv_cache: torch.Tensor, layer_name: str, strict: bool = False) -> None:
    """Store keys and values at ``slot_mapping``, then attend over each token's history, into ``output``
    (only a caller's buffer survives between PIECEWISE segments). Live metadata: why attention-only
    models never noticed the bug."""
    metadata = get_forward_context().attn_metadata
    if metadata is None:  # profiling run: no batch to attend over (vLLM's backends return zeros)
        output.zero_()
        return
    md: AttentionMetadata = metadata[layer_name]
    if strict:
        _refuse_dummy_batch(md, layer_name)
    kernel = triton_kernel("unified_attention", query)
    if kernel is not None:  # CUDA: one launch that stops at the live seq_lens (cglab/kernels); the oracle is below
        kernel(query, key, value, output, kv_cache, md)
        return
    num_tokens, num_heads, head_dim = query.shape
    block_size = kv_cache.shape[2]
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


def _refuse_dummy_batch(md: AttentionMetadata, layer_name: str) -> None:
    """Strict attention: every real token row of ordinary metadata must have a KV slot, which the dummy
    capture batch lacks. The toy's stand-in for the crash that got PR #49364 reverted, not a model of
    FA3 (the reland #49995 credits #49751). Reads the host, so it runs only where attention is eager."""
    if md.for_capture:
        return
    if bool((md.slot_mapping[: md.num_actual_tokens] < 0).any()):
        raise CaptureError(
            f"{layer_name}: the strict (FA3-like) attention kernel got ordinary metadata for a batch whose real "
            "tokens have no KV slot (slot_mapping = PAD_SLOT_ID): the dummy capture batch. On a GPU this kernel "
            "would write at slot -1 and fault with an illegal memory access. Capture PIECEWISE attention on its "
            "profiling path, or give it capture-safe metadata (for_capture=True); the toy attention "
            "(strict_attention=False) copes with the dummy batch")


unified_attention = direct_register_custom_op("unified_attention", _unified_attention,
                                              mutates_args=("output", "kv_cache"))


class Attention(nn.Module):
    """Pre-norm attention block with a paged KV cache ``[2, num_blocks, block_size, heads, dim]``
    plus one spare block whose last row absorbs padded writes."""

    def __init__(self, config: ToyConfig, layer_name: str) -> None:
        super().__init__()
        self.layer_name = layer_name
        self.strict = config.strict_attention
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.norm = nn.RMSNorm(config.hidden_size)
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.register_buffer("kv_cache", torch.zeros(2, config.num_blocks + 1, config.block_size,
                                                     config.num_heads, config.head_dim), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(self.norm(hidden)).view(-1, 3, self.num_heads, self.head_dim).unbind(1)
        out = torch.empty_like(q)
        unified_attention(q, k, v, out, self.kv_cache, self.layer_name, self.strict)
        return hidden + self.o_proj(out.flatten(1))

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The cache without its spare block, for comparisons."""
        return {"kv_cache": self.kv_cache[:, :-1]}
