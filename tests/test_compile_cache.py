"""Shared dynamo traces (cglab/compilation/caching.py): an engine identical to an earlier one reuses
its trace and steps exactly as a freshly traced one; anything the trace depends on keeps two apart."""

from __future__ import annotations

import gc
import weakref
from collections import OrderedDict

import pytest
import torch
from torch import nn

import cglab.layers.sconv
from cglab import CaptureError, CUDAGraphMode, ModelRunner, ToyConfig, set_forward_context
from cglab.compilation import CglabBackend, CompiledModel, caching
from cglab.compilation_config import CompilationConfig, SpeculativeConfig
from cglab.graphs import get_backend

CONFIG = ToyConfig(layers=("sconv", "attn", "compressor", "attn"), max_num_reqs=4)
SIZES = (1, 2, 4)


@pytest.fixture(autouse=True)
def no_earlier_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no trace saved (other tests in this process may have left some)."""
    monkeypatch.setattr(caching, "_TRACES", OrderedDict())


@pytest.fixture(scope="module")
def config_trace() -> OrderedDict:
    """The saved traces after one engine of ``CONFIG``: traced once for the tests that need an earlier trace."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(caching, "_TRACES", OrderedDict())
        _runner().close()
        again = _runner()
        assert len(caching._TRACES) == 1 and again.forward_model.trace_reused
        again.close()
        return caching._TRACES


@pytest.fixture
def traced_config(config_trace: OrderedDict, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test starts with the trace of an earlier ``CONFIG`` engine saved, and no other."""
    monkeypatch.setattr(caching, "_TRACES", OrderedDict(config_trace))


def _runner(config: ToyConfig = CONFIG, device: str = "cpu", mode: str = "full_and_piecewise") -> ModelRunner:
    # The eager compile backend on CUDA too: inductor's pieces are compiled inside dynamo, never shared.
    return ModelRunner(config, CompilationConfig(mode, SIZES, backend="eager"), device=device)


def _dynamo_traces() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _decode(runner: ModelRunner) -> list[tuple[str, torch.Tensor]]:
    """An eager prefill of three requests, then six steps that take every kind of graph."""
    for i in range(3):
        runner.add_request(f"r{i}")
        runner.step({f"r{i}": [1 + i, 2, 3, 4, 5]}, eager=True)
    schedules = [
        {"r0": [7]},
        {"r0": [8], "r1": [9]},
        {"r0": [10], "r1": [11, 12]},
        {"r0": [13], "r1": [14], "r2": [15]},
        {"r0": [16, 17]},
        {"r2": [18]},
    ]
    return [(str(step.descriptor), step.logits) for step in map(runner.step, schedules)]


def test_an_identical_engine_reuses_the_trace_and_steps_as_a_freshly_traced_one(device: str) -> None:
    before = _dynamo_traces()
    first = _runner(device=device)
    assert _dynamo_traces() == before + 1 and not first.forward_model.trace_reused
    second = _runner(device=device)
    assert _dynamo_traces() == before + 1 and second.forward_model.trace_reused  # no dynamo run
    with caching.disabled():
        fresh = _runner(device=device)
    assert _dynamo_traces() == before + 2 and not fresh.forward_model.trace_reused
    # Its own split graph, wrappers and graphs: only the trace is shared.
    assert second.compiled_backend.split_gm is not first.compiled_backend.split_gm
    assert not {id(w) for w in second.piecewise_wrappers()} & {id(w) for w in first.piecewise_wrappers()}
    assert second.forward_model.traced_num_tokens == fresh.forward_model.traced_num_tokens == CONFIG.max_num_tokens

    reused, traced = _decode(second), _decode(fresh)
    assert [d for d, _ in reused] == [d for d, _ in traced]
    assert {d.split("(")[0] for d, _ in reused} == {"FULL", "PIECEWISE"}
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(reused, traced))
    assert second.graph_replays() == fresh.graph_replays() and sum(second.graph_replays().values()) == 6
    assert first.graph_replays() == dict.fromkeys(first.graph_replays(), 0)  # the first engine stepped nothing
    for runner in (first, second, fresh):
        runner.close()


@pytest.mark.parametrize(
    "variant",
    [
        ToyConfig(layers=CONFIG.layers, max_num_reqs=4, python_guards=True),  # decided in forward, at the trace
        ToyConfig(layers=CONFIG.layers, max_num_reqs=4, strict_layers=True),
        ToyConfig(layers=("sconv", "attn"), max_num_reqs=4),
        ToyConfig(layers=CONFIG.layers, max_num_reqs=4, hidden_size=16),
        ToyConfig(layers=CONFIG.layers, max_num_reqs=8),  # another max_num_tokens: other buffer shapes
    ],
    ids=["python-guards", "strict", "layers", "hidden-size", "max-num-reqs"],
)
def test_what_the_trace_depends_on_keeps_engines_apart(variant: ToyConfig, traced_config: None) -> None:
    other = _runner(variant)
    again = _runner(variant)
    assert not other.forward_model.trace_reused and again.forward_model.trace_reused
    other.close()
    again.close()


def test_a_patched_forward_is_traced_again(monkeypatch: pytest.MonkeyPatch, traced_config: None) -> None:
    forward = cglab.layers.sconv.ShortConv.forward
    monkeypatch.setattr(cglab.layers.sconv.ShortConv, "forward", lambda self, hidden: forward(self, hidden) * 2)
    patched = _runner()
    assert not patched.forward_model.trace_reused
    patched.close()


def test_a_patched_function_that_forward_calls_is_traced_again(
    monkeypatch: pytest.MonkeyPatch, traced_config: None
) -> None:
    """A learner who patches an op that a forward calls by name gets a runner that runs the patch: the
    fingerprint covers the functions forward calls, not forward alone."""
    conv = cglab.layers.sconv.short_conv
    monkeypatch.setattr(cglab.layers.sconv, "short_conv", lambda *args: conv(*args))
    patched = _runner()
    assert not patched.forward_model.trace_reused
    patched.close()


def test_the_startup_benchmark_traces_every_engine_itself(traced_config: None) -> None:
    """A start-up row times a first start: a reused trace would time a fraction of it."""
    from cglab.bench.startup import _cold_compiles

    with _cold_compiles():
        runner = _runner()
    assert not runner.forward_model.trace_reused
    runner.close()


def test_no_call_after_the_first_runs_dynamo() -> None:
    """Traced or reused, a compiled engine calls its split graph itself after its first call."""
    for runner in (_runner(), _runner()):
        assert not hasattr(runner.forward_model._compiled, "_torchdynamo_orig_callable")  # not torch.compile's
        before = _dynamo_traces()
        assert len(_decode(runner)) == 6 and _dynamo_traces() == before
        runner.close()


def test_without_the_hook_the_compiled_model_is_plain_compile_and_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a learner meets: every call goes through torch.compile's function, traced once, no guards."""
    monkeypatch.setattr(CompiledModel, "compile", caching.PLAIN_COMPILE)
    before = _dynamo_traces()
    runner, again = _runner(), _runner()
    assert hasattr(runner.forward_model._compiled, "_torchdynamo_orig_callable")
    assert not runner.forward_model.trace_reused and not again.forward_model.trace_reused
    assert _dynamo_traces() == before + 2  # one trace each, and none more for any size
    assert [d for d, _ in _decode(runner)] == [d for d, _ in _decode(_runner())] and _dynamo_traces() == before + 3
    for r in (runner, again):
        r.close()


class _ReadsAPlainTensor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.full((1,), 2.0)  # neither a parameter nor a buffer

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return (input_ids + positions) * self.scale


def test_a_forward_that_reads_other_state_is_refused_by_name() -> None:
    backend = CglabBackend(get_backend("sim", torch.device("cpu")), [], piecewise=False)
    model = CompiledModel(_ReadsAPlainTensor(), backend)
    with pytest.raises(
        CaptureError,
        match=r"reads L\['self'\]\.scale, which cglab cannot pass to it: forward "
        r"may read the model's parameters and buffers and its tensor arguments",
    ):
        with set_forward_context(None, CUDAGraphMode.NONE):
            model(torch.ones(3), torch.ones(3))


def test_an_engine_let_go_is_freed_with_its_model() -> None:
    """Dynamo keeps every backend it was given for the life of the process: what it keeps must not
    hold the model (its caches; on a GPU, memory that a notebook building dozens of engines would lose)."""
    for _ in range(2):  # traced, then reused
        runner = _runner()
        model = weakref.ref(runner.model)
        runner.close()
        del runner
        gc.collect()
        assert model() is None


def test_a_trace_made_without_metadata_is_not_reused_with_it() -> None:
    """Guards in plain Python decide at the trace: the drafter of a legacy run is first traced at its capture,
    without metadata, and keeps the early return. A fixed drafter built next, whose capture has metadata,
    must trace again; reusing that trace, its caches diverged from eager."""
    from cglab.spec_decode import draft_layer_pairs, run_spec_repro

    spec = SpeculativeConfig(2, draft_layer_pairs("sconv,attn"))
    case = {"config": ToyConfig(layers="attn,attn", python_guards=True), "steps": 3, "batch_sizes": (1, 2)}
    legacy = CompilationConfig("piecewise", (3, 6, 12, 24), legacy_skip_attn=True)
    assert run_spec_repro(legacy, spec, **case).state_diverged
    fixed = run_spec_repro(CompilationConfig("piecewise", (3, 6, 12, 24)), spec, **case)
    assert not fixed.diverged and fixed.acceptance_rate == fixed.reference_acceptance_rate
