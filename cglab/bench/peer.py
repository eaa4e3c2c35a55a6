"""The peer: what a user would pick instead of an engine's graphs, ``torch.compile(mode="reduce-overhead")``.

Inductor compiles the model and PyTorch's own CUDA graph trees record one graph per input shape
and replay it. The engine around it is the same as for every other row (buffers, requests,
metadata written in place), in mode NONE: the engine captures nothing, torch does. Its metadata is
capture-safe, as for FULL, so its attention reads the same key range as FULL's and the two do the
same work.

The peer records all of its graphs before any engine runner is built: whenever the graph trees
record, they clear cuBLAS's workspaces (so that the new graph's workspace lives in their own pool),
and a graph an engine had captured before would go on using the freed workspace.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from cglab.compilation.wrapper import fresh_forward
from cglab.metadata import prepare_attn
from cglab.runner import ModelRunner, PreparedStep

__all__ = ["ReduceOverheadForward", "capture_safe", "cudagraph_skips", "record_peer"]


class ReduceOverheadForward:
    """``model`` called through ``torch.compile(mode="reduce-overhead")``; one call is one step.

    Each call first tells the graph trees that a new step begins: the previous step's outputs are
    done with, so its graph's memory may be reused (the documented way for inference loops).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self._compiled = torch.compile(fresh_forward(model), mode="reduce-overhead")

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return self._compiled(input_ids, positions)


def capture_safe(runner: ModelRunner, prepared: PreparedStep) -> PreparedStep:
    """``prepared`` with capture-safe metadata (``for_capture=True``), rebuilt in the same buffers.

    A graph of torch's freezes its host-side sizes as ours do: it must see the whole key range.
    """
    batch = prepared.input_batch
    block_table = runner.block_tables.block_table[: batch.num_reqs]
    slot_mapping = runner.block_tables.slot_mapping[: batch.num_tokens_after_padding]
    metadata = prepare_attn(batch, block_table, slot_mapping, runner.attn_groups, for_capture=True)
    return replace(prepared, attn_metadata=metadata)


def record_peer(runner: ModelRunner, prepared: PreparedStep) -> None:
    """Compile, warm up and record the peer's graph for ``prepared``'s shape (the graph trees record
    on a shape's second call and replay from its third)."""
    for _ in range(3):
        runner.execute(prepared)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)


def cudagraph_skips() -> int:
    """How often inductor has declined to use CUDA graphs in this process (a peer without graphs is no peer)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"].get("cudagraph_skips", 0))
