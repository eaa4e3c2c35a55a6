"""Inkling-style short convolution over a paged conv-state cache, inside the graph pieces (vLLM:
``vllm/models/inkling/...``): it reads the previous ``kernel_size - 1`` inputs through the block table,
so it needs attention metadata. The ``None`` guard sits in the custom op ``cglab::short_conv``, decided
when it runs (at capture too); ``python_guard=True`` puts it in ``forward``, as Inkling does."""

from __future__ import annotations

import torch
from torch import nn

from cglab.config import ToyConfig
from cglab.custom_ops import direct_register_custom_op
from cglab.forward_context import forward_context_has_metadata, layer_metadata
from cglab.kernels import triton_kernel
from cglab.kernels.fused_linear import Linear
from cglab.metadata import ShortConvMetadata


def _short_conv(
    x: torch.Tensor,
    output: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    layer_name: str,
    strict: bool = False,
) -> None:
    """Store each token's input at its slot, then convolve it with the inputs before it."""
    md: ShortConvMetadata | None = layer_metadata(layer_name, strict)
    if md is None:
        # Meant for profiling runs: return the input unchanged. Under the legacy skip_attn path it also
        # runs at compiled PIECEWISE capture, so the piece records "copy the input" and replays that forever.
        output.copy_(x)
        return
    kernel = triton_kernel("short_conv", x)
    if kernel is not None:  # CUDA: the Triton kernel (cglab/kernels), which skips -1 slots; the oracle is below
        kernel(x, output, conv_state, weight, md)
        return
    conv_state[md.slot_mapping] = x  # write first: a prefill token's taps may be in this batch
    taps = conv_state[md.tap_slots]  # [tokens, kernel_size - 1, hidden]
    taps = torch.where(md.tap_slots[..., None] >= 0, taps, 0)  # before the sequence start: zero
    output.copy_((taps * weight[:-1]).sum(1) + x * weight[-1])


short_conv = direct_register_custom_op("short_conv", _short_conv, mutates_args=("output", "conv_state"))


class ShortConv(nn.Module):
    """Pre-norm causal conv block: ``strict_layers`` drops the guard, ``python_guards`` moves it to forward."""

    def __init__(self, config: ToyConfig, layer_name: str) -> None:
        super().__init__()
        self.layer_name, self.python_guard = layer_name, config.python_guards
        self.strict = config.strict_layers or self.python_guard  # a guard in forward: none in the op
        hidden = config.hidden_size
        self.norm = nn.RMSNorm(hidden)
        self.in_proj = Linear(hidden, hidden)
        self.conv_weight = nn.Parameter(torch.randn(config.sconv_kernel_size, hidden) / config.sconv_kernel_size**0.5)
        self.out_proj = Linear(hidden, hidden)
        # One row per cache slot, plus a spare last row that PAD_SLOT_ID (-1) writes land in.
        self.register_buffer("conv_state", torch.zeros(config.num_slots + 1, hidden), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.python_guard and not forward_context_has_metadata():
            return hidden  # a profiling run: the block does nothing (under torch.compile: for good)
        x = self.in_proj(hidden, self.norm)
        conv = torch.empty_like(x)
        short_conv(x, conv, self.conv_state, self.conv_weight, self.layer_name, self.strict)
        return self.out_proj(conv, act="silu", residual=hidden)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"conv_state": self.conv_state[:-1]}
