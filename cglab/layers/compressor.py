"""DeepSeek-V4-style KV compressor. It runs *inside* graph segments.

vLLM: ``vllm/model_executor/models/deepseek_v4/compressor.py``.
Every token saves a partial state at its slot (``slot_mapping``); the token that completes a group
of ``ratio`` folds the group into one compressed entry. The layer then reads the compressed entries
its sequence has so far (a pooled summary of the long context), which is what the model sees.
"""

from __future__ import annotations

import torch
from torch import nn

from cglab.config import ToyConfig
from cglab.forward_context import layer_metadata
from cglab.metadata import CompressorMetadata


class Compressor(nn.Module):
    """Pre-norm compressor block. ``strict=True`` drops the profiling guard."""

    def __init__(self, config: ToyConfig, layer_name: str, strict: bool = False) -> None:
        super().__init__()
        self.layer_name, self.strict = layer_name, strict
        hidden, ratio = config.hidden_size, config.compress_ratio
        self.norm = nn.RMSNorm(hidden)
        self.kv_proj = nn.Linear(hidden, hidden, bias=False)
        self.pool_logits = nn.Parameter(torch.randn(ratio))  # learned weights of the tokens in a group
        self.out_proj = nn.Linear(hidden, hidden, bias=False)
        entries = config.num_blocks * (config.block_size // ratio)
        # Spare last rows: PAD_SLOT_ID (-1) writes land there.
        self.register_buffer("state_cache", torch.zeros(config.num_slots + 1, hidden), persistent=False)
        self.register_buffer("compressed_cache", torch.zeros(entries + 1, hidden), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        md: CompressorMetadata | None = layer_metadata(self.layer_name, self.strict)
        if md is None:
            # Meant for profiling runs: save nothing. Captured this way, it saves nothing ever again.
            return hidden
        self.state_cache[md.slot_mapping] = self.kv_proj(self.norm(hidden))
        group = self.state_cache[md.group_slots]  # [tokens, ratio, hidden]
        entry = (group * self.pool_logits.softmax(0)[:, None]).sum(1)
        self.compressed_cache[md.compress_slots] = entry  # tokens that complete no group write the spare row
        visible = md.visible_slots >= 0
        seen = torch.where(visible[..., None], self.compressed_cache[md.visible_slots], 0)
        pooled = seen.sum(1) / visible.sum(1, keepdim=True).clamp(min=1)
        return hidden + self.out_proj(pooled)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"state_cache": self.state_cache[:-1], "compressed_cache": self.compressed_cache[:-1]}
