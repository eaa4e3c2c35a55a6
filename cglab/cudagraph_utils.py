"""Capturing and replaying graphs (vLLM: ``vllm/v1/worker/gpu/cudagraph_utils.py``).

``prepare_inputs_to_capture_legacy`` (before vLLM PR #49364) and ``prepare_inputs_to_capture`` (after
it) live side by side: the difference between them is the bug this suite teaches.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cglab.batch import BatchExecutionDescriptor, CudagraphDispatcher, InputBatch
from cglab.buffers import BlockTables, InputBuffers
from cglab.compilation import cudagraph_capturing_enabled
from cglab.compilation_config import CompilationConfig
from cglab.config import CUDAGraphMode
from cglab.errors import RELEASED, AddressChangedError, CaptureError
from cglab.forward_context import set_forward_context
from cglab.graphs import CapturedGraph, GraphBackend
from cglab.metadata import AttentionGroup, prepare_attn


def _prepare_dummy(
    num_reqs: int, num_tokens: int, input_buffers: InputBuffers, block_tables: BlockTables
) -> tuple[InputBatch, torch.Tensor, torch.Tensor]:
    """A dummy batch whose slot mapping is all padding: warmup and capture store nothing real."""
    batch = InputBatch.make_dummy(num_reqs, num_tokens, input_buffers)
    block_table = block_tables.get_dummy_block_tables(num_reqs)
    return batch, block_table, block_tables.get_dummy_slot_mappings(num_tokens)


# The functions below are printed in notebooks 00b, 04 and 06: their lines stay within 100 characters,
# which a notebook's output area holds beside JupyterLab's file browser (tests/test_readability.py).
def prepare_inputs_to_capture(
    num_reqs: int,
    num_tokens: int,
    input_buffers: InputBuffers,
    block_tables: BlockTables,
    attn_groups: Sequence[AttentionGroup],
    full_cudagraph: bool,
) -> tuple[dict[str, Any], torch.Tensor]:
    """Inputs and metadata for capturing one graph (the fixed version, vLLM PR #49364).

    Metadata is always built: capture-safe for FULL graphs, ordinary for PIECEWISE ones. Ops inside
    the pieces (sconv, the compressor) need it to record their work; attention at the eager breaks
    runs on this dummy batch, which may be prefill-shaped: a builder may build no capture metadata
    for it. Fragile: the pieces read this metadata's storage at every replay, so builders must
    write into persistent buffers.
    """
    batch, block_table, slots = _prepare_dummy(num_reqs, num_tokens, input_buffers, block_tables)
    attn_metadata = prepare_attn(batch, block_table, slots, attn_groups, for_capture=full_cudagraph)
    return attn_metadata, slots


def prepare_inputs_to_capture_legacy(
    num_reqs: int,
    num_tokens: int,
    input_buffers: InputBuffers,
    block_tables: BlockTables,
    attn_groups: Sequence[AttentionGroup],
    skip_attn: bool,
) -> tuple[dict[str, Any] | None, torch.Tensor]:
    """The version *before* the fix, kept to reproduce the bug.

    ``skip_attn=True`` (compiled PIECEWISE capture) builds no metadata. Attention, a splitting op,
    reads live metadata at replay; guarded ops inside the pieces see ``None`` and record a no-op.
    """
    batch, block_table, slots = _prepare_dummy(num_reqs, num_tokens, input_buffers, block_tables)
    attn_metadata = None
    if not skip_attn:
        attn_metadata = prepare_attn(batch, block_table, slots, attn_groups, for_capture=True)
    return attn_metadata, slots


def prepare_capture_metadata(
    desc: BatchExecutionDescriptor,
    num_reqs: int,
    input_buffers: InputBuffers,
    block_tables: BlockTables,
    attn_groups: Sequence[AttentionGroup],
    compilation_config: CompilationConfig,
) -> dict[str, Any] | None:
    """The metadata ``desc``'s graph is captured with: fixed, or as before PR #49364
    (``legacy_skip_attn``). The target and the drafter both call it, as that PR changed both."""
    args = (num_reqs, desc.num_tokens, input_buffers, block_tables, attn_groups)
    piecewise = desc.cg_mode is CUDAGraphMode.PIECEWISE
    if not compilation_config.legacy_skip_attn:
        full_cudagraph = desc.cg_mode is CUDAGraphMode.FULL
        return prepare_inputs_to_capture(*args, full_cudagraph=full_cudagraph)[0]
    # The old, buggy path: compiled PIECEWISE capture built no metadata.
    use_breakable_cg = compilation_config.use_breakable_cg
    skip_attn = piecewise and not use_breakable_cg
    attn_metadata, _ = prepare_inputs_to_capture_legacy(*args, skip_attn=skip_attn)
    if piecewise:  # the assert that stood in vLLM's capture code before the fix
        assert (attn_metadata is not None) == use_breakable_cg
    return attn_metadata


def graph_reads(attn_metadata: Mapping[str, Any] | None, **buffers: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every tensor a forward reads from outside its graph: ``buffers`` plus each metadata field."""
    reads = dict(buffers)
    for layer_name, metadata in (attn_metadata or {}).items():
        if isinstance(metadata, torch.Tensor):
            reads[layer_name] = metadata
        elif dataclasses.is_dataclass(metadata):
            for f in dataclasses.fields(metadata):
                value = getattr(metadata, f.name)
                if isinstance(value, torch.Tensor):
                    reads[f"{layer_name}.{f.name}"] = value
    return reads


def tensor_source(name: str, attn_groups: Sequence[AttentionGroup], state_names: Iterable[str], otherwise: str) -> str:
    """Who produced the tensor a graph reads as ``name`` (see ``graph_reads``), for error messages."""
    if name in set(state_names):
        return " (a cache of the model)"
    layer = name.rpartition(".")[0]
    for group in attn_groups:
        if layer in group.layer_names:
            return f" (returned by {type(group.builder).__name__}.build())"
    return otherwise


@dataclass
class CaptureForward:
    """A forward over one descriptor's dummy batch, ``forward(cg_mode)``, and what it reads (``graph_reads``)."""

    run: Callable[[CUDAGraphMode], torch.Tensor]
    reads: dict[str, torch.Tensor]

    def __call__(self, cg_mode: CUDAGraphMode) -> torch.Tensor:
        return self.run(cg_mode)


def create_capture_forward(
    desc: BatchExecutionDescriptor,
    max_num_reqs: int,
    input_buffers: InputBuffers,
    block_tables: BlockTables,
    attn_groups: Sequence[AttentionGroup],
    compilation_config: CompilationConfig,
    run_model: Callable[[int], torch.Tensor],
    reads: Callable[[Mapping[str, Any] | None], dict[str, torch.Tensor]],
) -> CaptureForward:
    """Prepare ``desc``'s dummy batch and metadata; the graph records ``run_model(num_reqs)`` (target or drafter)."""
    num_reqs = desc.num_reqs or min(desc.num_tokens, max_num_reqs)
    attn_metadata = prepare_capture_metadata(
        desc, num_reqs, input_buffers, block_tables, attn_groups, compilation_config
    )

    def forward(cg_mode: CUDAGraphMode) -> torch.Tensor:
        with set_forward_context(attn_metadata, cg_mode, desc):
            return run_model(num_reqs)

    return CaptureForward(forward, reads(attn_metadata))


# ``(desc, warmup)``: a forward over ``desc``'s dummy batch, made fresh for warmup and for capture, since
# warmup may change its metadata (vLLM #42444; ``LazyPlanAttentionMetadataBuilder`` in ``cglab.metadata``).
ForwardFnFactory = Callable[[BatchExecutionDescriptor, bool], CaptureForward]


# A tensor's address as a graph bakes it in: where its first element lives and how it is laid out.
_Address = tuple[int, tuple[int, ...]]


def _address(t: torch.Tensor) -> _Address:
    return t.data_ptr(), t.stride()


@dataclass
class CapturedEntry:
    graph: CapturedGraph
    output: torch.Tensor  # the static output: the graph rewrites this storage at every replay
    # Keeps the capture-time inputs alive, so a graph that still reads them reads stale values
    # (deterministic and teachable) rather than freed memory.
    keepalive: CaptureForward
    replays: int = 0  # steps this graph served (a test whose steps all ran eagerly proves nothing)


@dataclass(frozen=True)
class CaptureStats:
    """What capturing every graph cost, as vLLM logs it: wall time (warmups included) and memory (None: unknown)."""

    seconds: float
    graphs: int
    memory_bytes: int | None


class CudaGraphManager:
    """Captures a graph per descriptor, all in one memory pool, and holds the FULL ones.

    A FULL graph is the whole forward, replayed by ``run_fullgraph``. PIECEWISE graphs live in the
    model's ``CUDAGraphWrapper``s, which capture and replay under a PIECEWISE forward context.
    ``shared_warmup``: compiled PIECEWISE warms up and captures with one set of metadata, as vLLM does.
    ``check_addresses``: before each replay, every tensor a graph read must live where it did (``check_reads``).
    """

    def __init__(
        self,
        backend: GraphBackend,
        dispatcher: CudagraphDispatcher,
        check_addresses: bool = False,
        shared_warmup: bool = False,
    ) -> None:
        self.backend = backend
        self.dispatcher = dispatcher
        self.check_addresses = check_addresses
        self.shared_warmup = shared_warmup
        self.graphs: dict[BatchExecutionDescriptor, CapturedEntry] = {}  # FULL graphs only
        self.addresses: dict[BatchExecutionDescriptor, dict[str, _Address]] = {}  # what each capture read
        self._keepalive: dict[BatchExecutionDescriptor, CaptureForward] = {}
        self.capture_stats: CaptureStats | None = None
        self.released = False

    @torch.inference_mode()
    def capture(
        self, create_forward_fn: ForwardFnFactory, progress: Callable[[BatchExecutionDescriptor], None] | None = None
    ) -> None:
        self.backend.synchronize()
        memory_before = self.backend.memory_in_use()
        start = time.perf_counter()
        for desc in self.dispatcher.capture_descriptors():  # PIECEWISE first, then FULL; largest first
            try:
                forward_fn = self._capture_one(desc, create_forward_fn)
            except CaptureError as exc:  # same type, so callers can still tell the rules apart
                raise type(exc)(f"capturing the {desc} graph failed: {exc}") from exc
            self.addresses[desc] = {name: _address(t) for name, t in forward_fn.reads.items() if t.numel()}
            if progress is not None:
                progress(desc)
        self.backend.synchronize()
        memory_after = self.backend.memory_in_use()
        memory = None if memory_before is None or memory_after is None else memory_after - memory_before
        self.capture_stats = CaptureStats(time.perf_counter() - start, len(self.addresses), memory)

    def _capture_one(self, desc: BatchExecutionDescriptor, create_forward_fn: ForwardFnFactory) -> CaptureForward:
        piecewise = desc.cg_mode is CUDAGraphMode.PIECEWISE
        forward_fn = create_forward_fn(desc, not (piecewise and self.shared_warmup))
        # The warmup every graph gets (PyTorch's advice too): first uses, such as cuBLAS on the capture
        # stream, happen here rather than inside the capture. It changes no value on the simulator.
        with self.backend.warmup_context():
            forward_fn(CUDAGraphMode.NONE)
        if not (piecewise and self.shared_warmup):
            forward_fn = create_forward_fn(desc, False)  # fresh metadata, not the warmup's
        if piecewise:
            with cudagraph_capturing_enabled():
                forward_fn(CUDAGraphMode.PIECEWISE)  # the model's wrappers capture
            self._keepalive[desc] = forward_fn
        else:
            graph, output = self.backend.capture(lambda: forward_fn(CUDAGraphMode.NONE))
            self.graphs[desc] = CapturedEntry(graph, output, forward_fn)
        return forward_fn

    def check_reads(
        self,
        desc: BatchExecutionDescriptor,
        reads: Mapping[str, torch.Tensor],
        source: Callable[[str], str] = lambda name: "",
    ) -> None:
        """Before a replay of ``desc``: every tensor its capture read is still where it was; ``source(name)``
        says who produced one."""
        if desc not in self.addresses:
            raise self._not_captured(desc)
        captured = self.addresses[desc]
        replaced = [n for n, t in reads.items() if n in captured and t.numel() and _address(t) != captured[n]]
        if not replaced:
            return
        names = ", ".join(f"{name}{source(name)}" for name in replaced)
        verb = "was" if len(replaced) == 1 else "were"
        raise AddressChangedError(
            f"{names} {verb} replaced by a new tensor instead of written in place, so the {desc} graph would "
            "keep reading the storage it saw at capture (stale values, no error on a GPU). Write new values "
            "into the existing tensor (`buffer[:n].copy_(values)`); a metadata builder must fill a buffer it "
            "allocated once and return a view of it, as ShortConvMetadataBuilder does"
        )

    def run_fullgraph(self, desc: BatchExecutionDescriptor) -> torch.Tensor:
        """Replay ``desc``'s FULL graph; its inputs must already be in the persistent buffers."""
        entry = self.graphs.get(desc)
        if entry is None:
            raise self._not_captured(desc)
        entry.graph.replay()
        entry.replays += 1
        return entry.output

    def _not_captured(self, desc: BatchExecutionDescriptor) -> CaptureError:
        if self.released:
            return CaptureError(f"cannot replay {desc}: {RELEASED}")
        captured = ", ".join(str(d) for d in self.addresses) or "none"
        return CaptureError(
            f"no graph was captured for {desc} (a shape the graph was not captured for; captured: {captured}). "
            "A graph replays only the exact shape it was captured for: get the descriptor from "
            "CudagraphDispatcher.dispatch(), which pads a batch to a captured size, or run the batch eagerly"
        )

    @property
    def captured_sizes(self) -> dict[CUDAGraphMode, list[int]]:
        sizes: dict[CUDAGraphMode, list[int]] = {}
        for desc in self.addresses:
            sizes.setdefault(desc.cg_mode, []).append(desc.num_tokens)
        return {mode: sorted(s) for mode, s in sizes.items()}

    def reset(self) -> None:
        """Release the FULL graphs; the model's wrappers hold the PIECEWISE ones."""
        for entry in self.graphs.values():
            entry.graph.reset()
        self.graphs.clear()
        self._keepalive.clear()
        self.released = True
