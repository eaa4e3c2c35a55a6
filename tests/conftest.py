"""Shared fixtures. Tests run on the CPU simulator here; the `cuda` parametrisations run on a GPU."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

from cglab.config import ToyConfig

# The toy's matrices are tiny: extra intra-op threads only spin, and on a busy CI machine (2 cores,
# parallel CLI subprocesses) they made steps 30x slower.
torch.set_num_threads(1)

BACKEND_PARAMS = [
    pytest.param("cpu", id="sim"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)")),
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
    """Graph replays served while the test runs, by mode ("full", "piecewise"): counted where the
    manager really replays (``CudaGraphManager.replay``), so a run whose steps all went eager, or a
    descriptor that claims a graph the step never replayed, shows up as a missing count."""
    from cglab.cudagraph_utils import CudaGraphManager

    counts: Counter[str] = Counter()
    original = CudaGraphManager.replay

    def counting_replay(self: CudaGraphManager, desc: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, desc, *args, **kwargs)
        counts[desc.cg_mode.value] += 1
        return out

    monkeypatch.setattr(CudaGraphManager, "replay", counting_replay)
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
