"""DeepSeek-V4-style KV compressor (vLLM: ``vllm/models/deepseek_v4/compressor.py``): every ``ratio`` saved
states fold into a compressed entry. vLLM has not compiled DeepSeek V4 since PR #43746; at the fix its compressor
ran in an eager break, and since #51430 model runner v2 captures it in the breakable graph, its guard in plain
Python. The toy constructs the failing case: a compiled graph piece (the custom op ``cglab::compressor``,
``None`` guard inside)."""

from __future__ import annotations

import torch
from torch import nn

from cglab.config import ToyConfig
from cglab.custom_ops import direct_register_custom_op
from cglab.forward_context import forward_context_has_metadata, layer_metadata
from cglab.kernels import triton_kernel
from cglab.kernels.fused_linear import Linear
from cglab.metadata import CompressorMetadata


def _compressor(
    kv: torch.Tensor,
    output: torch.Tensor,
    state_cache: torch.Tensor,
    compressed_cache: torch.Tensor,
    pool_logits: torch.Tensor,
    layer_name: str,
    strict: bool = False,
) -> None:
    """Save each token's state, fold completed groups, and pool the entries each token may see."""
    md: CompressorMetadata | None = layer_metadata(layer_name, strict)
    if md is None:
        # Meant for profiling runs: save nothing, see nothing. Captured this way, it saves nothing ever again.
        output.zero_()
        return
    kernel = triton_kernel("compressor", kv)
    if kernel is not None:  # CUDA: the Triton kernel (cglab/kernels), which skips -1 slots; the oracle is below
        kernel(kv, output, state_cache, compressed_cache, pool_logits, md)
        return
    state_cache[md.slot_mapping] = kv
    group = state_cache[md.group_slots]  # [tokens, ratio, hidden]
    entry = (group * pool_logits.softmax(0)[:, None]).sum(1)
    compressed_cache[md.compress_slots] = entry  # tokens that complete no group write the spare row
    visible = md.visible_slots >= 0
    seen = torch.where(visible[..., None], compressed_cache[md.visible_slots], 0)
    output.copy_(seen.sum(1) / visible.sum(1, keepdim=True).clamp(min=1))


compressor = direct_register_custom_op(
    "compressor", _compressor, mutates_args=("output", "state_cache", "compressed_cache")
)


class Compressor(nn.Module):
    """Pre-norm compressor block; ``strict_layers`` and ``python_guards`` (the config's) as ``ShortConv``'s."""

    def __init__(self, config: ToyConfig, layer_name: str) -> None:
        super().__init__()
        self.layer_name, self.python_guard = layer_name, config.python_guards
        self.strict = config.strict_layers or self.python_guard  # a guard in forward: none in the op
        hidden, ratio = config.hidden_size, config.compress_ratio
        self.norm = nn.RMSNorm(hidden)
        self.kv_proj = Linear(hidden, hidden)
        self.pool_logits = nn.Parameter(torch.randn(ratio))  # learned weights of the tokens in a group
        self.out_proj = Linear(hidden, hidden)
        entries = config.num_blocks * (config.block_size // ratio)
        # Spare last rows: PAD_SLOT_ID (-1) writes land there.
        self.register_buffer("state_cache", torch.zeros(config.num_slots + 1, hidden), persistent=False)
        self.register_buffer("compressed_cache", torch.zeros(entries + 1, hidden), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.python_guard and not forward_context_has_metadata():
            return hidden  # a profiling run: save nothing, see nothing (under torch.compile: for good)
        kv = self.kv_proj(hidden, self.norm)
        pooled = torch.empty_like(kv)
        compressor(kv, pooled, self.state_cache, self.compressed_cache, self.pool_logits, self.layer_name, self.strict)
        return self.out_proj(pooled, residual=hidden)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"state_cache": self.state_cache[:-1], "compressed_cache": self.compressed_cache[:-1]}
