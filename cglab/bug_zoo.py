"""The bug zoo: one correct stateful op, a sliding-window sum over a paged cache, and variants of it that each
break one rule of graph capture vLLM learned the hard way, named after the pull request that taught it. Each is
a layer kind (``cglab.layer_registry``), so ``run_capture_matrix("zoo_..., attn")`` shows where it breaks.

The correct op (``window``) stores each token's input at its slot and adds the inputs of the
``sconv_kernel_size - 1`` tokens before it. It asks for its metadata strictly: captured without metadata (the
legacy path) it fails loudly instead of recording a no-op. Every variant keeps that, but for its one flaw.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from cglab.buffers import PAD_SLOT_ID
from cglab.config import ToyConfig
from cglab.custom_ops import direct_register_custom_op
from cglab.forward_context import layer_metadata
from cglab.graphs import eager_break_during_capture
from cglab.layer_registry import get_layer_kind, register_layer_kind
from cglab.metadata import AllocatingShortConvMetadataBuilder, CommonAttentionMetadata, ShortConvMetadataBuilder


@dataclass
class WindowPlan:
    """A work plan the kernel makes on first use and keeps (vLLM #42444: FlashMLA's scheduler metadata)."""

    tap_slots: torch.Tensor | None = None


@dataclass
class WindowMetadata:
    slot_mapping: torch.Tensor  # [num_tokens]: where each token's input is stored; PAD_SLOT_ID on padding
    tap_slots: torch.Tensor  # [num_tokens, window - 1]: slots of the inputs before it (PAD_SLOT_ID: none)
    query_start_loc: torch.Tensor  # [num_reqs + 1]
    block_table: torch.Tensor  # [num_reqs, blocks]
    max_query_len: int  # a host int: the longest query of this step
    block_size: int
    plan: WindowPlan  # empty at every build


class WindowMetadataBuilder(ShortConvMetadataBuilder):
    """The short conv's tap slots, and what the variants read besides; into buffers allocated once."""

    def build(self, common: CommonAttentionMetadata, for_capture: bool = False) -> WindowMetadata:
        taps = super().build(common, for_capture)
        return WindowMetadata(
            taps.slot_mapping,
            taps.tap_slots,
            common.query_start_loc,
            common.block_table_tensor,
            common.max_query_len,
            self.block_size,
            WindowPlan(),
        )


class FreshTensorWindowBuilder(WindowMetadataBuilder, AllocatingShortConvMetadataBuilder):
    """The flaw of ``zoo_fresh_tensor``: ``build()`` returns new tensors, so a graph keeps the capture's."""


def _window(x: torch.Tensor, output: torch.Tensor, cache: torch.Tensor, tap_slots: torch.Tensor) -> None:
    """The sum: each token's input (already stored) plus the stored inputs at ``tap_slots``."""
    taps = torch.where(tap_slots[..., None] >= 0, cache[tap_slots], 0)
    output.copy_(x + taps.sum(1))


def _window_sum(x: torch.Tensor, output: torch.Tensor, cache: torch.Tensor, layer_name: str) -> None:
    """Correct: metadata asked for strictly, writes at ``slot_mapping`` (padding lands in the spare row)."""
    md: WindowMetadata = layer_metadata(layer_name, True)
    cache[md.slot_mapping] = x
    _window(x, output, cache, md.tap_slots)


def _silent_guard(x: torch.Tensor, output: torch.Tensor, cache: torch.Tensor, layer_name: str) -> None:
    """#49364: no metadata, return the input (a profiling-run guard): captured so, it replays that forever."""
    md: WindowMetadata | None = layer_metadata(layer_name, False)
    if md is None:
        output.copy_(x)
        return
    cache[md.slot_mapping] = x
    _window(x, output, cache, md.tap_slots)


def _python_int(x: torch.Tensor, output: torch.Tensor, cache: torch.Tensor, layer_name: str) -> None:
    """#48892: stores each request's tokens in a loop of ``max_query_len`` offsets, a Python int that a
    graph freezes at its capture batch's value."""
    md: WindowMetadata = layer_metadata(layer_name, True)
    starts = md.query_start_loc[:-1]
    lengths = md.query_start_loc[1:] - starts
    for j in range(md.max_query_len):
        row = (starts + j).clamp(max=x.shape[0] - 1)
        cache[torch.where(j < lengths, md.slot_mapping[row], PAD_SLOT_ID)] = x[row]
    _window(x, output, cache, md.tap_slots)


def _pad_slot(x: torch.Tensor, output: torch.Tensor, cache: torch.Tensor, layer_name: str) -> None:
    """Padded token rows written: ``clamp(min=0)`` sends every PAD_SLOT_ID row to slot 0, a real token's."""
    md: WindowMetadata = layer_metadata(layer_name, True)
    cache[md.slot_mapping.clamp(min=0)] = x
    _window(x, output, cache, md.tap_slots)


def _lazy_plan(x: torch.Tensor, output: torch.Tensor, cache: torch.Tensor, layer_name: str) -> None:
    """#42444: the tap slots are planned at first use and kept; a capture that finds the plan made (by the
    warmup, on the same metadata) records no planning, and replays the warmup's plan."""
    md: WindowMetadata = layer_metadata(layer_name, True)
    if md.plan.tap_slots is None:
        md.plan.tap_slots = md.tap_slots.clone()
    cache[md.slot_mapping] = x
    _window(x, output, cache, md.plan.tap_slots)


@eager_break_during_capture
def _real_batch(x: torch.Tensor, output: torch.Tensor, cache: torch.Tensor, layer_name: str) -> None:
    """#49302: an eager-break op that also adds each request's last input into the slot of its first token,
    taking every request as real: a padded request (FULL pads them) has no token, and adds its neighbour's."""
    md: WindowMetadata | None = layer_metadata(layer_name, False)
    if md is None:  # a profiling run (and the legacy capture, where it runs eagerly at replay): no batch
        output.copy_(x)
        return
    cache[md.slot_mapping] = x
    _window(x, output, cache, md.tap_slots)
    last = (md.query_start_loc[1:] - 1).clamp(min=0)
    stored = md.slot_mapping[last] >= 0  # the flaw: also `& (query lengths > 0)`
    first = torch.where(stored, md.block_table[:, 0] * md.block_size, cache.shape[0] - 1)
    cache.index_add_(0, first, x[last])


class WindowSum(nn.Module):
    """A block around one zoo op, ``hidden + op(proj(hidden))``; its cache holds a row per slot and a spare
    last row that padding writes land in."""

    op = staticmethod(_window_sum)  # each kind's class sets its own custom op

    def __init__(self, config: ToyConfig, layer_name: str) -> None:
        super().__init__()
        self.layer_name = layer_name
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.register_buffer("cache", torch.zeros(config.num_slots + 1, config.hidden_size), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.proj(hidden)
        out = torch.empty_like(x)
        self.op(x, out, self.cache, self.layer_name)
        return hidden + out

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"cache": self.cache[:-1]}


# kind -> the rule its op breaks, in one line (the correct op: None)
ZOO: dict[str, str | None] = {}


def _register(
    kind: str, impl: object, rule: str | None, builder: type = WindowMetadataBuilder, **options: bool
) -> None:
    op = direct_register_custom_op(kind, impl, mutates_args=("output", "cache"))
    name = "".join(part.title() for part in kind.split("_"))
    layer = type(name, (WindowSum,), {"op": staticmethod(op), "__doc__": rule or WindowSum.__doc__})
    register_layer_kind(kind, layer, builder, f"cglab::{kind}", **options)
    ZOO[kind] = rule


_register("window", _window_sum, None)
_register("guard_49364", _silent_guard, "metadata None at capture returns the input: the graph replays a no-op")
_register("python_int_48892", _python_int, "a per-step value read as a Python int: frozen at its capture value")
_register(
    "fresh_tensor",
    _window_sum,
    "build() returns new tensors: the graph reads the capture's storage (stale address)",
    FreshTensorWindowBuilder,
)
_register(
    "real_batch_49302",
    _real_batch,
    "an eager-break op that takes every request as real: a padded request writes a neighbour's cache",
    splitting=True,
)
_register("pad_slot", _pad_slot, "padded token rows (PAD_SLOT_ID) written into a real cache slot")
_register("lazy_plan_42444", _lazy_plan, "a plan made at first use: a capture that finds it made skips it")


def register_mysteries() -> dict[str, str]:
    """Four zoo ops again, as ``mystery_1`` to ``mystery_4``, for notebook 07 to diagnose by their matrix
    alone: {mystery kind: zoo kind}."""
    kinds = ("lazy_plan_42444", "pad_slot", "python_int_48892", "fresh_tensor")
    mysteries = {f"mystery_{i}": kind for i, kind in enumerate(kinds, 1)}
    for mystery, kind in mysteries.items():
        entry = get_layer_kind(kind)
        register_layer_kind(mystery, entry.layer, entry.builder, entry.op, replace=True)
    return mysteries
