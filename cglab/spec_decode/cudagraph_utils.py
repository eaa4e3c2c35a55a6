"""Capturing the drafter's graphs (vLLM: ``spec_decode/autoregressive/cudagraph_utils.py``).

Two graph sets, one ``SpeculatorCudaGraphManager`` each. **Draft prefill** (a step's first draft, over the
target's batch) has graphs in the target's mode (``uniform_token_count = K + 1`` for a verification batch)
and reuses the target's metadata, so its capture builds dummy metadata through the target's builders and
buffers. **Draft decode** (one token per request) has FULL uniform-decode graphs where the target decodes
in FULL, else none; one graph replays per step (vLLM's fallback; its default fuses the steps).

Both capture through ``create_capture_forward``, the very function the target's capture uses: FULL and
breakable captures get fresh dummy metadata for warmup and for capture (vLLM #44253), compiled PIECEWISE
one set for both. So the legacy ``skip_attn`` switch reaches the drafter as it did upstream: compiled
PIECEWISE draft prefill captured without metadata; FULL-only draft decode always had it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch

from cglab.batch import BatchExecutionDescriptor
from cglab.buffers import BlockTables, InputBuffers
from cglab.compilation_config import CompilationConfig
from cglab.cudagraph_utils import CaptureForward, CudaGraphManager, create_capture_forward
from cglab.metadata import AttentionGroup

# What a captured drafter routine is: run it for a descriptor and the requests its dummy batch holds.
DraftRoutine = Callable[[BatchExecutionDescriptor, int], torch.Tensor]


class SpeculatorCudaGraphManager(CudaGraphManager):
    """A ``CudaGraphManager`` for one drafter graph set: it captures a drafter routine instead of the
    target's forward, with dummy metadata built through the buffers and builders it is given."""

    def capture_routine(
        self,
        routine: DraftRoutine,
        buffers: InputBuffers,
        tables: BlockTables,
        attn_groups: Sequence[AttentionGroup],
        reads: Callable[[Mapping[str, Any] | None], dict[str, torch.Tensor]],
        cc: CompilationConfig,
    ) -> None:
        """Capture ``routine`` for every descriptor of the dispatcher; ``reads(metadata)``: what it reads from
        outside its graph, checked before each replay."""

        def create_forward_fn(desc: BatchExecutionDescriptor, warmup: bool) -> CaptureForward:
            return create_capture_forward(
                desc, self.dispatcher.max_num_reqs, buffers, tables, attn_groups, cc, partial(routine, desc), reads
            )

        with torch.inference_mode():
            self.capture(create_forward_fn)
