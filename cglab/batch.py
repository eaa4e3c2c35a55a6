"""Input batches, the graph key (``BatchExecutionDescriptor``) and dispatch of a batch to a graph
(vLLM: ``vllm/v1/worker/gpu/input_batch.py`` and the dispatch in ``cudagraph_utils.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from cglab.buffers import InputBuffers
from cglab.config import CUDAGraphMode, dummy_query_lens


@dataclass(frozen=True)
class BatchExecutionDescriptor:
    """What a graph was captured for, and its key. ``num_reqs=None``: any number of requests (PIECEWISE
    pads tokens only: eager attention must see the real batch, vLLM PR #49302). ``uniform_token_count``:
    only batches with exactly that many new tokens per request; None: any mix."""

    cg_mode: CUDAGraphMode
    num_tokens: int
    num_reqs: int | None = None
    uniform_token_count: int | None = None

    def __str__(self) -> str:
        reqs = "any" if self.num_reqs is None else self.num_reqs
        uniform = "" if self.uniform_token_count is None else f", uniform={self.uniform_token_count}"
        return f"{self.cg_mode.name}(tokens={self.num_tokens}, reqs={reqs}{uniform})"

    def is_compatible(self, num_reqs: int, num_tokens: int, uniform_token_count: int | None) -> bool:
        """Whether this graph can serve a batch: large enough, and uniform where it requires it."""
        return (
            (self.uniform_token_count is None or self.uniform_token_count == uniform_token_count)
            and (self.num_reqs is None or self.num_reqs >= num_reqs)
            and self.num_tokens >= num_tokens
        )


@dataclass
class InputBatch:
    """One step's inputs: views of the persistent buffers plus the host-side sizes kernels need."""

    num_reqs: int  # requests the kernels see (padded under FULL)
    num_tokens: int  # real tokens
    num_tokens_after_padding: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    query_start_loc: torch.Tensor  # [num_reqs + 1]
    seq_lens: torch.Tensor  # [num_reqs]
    max_query_len: int
    max_seq_len: int

    @classmethod
    def prepare(
        cls,
        query_lens: Sequence[int],
        seq_lens: Sequence[int],
        input_ids: Sequence[int] | None,
        input_buffers: InputBuffers,
        num_tokens_after_padding: int,
        num_reqs_after_padding: int,
    ) -> InputBatch:
        """Write a real batch into ``input_buffers`` in place (``input_ids=None``: keep the ids) and describe it."""
        num_tokens = sum(query_lens)
        positions = [p for q, s in zip(query_lens, seq_lens) for p in range(s - q, s)]
        query_start_loc = [0, *accumulate(query_lens)]
        input_buffers.write(
            input_ids, positions, query_start_loc, seq_lens, num_tokens_after_padding, num_reqs_after_padding
        )
        return cls._from_buffers(
            input_buffers, num_reqs_after_padding, num_tokens, num_tokens_after_padding, max(query_lens), max(seq_lens)
        )

    @classmethod
    def make_dummy(cls, num_reqs: int, num_tokens: int, input_buffers: InputBuffers) -> InputBatch:
        """A capture batch: query lengths from ``dummy_query_lens``, ``seq_lens`` equal to them, ids and positions 0."""
        query_lens = dummy_query_lens(num_reqs, num_tokens, input_buffers.pre_49751_dummy_split)
        zeros = [0] * num_tokens
        input_buffers.write(zeros, zeros, [0, *accumulate(query_lens)], query_lens, num_tokens, num_reqs)
        return cls._from_buffers(input_buffers, num_reqs, num_tokens, num_tokens, max(query_lens), max(query_lens))

    @classmethod
    def _from_buffers(
        cls,
        buffers: InputBuffers,
        num_reqs: int,
        num_tokens: int,
        num_tokens_padded: int,
        max_query_len: int,
        max_seq_len: int,
    ) -> InputBatch:
        return cls(
            num_reqs,
            num_tokens,
            num_tokens_padded,
            buffers.input_ids[:num_tokens_padded],
            buffers.positions[:num_tokens_padded],
            buffers.query_start_loc[: num_reqs + 1],
            buffers.seq_lens[:num_reqs],
            max_query_len,
            max_seq_len,
        )


def prefill_runs_as_decode(lens: Sequence[int], computed: Sequence[int], prefilling: Sequence[bool]) -> list[bool]:
    """Per request: a prompt chunk of one token after earlier chunks, which computes exactly as a decode does
    (vLLM: ``InputBatch.prefill_runs_as_decode_np``, set in the runner's ``gather_batch_req_state``)."""
    return [p and q == 1 and c > 0 for q, c, p in zip(lens, computed, prefilling)]


def decode_graph_eligible(lens: Sequence[int], computed: Sequence[int], prefilling: Sequence[bool], rule: str) -> bool:
    """Whether a batch may take a uniform-decode graph (vLLM: ``InputBatch.decode_graph_eligible``, "no prefills,
    or only prefill rows that run as decodes"), under one of ``compilation_config.UNIFORM_DECODE_RULES``:
    "current", vLLM's rule today; "51865", PR #51865's (August 2026); "shape", before it the shape alone."""
    if rule == "shape":
        return True
    if rule == "51865":
        return not any(prefilling)
    return all(d or not p for d, p in zip(prefill_runs_as_decode(lens, computed, prefilling), prefilling))


def get_uniform_decode_token_count(query_lens: Sequence[int], decode_graph_eligible: bool) -> int | None:
    """The tokens every request has in a uniform decode batch, else None (vLLM's function of this name):
    equal query lengths in a batch that ``decode_graph_eligible`` admits."""
    max_query_len = max(query_lens)
    if not decode_graph_eligible or sum(query_lens) != max_query_len * len(query_lens):
        return None
    return max_query_len


def uniform_decode_sizes(capture_sizes: Sequence[int], decode_query_len: int, max_num_reqs: int) -> list[int]:
    """The token counts of the FULL uniform-decode graphs (vLLM: ``CudaGraphManager._init_candidates``): each
    capture size rounded up to a multiple of ``decode_query_len``, kept if within the largest and ``max_num_reqs``."""
    largest = max(capture_sizes, default=0)
    rounded = {-(-size // decode_query_len) * decode_query_len for size in capture_sizes}
    return sorted(n for n in rounded if n <= largest and n // decode_query_len <= max_num_reqs)


class CudagraphDispatcher:
    """Maps a batch to the graph that serves it (vLLM model runner v2: ``cudagraph_utils.py``). Per token
    count, the candidates are per mode the smallest size that holds the tokens, FULL first (a uniform decode
    batch pads up to a FULL graph before a smaller PIECEWISE one, vLLM PR #53407); the first compatible wins."""

    def __init__(
        self, policy: CUDAGraphMode, capture_sizes: Sequence[int], max_num_reqs: int, decode_query_len: int = 1
    ) -> None:
        self.policy = policy
        self.max_num_reqs = max_num_reqs
        self.decode_query_len = decode_query_len
        self.descriptors = self._descriptors(sorted(capture_sizes))
        largest = max((d.num_tokens for d in self.descriptors), default=0)
        self._candidates = [self._candidates_for(n) for n in range(largest + 1)]

    def _descriptors(self, sizes: list[int]) -> list[BatchExecutionDescriptor]:
        descs = []
        q = self.decode_query_len
        if self.policy in (CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE):
            descs += [
                BatchExecutionDescriptor(CUDAGraphMode.FULL, n, n // q, uniform_token_count=q)
                for n in uniform_decode_sizes(sizes, q, self.max_num_reqs)
            ]
        mixed = self.policy.mixed_mode()
        for size in sizes:
            if mixed is CUDAGraphMode.FULL:  # FULL pads requests too: the graph baked in their count
                descs.append(BatchExecutionDescriptor(mixed, size, min(size, self.max_num_reqs)))
            elif mixed is CUDAGraphMode.PIECEWISE:
                descs.append(BatchExecutionDescriptor(mixed, size, None))
        return descs

    def _candidates_for(self, num_tokens: int) -> list[BatchExecutionDescriptor]:
        found = []
        for mode in (CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE):
            fitting = [d for d in self.descriptors if d.cg_mode is mode and d.num_tokens >= num_tokens]
            smallest = min((d.num_tokens for d in fitting), default=None)
            found += [d for d in fitting if d.num_tokens == smallest]
        return found

    def candidates(self, num_tokens: int) -> list[BatchExecutionDescriptor]:
        """The graphs a batch of ``num_tokens`` may take, in the order dispatch tries them."""
        return list(self._candidates[num_tokens]) if 0 < num_tokens < len(self._candidates) else []

    def capture_descriptors(self) -> list[BatchExecutionDescriptor]:
        """Every graph to capture: PIECEWISE first, then FULL; largest first, so smaller graphs reuse its memory."""
        return [
            d
            for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)
            for d in sorted((d for d in self.descriptors if d.cg_mode is mode), key=lambda d: -d.num_tokens)
        ]

    def dispatch(self, num_reqs: int, num_tokens: int, uniform_token_count: int | None) -> BatchExecutionDescriptor:
        """The descriptor for a real batch (NONE: run eagerly); ``uniform_token_count``: None unless uniform decode."""
        for desc in self.candidates(num_tokens):
            if desc.is_compatible(num_reqs, num_tokens, uniform_token_count):
                return desc
        return BatchExecutionDescriptor(CUDAGraphMode.NONE, num_tokens, num_reqs)
