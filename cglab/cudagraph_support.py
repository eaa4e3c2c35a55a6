"""Which batches a builder can build capture metadata for (vLLM: ``AttentionCGSupport`` in
``vllm/v1/attention/backend.py``); the runner lowers the mode to the least capable builder's."""

from __future__ import annotations

import enum

__all__ = ["AttentionCGSupport", "can_build_metadata"]


class AttentionCGSupport(enum.IntEnum):
    """Which batches a builder can build capture metadata for; ordered, lowest first."""

    NEVER = 0  # none: no FULL graph can hold this layer
    UNIFORM_SINGLE_TOKEN_DECODE = 1  # decode-only batches, one token per request (vLLM: linear attention)
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


def can_build_metadata(
    support: AttentionCGSupport, *, num_reqs: int, num_tokens: int, max_query_len: int, for_capture: bool
) -> bool:
    """Whether a builder of ``support`` can build metadata for this batch shape (host sizes only: no sync).
    The one rule for the builders' refusals and the pictures of them."""
    if not for_capture or support is AttentionCGSupport.ALWAYS:
        return True
    if support is AttentionCGSupport.UNIFORM_BATCH:
        return num_tokens == max_query_len * num_reqs  # every query as long as the longest
    if support is AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE:
        return num_tokens == num_reqs and max_query_len == 1
    return False
