"""Shared fixtures. Tests run on the CPU simulator here; the `cuda` parametrisations run on a GPU."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
import trace_store

from cglab import cli
from cglab.bench import run as bench_run
from cglab.compilation import caching
from cglab.config import ToyConfig

# The toy's matrices are tiny: extra intra-op threads only spin, and on a busy CI machine (2 cores,
# parallel CLI subprocesses) they made steps 30x slower.
torch.set_num_threads(1)
# The tests read stderr exactly: a run that a busy machine slows must not add progress lines to it
# (test_capacity.py turns them on where it tests them).
cli.LOG_EVERY_S = None
bench_run.LOG_BAR["delay"] = float("inf")  # no progress lines in what the tests compare
# Dozens of identical engines per session: they share one dynamo trace (a test-speed device), and under
# `make test` with the run's other processes (trace_store.py).
caching.install()
trace_store.install()

BACKEND_PARAMS = [
    pytest.param("cpu", id="sim"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)"),
    ),
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Browser tests run only when asked for (``-m e2e``, as ``make test-e2e`` does): they start
    JupyterLab and Chromium, and ``make test`` runs them in a step of their own."""
    if "e2e" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="browser test: run it with `make test-e2e` (pytest -m e2e)")
    for item in items:
        if item.get_closest_marker("e2e"):
            item.add_marker(skip)


@pytest.fixture(params=BACKEND_PARAMS)
def device(request: pytest.FixtureRequest) -> str:
    """Run the test on the simulator (device cpu) and, where a GPU exists, on real CUDA graphs."""
    return request.param


@pytest.fixture
def small_config() -> ToyConfig:
    return ToyConfig(layers=("sconv", "attn", "compressor", "attn"), max_num_reqs=8, max_model_len=48)


@pytest.fixture
def replays(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Steps served by graph replays while the test runs, by mode ("full", "piecewise"): counted where
    graphs really replay (``CudaGraphManager.run_fullgraph``; a ``CUDAGraphWrapper``'s replay, once
    per forward pass however many pieces it has), so a run whose steps all went eager, or a descriptor
    that claims a graph the step never replayed, shows up as a missing count."""
    from cglab.compilation import CUDAGraphWrapper
    from cglab.cudagraph_utils import CudaGraphManager
    from cglab.forward_context import get_forward_context

    counts: Counter[str] = Counter()
    run_fullgraph, replay_piece = CudaGraphManager.run_fullgraph, CUDAGraphWrapper._replay
    passes: list[Any] = []  # the forward contexts that replayed a piece (kept, so no id is reused)

    def counting_run_fullgraph(self: CudaGraphManager, desc: Any) -> Any:
        out = run_fullgraph(self, desc)
        counts[desc.cg_mode.value] += 1
        return out

    def counting_replay_piece(self: CUDAGraphWrapper, entry: Any) -> None:
        replay_piece(self, entry)
        context = get_forward_context()
        if not any(context is seen for seen in passes):
            passes.append(context)
            counts[context.cg_mode.value] += 1

    monkeypatch.setattr(CudaGraphManager, "run_fullgraph", counting_run_fullgraph)
    monkeypatch.setattr(CUDAGraphWrapper, "_replay", counting_replay_piece)
    return counts


@pytest.fixture
def json_replace_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Saving a bench result fails when it moves OUT.json into place ("disk full"), after OUT.csv."""
    from cglab.bench import files as results

    real_replace = results.os.replace

    def failing_replace(src: str, dst: str) -> None:
        if str(dst).endswith(".json"):
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(results.os, "replace", failing_replace)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say in one line per reason why tests skipped, so a CPU run's GPU-only skips are explained."""
    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = (longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)).removeprefix("Skipped: ")
        if report.nodeid.split("::")[0].endswith(".ipynb"):  # nbval gives no reason of its own
            reason = "notebook cell tagged nbval-skip (the notebook says why)"
        reasons[reason] += 1
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"{count} skipped: {reason}")
