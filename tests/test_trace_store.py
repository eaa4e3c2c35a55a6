"""tests/trace_store.py: the traces one process saved are read by the next one, which then steps exactly as a
freshly traced engine; a model that a name cannot pin down is never written; kernels install it on import."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import trace_store
from torch import nn

from cglab import BatchExecutionDescriptor, CUDAGraphMode, ModelRunner, ToyConfig
from cglab.compilation import caching
from cglab.compilation_config import CompilationConfig
from cglab.lab.anatomy import describe_pieces

CONFIG = ToyConfig(layers=("sconv", "attn"), max_num_reqs=2, seed=5)
ROOT = Path(__file__).resolve().parents[1]


def _runner() -> ModelRunner:
    return ModelRunner(CONFIG, CompilationConfig("piecewise", (1, 2), backend="eager"))


def _steps(runner: ModelRunner) -> list[torch.Tensor]:
    runner.add_request("a")
    runner.add_request("b")
    return [runner.step({"a": [3, 1], "b": [2]}).logits, runner.step({"a": [5], "b": [4]}).logits]


def test_a_trace_written_by_one_process_is_read_by_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(caching, "_TRACES", trace_store.SharedTraces(tmp_path))
    first = _runner()
    assert not first.forward_model.trace_reused and len(list(tmp_path.iterdir())) == 1
    expected = _steps(first)
    # Another process: nothing in memory, the same folder.
    monkeypatch.setattr(caching, "_TRACES", trace_store.SharedTraces(tmp_path))
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    second = _runner()
    assert second.forward_model.trace_reused, "the trace in the folder was not read"
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before, "dynamo traced again"
    for got, want in zip(_steps(second), expected, strict=True):
        assert torch.equal(got, want)
    # The pieces keep the module each op came from: the anatomy tables name them.
    piecewise = BatchExecutionDescriptor(CUDAGraphMode.PIECEWISE, 2)
    assert "layers.1.mixer" in describe_pieces(first, piecewise)
    assert describe_pieces(second, piecewise) == describe_pieces(first, piecewise)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []


def test_other_sources_never_read_an_older_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(caching, "_TRACES", trace_store.SharedTraces(tmp_path))
    _runner()
    monkeypatch.setattr(caching, "_TRACES", trace_store.SharedTraces(tmp_path))
    monkeypatch.setattr(trace_store, "_sources", lambda: "an edited cglab")
    assert not _runner().forward_model.trace_reused
    assert len(list(tmp_path.iterdir())) == 2


def test_what_a_name_cannot_pin_down_stays_in_memory() -> None:
    class Local(nn.Module):
        pass

    def closure() -> object:
        return Local

    for part in (Local, closure, type("Main", (), {"__module__": "__main__"}), object()):
        with pytest.raises(trace_store._Unshareable):
            trace_store._text((1, part))
    assert (
        trace_store._text((1, "x", (nn.Linear, torch.float32)))
        == "(1,'x',(torch.nn.modules.linear.Linear,torch.float32))"
    )


def test_a_model_of_a_local_class_is_not_written(tmp_path: Path) -> None:
    class Local(nn.Module):
        pass

    traces = trace_store.SharedTraces(tmp_path)
    traces[("model", Local)] = "a trace"
    assert traces.get(("model", Local)) == "a trace" and list(tmp_path.iterdir()) == []
    assert trace_store.SharedTraces(tmp_path).get(("model", Local)) is None


def test_a_kernel_installs_it_when_cglab_is_imported_and_keeps_no_name(tmp_path: Path) -> None:
    """As IPython runs PYTHONSTARTUP: in the namespace of the notebook, tests/ on the path."""
    code = (
        "import runpy, sys; sys.path.insert(0, 'tests'); names = runpy.run_path('tests/kernel_startup.py'); "
        "assert 'torch' not in sys.modules, 'the start-up imported torch'; "
        "from cglab.compilation import caching; "
        "print(type(caching._TRACES).__name__, sorted(n for n in names if not n.startswith('__')))"
    )
    env = {**os.environ, trace_store.ENV: str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["SharedTraces", "[]"]


def test_without_the_folder_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(trace_store.ENV, raising=False)
    plain: OrderedDict = OrderedDict()
    monkeypatch.setattr(caching, "_TRACES", plain)
    trace_store.install()
    assert caching._TRACES is plain
