"""Text pictures of the toy engine: environment, requests' blocks, a prepared step, the dispatcher's picks."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import version
from importlib.util import find_spec

import matplotlib
import torch

from cglab import __version__
from cglab import batch as batching
from cglab.compilation_config import CompilationConfig
from cglab.config import CUDAGraphMode, ToyConfig
from cglab.graphs import get_backend
from cglab.runner import ModelRunner, PreparedStep

DISPATCH_POLICIES = tuple(CUDAGraphMode[n] for n in ("FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE"))


def describe_environment(device: str = "cpu") -> str:
    """Versions and the graph backend a notebook runs on, one per line."""
    resolved = CompilationConfig().resolve(ToyConfig(), torch.device(device), ())
    backend = get_backend(resolved.graph_backend, device)
    cuda = torch.version.cuda or "none (CPU build)"
    # A plain PyTorch install (a GPU box's, say) may lack ipywidgets; only the widget cells need it.
    widgets = version("ipywidgets") if find_spec("ipywidgets") else "not installed (widgets off)"
    return (
        f"cglab {__version__}, Python {platform.python_version()}, torch {torch.__version__} (CUDA {cuda})\n"
        f"matplotlib {matplotlib.__version__}, ipywidgets {widgets}\n"
        f"device: {device}; graph backend: {backend.name} = {backend.label}\n"
        f"torch.compile compiles the pieces with: {resolved.backend}"
    )


def describe_requests(runner: ModelRunner) -> str:
    """One line per request: tokens stored, the blocks it owns (its block-table row) and their slots."""
    bs = runner.config.block_size
    return "\n".join(
        f"{r.req_id}: {r.num_computed_tokens:2d} tokens in blocks "
        + ", ".join(f"{b} (slots {b * bs}-{b * bs + bs - 1})" for b in r.block_ids)
        for r in runner.requests.values()
    )


def describe_step(prepared: PreparedStep) -> str:
    """What a prepared step (``ModelRunner.prepare_step``) wrote into the persistent buffers, padding included."""
    batch, desc = prepared.input_batch, prepared.descriptor
    slot_mapping = next(iter(prepared.attn_metadata.values())).slot_mapping
    return (
        f"{desc}: {batch.num_tokens} real token(s) in {len(prepared.requests)} request(s)\n"
        f"  query_start_loc {batch.query_start_loc.tolist()}\n"
        f"  seq_lens        {batch.seq_lens.tolist()}\n"
        f"  slot_mapping    {slot_mapping.tolist()}"
    )


@dataclass(frozen=True)
class BatchShape:
    """A batch as the dispatcher sees it: per request its new tokens, whether it is prefilling and its tokens
    cached (missing entries: decoding; 0); ``rule``: which batches are uniform decode (``UNIFORM_DECODE_RULES``)."""

    label: str
    query_lens: tuple[int, ...]
    prefilling: tuple[bool, ...] = ()
    num_computed: tuple[int, ...] = ()
    rule: str = "current"

    def uniform_token_count(self, rule: str | None = None) -> int | None:
        """What the runner passes to dispatch: the tokens per request of a uniform decode batch, else None."""
        computed = (*self.num_computed, *[0] * len(self.prefilling))
        eligible = batching.decode_graph_eligible(self.query_lens, computed, self.prefilling, rule or self.rule)
        return batching.get_uniform_decode_token_count(self.query_lens, eligible)


def dispatch_cell(desc: batching.BatchExecutionDescriptor) -> str:
    """A descriptor as ``describe_dispatch`` prints it: ``FULL 4/4 u=1``, ``PIECEWISE 8``, ``eager`` (NONE)."""
    if desc.cg_mode is CUDAGraphMode.NONE:
        return "eager"
    reqs = "" if desc.num_reqs is None else f"/{desc.num_reqs}"
    uniform = "" if desc.uniform_token_count is None else f" u={desc.uniform_token_count}"
    return f"{desc.cg_mode.name} {desc.num_tokens}{reqs}{uniform}"


def describe_dispatch(
    capture_sizes: Sequence[int],
    max_num_reqs: int,
    shapes: Sequence[BatchShape],
    policies: Sequence[CUDAGraphMode] = DISPATCH_POLICIES,
) -> str:
    """A table of the graph dispatch picks (``dispatch_cell``), one row per batch shape, one column per policy."""
    dispatchers = [batching.CudagraphDispatcher(p, capture_sizes, max_num_reqs) for p in policies]
    rows = [["batch", "uniform", *(p.name for p in policies)]]
    for shape in shapes:
        uniform = shape.uniform_token_count()
        descs = [d.dispatch(len(shape.query_lens), sum(shape.query_lens), uniform) for d in dispatchers]
        rows.append([shape.label, "-" if uniform is None else str(uniform), *map(dispatch_cell, descs)])
    key = "each cell: the graph's mode, tokens/requests (PIECEWISE: any requests), u=1 if for uniform decode"
    return "\n".join([f"capture sizes {tuple(sorted(capture_sizes))}, max_num_reqs={max_num_reqs}", key, *_table(rows)])


def _table(rows: list[list[str]]) -> list[str]:
    """Rows as aligned text columns, a rule under the first (the header)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return [lines[0], "-+-".join("-" * w for w in widths), *lines[1:]]


def describe_uniform_decode_rules(capture_sizes: Sequence[int], max_num_reqs: int, shapes: Sequence[BatchShape]) -> str:
    """The graph each batch shape takes (``dispatch_cell``) under FULL_AND_PIECEWISE, one column per rule."""
    dispatcher = batching.CudagraphDispatcher(CUDAGraphMode.FULL_AND_PIECEWISE, capture_sizes, max_num_reqs)
    names = {"current": "vLLM today", "51865": "#51865 (Aug 2026)", "shape": "before #51865"}
    rows = [["batch", *(f"{name}: {rule}" for rule, name in names.items())]]
    for s in shapes:
        descs = [dispatcher.dispatch(len(s.query_lens), sum(s.query_lens), s.uniform_token_count(r)) for r in names]
        rows.append([s.label, *map(dispatch_cell, descs)])
    title = f"FULL_AND_PIECEWISE, capture sizes {tuple(sorted(capture_sizes))}, max_num_reqs={max_num_reqs}"
    return "\n".join([title, *_table(rows)])


def describe_spec_decode_sizes(
    capture_sizes: Sequence[int],
    num_speculative_tokens: int,
    max_num_reqs: int,
    policy: CUDAGraphMode = CUDAGraphMode.FULL_AND_PIECEWISE,
) -> str:
    """The target's graphs under speculative decoding as vLLM's two model runners choose them, one line each."""
    sizes, q = sorted(capture_sizes), num_speculative_tokens + 1
    # v1 (adjust_cudagraph_sizes_for_spec_decode, when the policy decodes in FULL) rounds every size up to a
    # multiple of K + 1 and keeps those up to the largest (K + 1 alone if none is left; none fits: a start-up
    # error). v2 rounds only the FULL uniform-decode graphs (uniform_decode_sizes), as cglab does.
    v1 = sizes
    if policy.decode_mode() is CUDAGraphMode.FULL:
        v1 = sorted({r for r in (-(-s // q) * q for s in sizes) if r <= sizes[-1]})
        v1 = v1 or ([q] if q <= sizes[-1] else [])
    lines = [f"capture sizes {tuple(sizes)}, K = {q - 1}, max_num_reqs = {max_num_reqs}, {policy.name}"]
    for runner, ladder in (("v1", v1), ("v2", sizes)):
        descs = batching.CudagraphDispatcher(policy, ladder, max_num_reqs, q).capture_descriptors()
        graphs = [
            f"{m.name} {', '.join(str(d.num_tokens) for d in reversed(descs) if d.cg_mode is m)}"
            for m in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)
            if any(d.cg_mode is m for d in descs)
        ]
        lines.append(f"model runner {runner}: {' | '.join(graphs) if ladder else 'start-up error, no size left'}")
    return "\n".join(lines)
