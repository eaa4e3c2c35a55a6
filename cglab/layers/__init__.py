"""The toy model's token mixers: paged attention (the eager break) and two attention-like stateful
layers that run inside graph segments and read attention metadata."""

from cglab.layers.attention import Attention, unified_attention
from cglab.layers.compressor import Compressor
from cglab.layers.sconv import ShortConv

__all__ = ["Attention", "Compressor", "ShortConv", "unified_attention"]
