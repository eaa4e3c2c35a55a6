"""The peer: what a user would pick instead of an engine's graphs, ``torch.compile(mode="reduce-overhead")``.

Inductor compiles the model and PyTorch's CUDA graph trees record one graph per input shape. The
engine around it is the same as for every other row, in mode NONE: the engine captures nothing, torch
does. Its metadata is capture-safe, as for FULL, so the two read the same key range. The peer records
all its graphs before any engine runner is built: the graph trees clear cuBLAS's workspaces when they
record, and a graph an engine had captured before would go on using the freed workspace.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from cglab.compilation.wrapper import fresh_forward
from cglab.metadata import prepare_attn
from cglab.runner import ModelRunner, PreparedStep

__all__ = ["ReduceOverheadForward", "capture_safe", "cudagraph_skips", "record_peer"]


class ReduceOverheadForward:
    """``model`` through ``torch.compile(mode="reduce-overhead")``. Each call tells the graph trees that a
    new step begins, so the previous step's memory may be reused (the documented way for inference)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._compiled = torch.compile(fresh_forward(model), mode="reduce-overhead")

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return self._compiled(input_ids, positions)


def capture_safe(runner: ModelRunner, prepared: PreparedStep) -> PreparedStep:
    """``prepared`` with capture-safe metadata rebuilt in the same buffers: a graph of torch's freezes
    its host-side sizes as ours do, so it must see the whole key range."""
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
