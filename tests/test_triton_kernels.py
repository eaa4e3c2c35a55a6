"""The Triton kernels (cglab/kernels) against the aten bodies of the custom ops they replace, the oracle:
same outputs and cache contents for decode, prefill, chunked prefill, mixed batches, padding rows and
dummy capture batches, at fp32 and bf16, for the shapes the tests, notebooks and bench use; and the
Triton kernels never write a ``-1`` slot (not even the spare row the aten bodies write).

On a GPU they run on CUDA tensors. On the CPU they run under Triton's interpreter when triton is
importable (``TRITON_INTERPRET=1``, set here before triton is imported), and skip otherwise: triton is
no dependency of ``make test``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

CUDA = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None
if HAS_TRITON and not CUDA and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: cglab's imports import it (via dynamo)

from cglab import BlockTables, InputBatch, InputBuffers, ModelRunner, ToyConfig, prepare_attn  # noqa: E402
from cglab.errors import MetadataBuildError  # noqa: E402
from cglab.forward_context import set_forward_context  # noqa: E402
from cglab.kernels import use_kernels  # noqa: E402
from cglab.layers import compressor, linear_attention, short_conv, unified_attention  # noqa: E402
from cglab.metadata import LazyPlanAttentionMetadataBuilder, build_attn_groups  # noqa: E402

pytestmark = [
    pytest.mark.skipif(
        not HAS_TRITON,
        reason="triton is not installed: these run on a GPU machine, or on the CPU "
        "under Triton's interpreter once triton is importable",
    ),
    pytest.mark.skipif(
        HAS_TRITON and not CUDA and os.environ.get("TRITON_INTERPRET") != "1",
        reason="triton was imported before this file could set TRITON_INTERPRET=1; run it with "
        "TRITON_INTERPRET=1 in the environment",
    ),
]
LAST_ROW = lambda cache: cache[-1]  # noqa: E731  (the spare row of a [slots + 1, hidden] cache)
DEVICE = torch.device("cuda" if CUDA else "cpu")
TOLERANCE = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.bfloat16: {"atol": 4e-2, "rtol": 3e-2}}
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]

# The shapes the suite uses: ToyConfig's defaults (tests, notebooks 01-04, bench --quick), notebook
# 04's smaller model with a 3-tap conv and pairs, a head size and width that are no power of two,
# and the bench's GPU model (head size 128, 1024 channels).
LAYERS = ("sconv", "attn", "compressor", "linear_attn")  # one of each kind
CONFIGS = {
    "toy": ToyConfig(layers=LAYERS),
    "small": ToyConfig(layers=LAYERS, hidden_size=16, sconv_kernel_size=3, compress_ratio=2),
    "odd": ToyConfig(layers=LAYERS, hidden_size=10, compress_ratio=2),
    "bench": ToyConfig(layers=LAYERS, hidden_size=1024, num_heads=8, max_model_len=128, num_blocks=160),
}


@dataclass(frozen=True)
class Batch:
    """A step as the runner builds it: ``query_lens`` new tokens of requests ``seq_lens`` long, padded
    to ``tokens`` rows and ``reqs`` requests; ``dummy``: the capture batch (every slot -1)."""

    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    tokens: int
    reqs: int
    dummy: bool = False
    for_capture: bool = False


BATCHES = {
    "decode": Batch((1, 1, 1), (5, 9, 2), 3, 3),
    "decode-padded-tokens": Batch((1, 1, 1), (5, 9, 2), 8, 3),  # PIECEWISE pads tokens only
    "decode-padded-requests": Batch((1, 1, 1), (5, 9, 2), 4, 4, for_capture=True),  # FULL pads requests too
    "decode-padded-requests-live": Batch((1, 1, 1), (5, 9, 2), 4, 4),  # ordinary metadata, as replays write it
    "prefill": Batch((7,), (7,), 8, 1),
    "chunked-prefill": Batch((5,), (11,), 5, 1),  # six tokens already in the cache
    "mixed": Batch((1, 6, 1, 3), (9, 6, 14, 10), 12, 4),
    "long-decode": Batch((1, 1, 1, 1), (33, 40, 47, 12), 4, 4, for_capture=True),  # keys past one tile
    "long-chunk": Batch((1, 9), (36, 45), 11, 2),
    "dummy-capture": Batch((), (), 8, 3, dummy=True),
    "dummy-capture-safe": Batch((), (), 8, 3, dummy=True, for_capture=True),
}


def _metadata(config: ToyConfig, batch: Batch, kind: str, builders: dict | None = None) -> tuple[str, Any]:
    """The name and metadata of the layer of ``kind`` for ``batch``, through the engine's own buffers and
    builders; each request's blocks are scattered over the cache (a shuffled pool), as a real block table is."""
    buffers = InputBuffers(config.max_num_reqs, config.max_num_tokens, DEVICE)
    tables = BlockTables(
        config.max_num_reqs, config.max_blocks_per_req, config.block_size, config.max_num_tokens, DEVICE
    )
    name = config.layer_names[config.layers.index(kind)]
    groups = build_attn_groups(config, DEVICE, builders, layers=[(name, kind)])
    if batch.dummy:
        input_batch = InputBatch.make_dummy(batch.reqs, batch.tokens, buffers)
        table = tables.write_block_tables([], batch.reqs)
        mapping = tables.get_dummy_slot_mappings(batch.tokens)
    else:
        input_batch = InputBatch.prepare(
            batch.query_lens, batch.seq_lens, [1] * sum(batch.query_lens), buffers, batch.tokens, batch.reqs
        )
        pool, bs = (
            torch.randperm(config.num_blocks, generator=torch.Generator().manual_seed(7)).tolist(),
            config.block_size,
        )
        blocks = [[pool.pop() for _ in range(-(-s // bs))] for s in batch.seq_lens]
        table = tables.write_block_tables(blocks, batch.reqs)
        slots = [
            blocks[r][p // bs] * bs + p % bs
            for r, (q, s) in enumerate(zip(batch.query_lens, batch.seq_lens))
            for p in range(s - q, s)
        ]
        mapping = tables.write_slot_mappings(slots, batch.tokens)
    try:
        return name, prepare_attn(input_batch, table, mapping, groups, for_capture=batch.for_capture)[name]
    except MetadataBuildError:  # as the engine, which captures no such graph
        pytest.skip(f"{kind} builds no capture metadata for this batch (its cudagraph_support)")


def _cache(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """A random cache inside a larger tensor whose first row is a canary: a write at slot -1 computed as
    a pointer offset (not Python's last row) lands there."""
    return torch.randn((shape[0] + 1, *shape[1:]), generator=gen).to(dtype).to(DEVICE)[1:]


def _run_both(
    op: Callable[..., None],
    layer: str,
    md: object,
    args: list[object],
    output: int,
    caches: dict[int, Callable[..., torch.Tensor]],
) -> tuple[list[object], list[object]]:
    """Run ``op`` with the aten body and with the Triton kernel, each on its own copy of the tensors it
    writes (``output`` and ``caches``, argument indices); returns both runs' arguments. ``caches`` maps
    to each cache's spare row (``LAST_ROW``), which the Triton run must leave untouched, as the canary
    in front of the cache. Inputs are passed as given (strided views, as the layers pass them)."""
    runs = {}
    for kernels in ("aten", "triton"):
        copies = list(args)
        copies[output] = torch.full_like(args[output], float("nan"))  # every row must be written
        for i in caches:  # keep the canary row in front of each cache
            copies[i] = args[i]._base.clone()[1:]
        with use_kernels(kernels), set_forward_context({layer: md}):
            op(*copies)
        runs[kernels] = copies
    for i, spare in caches.items():
        assert torch.equal(runs["triton"][i]._base[0], args[i]._base[0]), "Triton wrote in front of the cache (slot -1)"
        assert torch.equal(spare(runs["triton"][i]), spare(args[i])), "Triton wrote the spare row (slot -1)"
    return runs["aten"], runs["triton"]


def _close(triton: torch.Tensor, aten: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(triton, aten, **TOLERANCE[aten.dtype], msg=lambda m: f"{what}: {m}")


def every_case(test: Callable[..., None]) -> Callable[..., None]:
    """``test`` parametrized over every config, batch and dtype (ids in that order)."""
    for name, values in (("config", CONFIGS), ("batch", BATCHES), ("dtype", DTYPES)):
        test = pytest.mark.parametrize(name, values)(test)
    return test


def _case(config: str, batch: str, kind: str, seed: int) -> tuple[ToyConfig, Batch, str, Any, torch.Generator]:
    """One parity case: the toy config, the batch, the layer's name and metadata, a seeded generator."""
    toy, step = CONFIGS[config], BATCHES[batch]
    return (toy, step, *_metadata(toy, step, kind), torch.Generator().manual_seed(seed))


def _randn(gen: torch.Generator, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


@every_case
def test_unified_attention_matches_aten(config: str, batch: str, dtype: torch.dtype) -> None:
    toy, step, name, md, gen = _case(config, batch, "attn", 0)
    q, k, v = _randn(gen, dtype, step.tokens, 3, toy.num_heads, toy.head_dim).unbind(1)  # strided, as the layer
    kv_cache = _cache((2, toy.num_blocks + 1, toy.block_size, toy.num_heads, toy.head_dim), dtype, gen)
    out = torch.empty_like(q)
    aten, triton = _run_both(
        unified_attention, name, md, [q, k, v, out, kv_cache, name, False], 3, {4: lambda c: c[:, -1]}
    )
    _close(triton[3], aten[3], "output")
    assert torch.equal(triton[4][:, :-1], aten[4][:, :-1]), "the KV cache differs"


def test_unified_attention_follows_a_stale_plan() -> None:
    """A lazily planned kernel reads only the key blocks its plan gives, even when seq_lens grew since."""
    toy = CONFIGS["toy"]
    builders = {"attn": LazyPlanAttentionMetadataBuilder(toy)}
    name, md = _metadata(toy, BATCHES["long-decode"], "attn", builders)
    md.plan.key_blocks = torch.tensor([2, 9, 1, 3], device=DEVICE)  # planned for shorter sequences
    gen = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(4, 3, toy.num_heads, toy.head_dim, generator=gen).to(DEVICE).unbind(1)
    kv_cache = _cache((2, toy.num_blocks + 1, toy.block_size, toy.num_heads, toy.head_dim), torch.float32, gen)
    aten, triton = _run_both(
        unified_attention, name, md, [q, k, v, torch.empty_like(q), kv_cache, name, False], 3, {4: lambda c: c[:, -1]}
    )
    _close(triton[3], aten[3], "output")


@every_case
def test_short_conv_matches_aten(config: str, batch: str, dtype: torch.dtype) -> None:
    toy, step, name, md, gen = _case(config, batch, "sconv", 2)
    x = _randn(gen, dtype, step.tokens, toy.hidden_size)
    conv_state = _cache((toy.num_slots + 1, toy.hidden_size), dtype, gen)
    weight = _randn(gen, dtype, toy.sconv_kernel_size, toy.hidden_size)
    aten, triton = _run_both(
        short_conv, name, md, [x, torch.empty_like(x), conv_state, weight, name, False], 1, {2: LAST_ROW}
    )
    _close(triton[1], aten[1], "output")
    assert torch.equal(triton[2][:-1], aten[2][:-1]), "the conv state differs"


@every_case
def test_compressor_matches_aten(config: str, batch: str, dtype: torch.dtype) -> None:
    toy, step, name, md, gen = _case(config, batch, "compressor", 3)
    kv = _randn(gen, dtype, step.tokens, toy.hidden_size)
    entries = toy.num_blocks * (toy.block_size // toy.compress_ratio)
    state_cache = _cache((toy.num_slots + 1, toy.hidden_size), dtype, gen)
    compressed_cache = _cache((entries + 1, toy.hidden_size), dtype, gen)
    pool_logits = _randn(gen, dtype, toy.compress_ratio)
    aten, triton = _run_both(
        compressor,
        name,
        md,
        [kv, torch.empty_like(kv), state_cache, compressed_cache, pool_logits, name, False],
        1,
        {2: LAST_ROW, 3: LAST_ROW},
    )
    _close(triton[1], aten[1], "output")
    assert torch.equal(triton[2][:-1], aten[2][:-1]), "the state cache differs"
    _close(triton[3][:-1], aten[3][:-1], "the compressed cache")


@every_case
def test_linear_attention_matches_aten(config: str, batch: str, dtype: torch.dtype) -> None:
    toy, step, name, md, gen = _case(config, batch, "linear_attn", 4)
    q, k, v = _randn(gen, dtype, step.tokens, 3, toy.num_heads, toy.head_dim).unbind(1)
    decay = torch.sigmoid(torch.randn(toy.num_heads, generator=gen) + 2).to(dtype).to(DEVICE)
    state_cache = _cache((toy.num_blocks + 1, toy.num_heads, toy.head_dim, toy.head_dim), dtype, gen)
    aten, triton = _run_both(
        linear_attention, name, md, [q, k, v, decay, torch.empty_like(q), state_cache, name], 4, {5: LAST_ROW}
    )
    _close(triton[4], aten[4], "output")
    _close(triton[5][:-1], aten[5][:-1], "the state cache")


# Chunked prefill beside decodes, then decode batches of changing size: ``(request, prompt length or
# None, new tokens)`` per step.
SCHEDULE = [
    {"a": (9, [1, 2, 3, 4, 5]), "b": (3, [6, 7, 8])},
    {"a": (None, [9, 10, 11, 12]), "b": (None, [13]), "c": (6, [14, 15, 16])},
    {"a": (None, [17]), "b": (None, [18]), "c": (None, [19, 20, 21])},
    {"a": (None, [22]), "c": (None, [23])},
    {"a": (None, [24]), "b": (None, [25]), "c": (None, [26])},
]


def _serve(mode: str, kernels: str) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    runner = ModelRunner(ToyConfig(layers=LAYERS), mode, device=DEVICE)
    logits = []
    with use_kernels(kernels):
        for step in SCHEDULE:
            for request, (prompt_len, _) in step.items():
                if prompt_len is not None:
                    runner.add_request(request, prompt_len)
            logits.append(runner.step({request: tokens for request, (_, tokens) in step.items()}).logits)
    runner.close()
    return logits, runner.state_tensors()


@pytest.mark.parametrize("mode", ["none", *(["full_and_piecewise", "full", "piecewise"] if CUDA else [])])
def test_the_engine_serves_the_same_tokens_with_either_kernel_set(mode: str) -> None:
    """Whole steps through the engine: Triton kernels (replayed inside graphs, on a GPU) against the
    eager aten reference, logits and every cache."""
    expected, expected_state = _serve("none", "aten")
    got, state = _serve(mode, "triton")
    for step, (a, b) in enumerate(zip(got, expected)):
        _close(a, b, f"step {step} logits")
    for name, tensor in expected_state.items():
        _close(state[name], tensor, name)
