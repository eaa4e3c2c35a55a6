"""What capture metadata a metadata builder can build (vLLM: ``AttentionCGSupport`` in
``vllm/v1/attention/backend.py``).

A FULL graph freezes its metadata at capture, so a builder says which batches it can build
*capture* metadata (``for_capture=True``) for: its ``cudagraph_support``. ModelRunner lowers the
CUDA graph mode to what the least capable builder supports (``resolve_cudagraph_mode``). Ordinary
metadata (``for_capture=False``) every builder builds for any batch.
"""

from __future__ import annotations

import enum

__all__ = ["AttentionCGSupport", "can_build_metadata"]


class AttentionCGSupport(enum.IntEnum):
    """Which batches a builder can build capture metadata for; ordered, lowest first."""

    NEVER = 0  # none: no FULL graph can hold this layer
    UNIFORM_SINGLE_TOKEN_DECODE = 1  # decode-only batches, one token per request (Mamba-like layers)
    UNIFORM_BATCH = 2  # batches whose requests all have the same number of tokens
    ALWAYS = 3  # any batch, prefill and mixed ones included

    def describe(self) -> str:
        """What capture metadata this level covers, in words."""
        return {
            AttentionCGSupport.NEVER: "no batch",
            AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE: "decode-only batches (one token per request)",
            AttentionCGSupport.UNIFORM_BATCH: "batches whose requests all have the same query length",
            AttentionCGSupport.ALWAYS: "any batch",
        }[self]


def can_build_metadata(support: AttentionCGSupport, *, num_reqs: int, num_tokens: int, max_query_len: int,
                       for_capture: bool) -> bool:
    """Whether a builder of ``support`` can build metadata for a batch of this shape.

    The one rule for both the builders' refusals and the pictures of them. Host-side sizes only,
    so a builder can ask it without a device sync. Ordinary metadata: always.
    """
    if not for_capture or support is AttentionCGSupport.ALWAYS:
        return True
    if support is AttentionCGSupport.UNIFORM_BATCH:
        return num_tokens == max_query_len * num_reqs  # every query as long as the longest
    if support is AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE:
        return num_tokens == num_reqs and max_query_len == 1
    return False
