"""The toy model's token mixers: paged attention and linear attention (splitting ops, or eager breaks)
and two attention-like stateful layers that run inside graph pieces and read attention metadata. Each
one's kernel is a torch custom op (``cglab::unified_attention``, ``cglab::linear_attention``,
``cglab::short_conv``, ``cglab::compressor``)."""

from cglab.layers.attention import Attention, unified_attention
from cglab.layers.compressor import Compressor, compressor
from cglab.layers.linear_attn import LinearAttention, linear_attention
from cglab.layers.sconv import ShortConv, short_conv

__all__ = [
    "Attention",
    "Compressor",
    "LinearAttention",
    "ShortConv",
    "compressor",
    "linear_attention",
    "short_conv",
    "unified_attention",
]
