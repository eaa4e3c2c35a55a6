"""Capturing and replaying graphs (vLLM: ``vllm/v1/worker/gpu/cudagraph_utils.py``).

Two versions of ``prepare_inputs_to_capture`` live here side by side, because the difference
between them *is* the bug this suite teaches:

* ``prepare_inputs_to_capture_legacy(..., skip_attn)``: before vLLM PR #49364. PIECEWISE capture
  skipped metadata (``attn_metadata = None``), reasoning that attention is not captured there.
* ``prepare_inputs_to_capture(..., full_cudagraph)``: after the fix. Metadata is always built, with
  ``for_capture=full_cudagraph``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from cglab.batch import BatchExecutionDescriptor, CudagraphDispatcher, InputBatch
from cglab.buffers import BlockTables, InputBuffers
from cglab.config import CUDAGraphMode
from cglab.graphs import CapturedGraph, GraphBackend
from cglab.metadata import AttentionGroup, prepare_attn


def _prepare_dummy(num_reqs: int, num_tokens: int, input_buffers: InputBuffers,
                   block_tables: BlockTables) -> tuple[InputBatch, torch.Tensor, torch.Tensor]:
    """A dummy batch whose slot mapping is all padding: warmup and capture store nothing real."""
    input_batch = InputBatch.make_dummy(num_reqs, num_tokens, input_buffers)
    return input_batch, block_tables.get_dummy_block_tables(num_reqs), block_tables.get_dummy_slot_mappings(num_tokens)


def prepare_inputs_to_capture(num_reqs: int, num_tokens: int, input_buffers: InputBuffers,
                              block_tables: BlockTables, attn_groups: Sequence[AttentionGroup],
                              full_cudagraph: bool) -> tuple[dict[str, Any], torch.Tensor]:
    """Inputs and metadata for capturing one graph (the fixed version, vLLM PR #49364).

    Metadata is always built. FULL graphs get capture-safe metadata (``for_capture=True``). PIECEWISE
    graphs get ordinary metadata (``for_capture=False``): attention runs for real on this dummy batch
    at its eager break, and attention-like ops inside the segments (sconv, the compressor) need
    metadata to record their work at all. Fragile: those ops keep reading the *storage* of this
    metadata at every replay, so ordinary builders must write into persistent buffers.
    """
    input_batch, block_table, slot_mapping = _prepare_dummy(num_reqs, num_tokens, input_buffers, block_tables)
    attn_metadata = prepare_attn(input_batch, block_table, slot_mapping, attn_groups, for_capture=full_cudagraph)
    return attn_metadata, slot_mapping


def prepare_inputs_to_capture_legacy(num_reqs: int, num_tokens: int, input_buffers: InputBuffers,
                                     block_tables: BlockTables, attn_groups: Sequence[AttentionGroup],
                                     skip_attn: bool) -> tuple[dict[str, Any] | None, torch.Tensor]:
    """The version *before* the fix, kept to reproduce the bug. Do not use it for anything else.

    With ``skip_attn=True`` (what PIECEWISE capture passed) no metadata is built. Attention does not
    care: it runs eagerly at replay and reads live metadata. But guarded in-graph layers see ``None``,
    take their profiling branch, and the graph records a no-op.
    """
    input_batch, block_table, slot_mapping = _prepare_dummy(num_reqs, num_tokens, input_buffers, block_tables)
    attn_metadata = None
    if not skip_attn:
        attn_metadata = prepare_attn(input_batch, block_table, slot_mapping, attn_groups, for_capture=True)
    return attn_metadata, slot_mapping


class ForwardFnFactory(Protocol):
    def __call__(self, desc: BatchExecutionDescriptor, warmup: bool) -> Callable[[CUDAGraphMode], torch.Tensor]:
        """A forward over ``desc``'s dummy batch, run as ``fn(cg_mode)``.

        Called twice per graph, once for warmup and once for capture, each time preparing fresh
        inputs and metadata: warmup may change its metadata (vLLM #42444 lost a kernel that way).
        """


@dataclass
class CapturedEntry:
    graph: CapturedGraph
    output: torch.Tensor  # the static output: the graph rewrites this storage at every replay
    # Keeps the capture-time inputs alive, so a graph that still reads them reads stale values
    # (deterministic and teachable) rather than freed memory.
    keepalive: Callable[[CUDAGraphMode], torch.Tensor]


class CudaGraphManager:
    """Captures one graph per descriptor in one memory pool, and replays them."""

    def __init__(self, backend: GraphBackend, dispatcher: CudagraphDispatcher) -> None:
        self.backend = backend
        self.dispatcher = dispatcher
        self.graphs: dict[BatchExecutionDescriptor, CapturedEntry] = {}

    def capture(self, create_forward_fn: ForwardFnFactory,
                progress: Callable[[BatchExecutionDescriptor], None] | None = None) -> None:
        for desc in self.dispatcher.capture_descriptors():  # PIECEWISE first, then FULL; largest first
            with self.backend.warmup_context():
                create_forward_fn(desc, warmup=True)(CUDAGraphMode.NONE)
            forward_fn = create_forward_fn(desc, warmup=False)  # fresh metadata, not the warmup's
            graph, output = self.backend.capture(lambda: forward_fn(desc.cg_mode),
                                                 breakable=desc.cg_mode is CUDAGraphMode.PIECEWISE)
            self.graphs[desc] = CapturedEntry(graph, output, forward_fn)
            if progress is not None:
                progress(desc)

    def replay(self, desc: BatchExecutionDescriptor) -> torch.Tensor:
        """Replay ``desc``'s graph; its inputs must already be in the persistent buffers."""
        entry = self.graphs[desc]
        entry.graph.replay()
        return entry.output

    @property
    def captured_sizes(self) -> dict[CUDAGraphMode, list[int]]:
        sizes: dict[CUDAGraphMode, list[int]] = {}
        for desc in self.graphs:
            sizes.setdefault(desc.cg_mode, []).append(desc.num_tokens)
        return {mode: sorted(s) for mode, s in sizes.items()}

    def reset(self) -> None:
        for entry in self.graphs.values():
            entry.graph.reset()
        self.graphs.clear()
