"""Linear attention with a recurrent state per request, the custom op ``cglab::linear_attention`` (vLLM:
``vllm/model_executor/layers/mamba/``; PR #49364: such backends "cannot generate capturable metadata for
prefill"). Per head ``S_t = decay * S_(t-1) + k_t^T v_t``, ``o_t = q_t S_t``; a splitting op."""

from __future__ import annotations

import torch
from torch import nn

from cglab.config import ToyConfig
from cglab.custom_ops import direct_register_custom_op
from cglab.forward_context import layer_metadata
from cglab.graphs import eager_break_during_capture
from cglab.kernels import triton_kernel
from cglab.kernels.fused_linear import Linear
from cglab.metadata import LinearAttentionMetadata


@eager_break_during_capture
def _linear_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    output: torch.Tensor,
    state_cache: torch.Tensor,
    layer_name: str,
) -> None:
    """Run each request's new tokens through its state, then save it, in tensor ops over ``max_query_len``
    offsets (a FULL decode graph records them). PAD_SLOT_ID tokens update nothing."""
    md: LinearAttentionMetadata | None = layer_metadata(layer_name, False)
    if md is None:  # profiling run: no batch, no state (as attention)
        output.zero_()
        return
    kernel = triton_kernel("linear_attention", query)
    if kernel is not None:  # CUDA: one launch, a state tile per program (cglab/kernels); the oracle is below
        kernel(query, key, value, decay, output, state_cache, md)
        return
    num_tokens = query.shape[0]
    query = nn.functional.normalize(query, dim=-1)
    key = nn.functional.normalize(key, dim=-1)
    starts, ends = md.query_start_loc[:-1], md.query_start_loc[1:]
    query_lens = ends - starts
    fresh = (md.seq_lens - query_lens) == 0  # the first new token is the sequence's first
    state = torch.where(fresh[:, None, None, None], 0.0, state_cache[md.state_indices])  # [reqs, heads, dim, dim]
    decay = decay[None, :, None, None]
    written = torch.zeros_like(fresh)
    output.zero_()
    for j in range(md.max_query_len):
        in_query = j < query_lens
        # A request past its last token points at row 0 and contributes zero there.
        token = torch.where(in_query, starts + j, 0).clamp(max=num_tokens - 1)
        live = in_query & (md.slot_mapping[token] >= 0)
        k, v = key[token], value[token]  # [reqs, heads, dim]
        updated = decay * state + k[..., :, None] * v[..., None, :]
        state = torch.where(live[:, None, None, None], updated, state)
        written = written | live
        out = torch.einsum("rhd,rhde->rhe", query[token], state)
        output.index_add_(0, token, torch.where(in_query[:, None, None], out, 0.0))
    spare = state_cache.shape[0] - 1
    state_cache[torch.where(written, md.state_indices, spare)] = state


linear_attention = direct_register_custom_op(
    "linear_attention", _linear_attention, mutates_args=("output", "state_cache")
)


class LinearAttention(nn.Module):
    """Pre-norm linear-attention block with a paged state cache ``[num_blocks + 1, heads, dim, dim]``
    (one state per request, at its first block) plus a spare last entry for padding writes."""

    def __init__(self, config: ToyConfig, layer_name: str) -> None:
        super().__init__()
        self.layer_name = layer_name
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.norm = nn.RMSNorm(config.hidden_size)
        self.qkv_proj = Linear(config.hidden_size, 3 * config.hidden_size)
        self.o_proj = Linear(config.hidden_size, config.hidden_size)
        # sigmoid(2 +- noise): a memory of roughly ten tokens per head, different for every head.
        self.decay_logits = nn.Parameter(torch.randn(config.num_heads) + 2.0)
        self.register_buffer(
            "state_cache",
            torch.zeros(config.num_blocks + 1, config.num_heads, config.head_dim, config.head_dim),
            persistent=False,
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden, self.norm).view(-1, 3, self.num_heads, self.head_dim).unbind(1)
        out = torch.empty_like(q)
        linear_attention(q, k, v, torch.sigmoid(self.decay_logits), out, self.state_cache, self.layer_name)
        return self.o_proj(out.flatten(1), residual=hidden)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"state_cache": self.state_cache[:-1]}
