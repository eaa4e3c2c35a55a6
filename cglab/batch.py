"""Input batches, the graph key (``BatchExecutionDescriptor``) and dispatch of a batch to a graph.

vLLM: ``vllm/v1/worker/gpu/input_batch.py`` and the dispatch in ``cudagraph_utils.py``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from cglab.buffers import InputBuffers
from cglab.config import CUDAGraphMode


@dataclass(frozen=True)
class BatchExecutionDescriptor:
    """What a graph was captured for; also the key it is stored under.

    ``num_reqs is None`` means "any number of requests": PIECEWISE graphs pad only tokens, because
    the attention that runs eagerly between their segments must see the real batch (vLLM PR #49302).
    """

    cg_mode: CUDAGraphMode
    num_tokens: int
    num_reqs: int | None = None

    def __str__(self) -> str:
        reqs = "any" if self.num_reqs is None else self.num_reqs
        return f"{self.cg_mode.name}(tokens={self.num_tokens}, reqs={reqs})"


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
    def prepare(cls, query_lens: Sequence[int], seq_lens: Sequence[int], input_ids: Sequence[int],
                input_buffers: InputBuffers, num_tokens_after_padding: int,
                num_reqs_after_padding: int) -> InputBatch:
        """Write a real batch into ``input_buffers`` (in place) and describe it."""
        num_tokens = sum(query_lens)
        query_start_loc = [0]
        positions: list[int] = []
        for q, s in zip(query_lens, seq_lens):
            query_start_loc.append(query_start_loc[-1] + q)
            positions.extend(range(s - q, s))
        input_buffers.write(input_ids, positions, query_start_loc, seq_lens,
                            num_tokens_after_padding, num_reqs_after_padding)
        return cls._from_buffers(input_buffers, num_reqs_after_padding, num_tokens, num_tokens_after_padding,
                                 max(query_lens), max(seq_lens))

    @classmethod
    def make_dummy(cls, num_reqs: int, num_tokens: int, input_buffers: InputBuffers) -> InputBatch:
        """A capture batch: query lengths split evenly (the rest on the last request), ``seq_lens`` equal
        to the query lengths, token ids and positions zero."""
        query_lens = [num_tokens // num_reqs] * num_reqs
        query_lens[-1] += num_tokens % num_reqs
        query_start_loc = [0]
        for q in query_lens:
            query_start_loc.append(query_start_loc[-1] + q)
        input_buffers.write([0] * num_tokens, [0] * num_tokens, query_start_loc, query_lens, num_tokens, num_reqs)
        return cls._from_buffers(input_buffers, num_reqs, num_tokens, num_tokens, max(query_lens), max(query_lens))

    @classmethod
    def _from_buffers(cls, buffers: InputBuffers, num_reqs: int, num_tokens: int, num_tokens_padded: int,
                      max_query_len: int, max_seq_len: int) -> InputBatch:
        return cls(num_reqs, num_tokens, num_tokens_padded, buffers.input_ids[:num_tokens_padded],
                   buffers.positions[:num_tokens_padded], buffers.query_start_loc[: num_reqs + 1],
                   buffers.seq_lens[:num_reqs], max_query_len, max_seq_len)


class CudagraphDispatcher:
    """Maps a batch to the graph that serves it, through a lookup table built once.

    A batch runs in the graph of the smallest captured size that holds its tokens; if none does, it
    runs eagerly. The toy's FULL graphs are decode graphs (one token per request), so a mixed or
    prefill batch never takes one; under ``FULL_AND_PIECEWISE`` it takes a PIECEWISE graph instead.
    """

    def __init__(self, policy: CUDAGraphMode, capture_sizes: Sequence[int], max_num_reqs: int) -> None:
        self.policy = policy
        self.max_num_reqs = max_num_reqs
        sizes = sorted(capture_sizes)
        self.sizes = {
            CUDAGraphMode.PIECEWISE: sizes,
            # A uniform decode batch has one token per request, so larger FULL graphs could never be used.
            CUDAGraphMode.FULL: [s for s in sizes if s <= max_num_reqs],
        }
        self._padded: dict[CUDAGraphMode, list[int]] = {
            mode: [sizes_m[bisect_left(sizes_m, n)] for n in range(1, sizes_m[-1] + 1)] if sizes_m else []
            for mode, sizes_m in self.sizes.items()
        }

    def capture_descriptors(self) -> list[BatchExecutionDescriptor]:
        """Every graph to capture: PIECEWISE first (larger activations, so FULL fits in the same pool
        afterwards), then FULL; within a mode, largest first so smaller graphs reuse its memory."""
        descs = []
        for mode in self.policy.runtime_modes():
            for size in sorted(self.sizes[mode], reverse=True):
                descs.append(self._descriptor(mode, size))
        return descs

    def dispatch(self, num_reqs: int, num_tokens: int, uniform_decode: bool) -> BatchExecutionDescriptor:
        """The descriptor for a real batch: padded sizes and the runtime mode (NONE: run eagerly)."""
        mode = self.policy.decode_mode() if uniform_decode else self.policy.mixed_mode()
        if mode is CUDAGraphMode.FULL and not uniform_decode:
            mode = CUDAGraphMode.NONE
        table = self._padded.get(mode, [])
        if mode is CUDAGraphMode.NONE or num_tokens > len(table):
            return BatchExecutionDescriptor(CUDAGraphMode.NONE, num_tokens, num_reqs)
        return self._descriptor(mode, table[num_tokens - 1])

    def _descriptor(self, mode: CUDAGraphMode, size: int) -> BatchExecutionDescriptor:
        if mode is CUDAGraphMode.FULL:  # FULL pads requests too: the graph baked in their count
            return BatchExecutionDescriptor(mode, size, min(size, self.max_num_reqs))
        return BatchExecutionDescriptor(mode, size, None)
