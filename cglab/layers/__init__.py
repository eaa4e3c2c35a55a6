"""The toy model's token mixers, each with its kernel in a torch custom op (``cglab::...``): attention and
linear attention (splitting ops, or eager breaks), and two stateful layers that run inside graph pieces and
read attention metadata (short conv, compressor)."""

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
