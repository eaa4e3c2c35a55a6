"""What starting an engine costs: compiling, warming up and capturing the default capture-size ladder,
and the memory the capture takes; per policy, flavor and capture path (fixed or legacy).

The fix (vLLM PR #49364) builds metadata at every capture, so under compiled PIECEWISE the stateful
ops inside the pieces really run at capture, where the legacy path recorded a no-op. FULL always built
metadata: a FULL-only policy gets one row. Every row starts cold (inductor's caches and the shared
traces off), so each compile is the one a first start pays."""

from __future__ import annotations

import contextlib
import gc
import math
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from cglab.bench.config import QUICK_MODEL, ModelOptions, choose_names, toy_dict
from cglab.bench.environment import collect_environment
from cglab.bench.files import read_pair, save_pair
from cglab.bench.modes import POLICIES, bench_compilation
from cglab.compilation import CompiledModel, caching
from cglab.config import PIECEWISE_FLAVORS, ToyConfig, check_int, default_capture_sizes
from cglab.runner import ModelRunner, resolve_device

__all__ = ["STARTUP_COLUMNS", "StartupConfig", "StartupResult", "load_startup", "measure_startup", "save_startup"]

STARTUP_COLUMNS = ("policy", "flavor", "path", "backend", "graphs", "compile_s", "capture_s", "startup_s", "memory_mib")
FORMAT = "cglab-startup/1"


@dataclass(frozen=True)
class StartupConfig(ModelOptions):
    """The engines to start: vLLM's default ladder to 256 by default (35 sizes: 1, 2, 4, then steps of 8),
    every policy and flavor."""

    max_capture_size: int = 256
    policies: tuple[str, ...] = POLICIES
    flavors: tuple[str, ...] = PIECEWISE_FLAVORS

    def __post_init__(self) -> None:
        check_int("max_capture_size", self.max_capture_size)
        object.__setattr__(self, "policies", choose_names("policies", self.policies, POLICIES))
        object.__setattr__(self, "flavors", choose_names("flavors", self.flavors, PIECEWISE_FLAVORS))
        super().__post_init__()

    @classmethod
    def quick_preset(cls, **overrides: Any) -> StartupConfig:
        """A CPU run of seconds: the small model, FULL_AND_PIECEWISE compiled, the ladder to 8."""
        quick = dict(QUICK_MODEL, max_capture_size=8, policies=("full_and_piecewise",), flavors=("compiled",))
        return cls(**{**quick, "quick": True, **overrides})

    def toy_config(self) -> ToyConfig:
        """One request per captured token at the largest size; capture writes no cache slot."""
        return self._toy(self.max_capture_size, self.max_capture_size, self.max_capture_size)

    @property
    def capture_sizes(self) -> tuple[int, ...]:
        """vLLM's default ladder up to ``max_capture_size``."""
        return default_capture_sizes(self.max_capture_size)


@dataclass
class StartupResult:
    """Rows keyed by ``STARTUP_COLUMNS``, the environment and the config."""

    rows: list[dict[str, Any]]
    environment: dict[str, Any]
    config: dict[str, Any]

    def row(self, policy: str, flavor: str, path: str = "fixed") -> dict[str, Any]:
        for r in self.rows:
            if (r["policy"], r["flavor"], r["path"]) == (policy, flavor, path):
                return r
        raise KeyError(f"no startup row for {policy}, {flavor}, {path}")

    def fix_ratio(self, policy: str, flavor: str) -> float:
        """Warmup and capture time of the fixed path over the legacy path's (1.0: the fix costs nothing)."""
        return self.row(policy, flavor, "fixed")["capture_s"] / self.row(policy, flavor, "legacy")["capture_s"]


def measure_startup(config: StartupConfig) -> StartupResult:
    """Start one engine per policy, flavor and capture path, one after the other, and time each start."""
    device = resolve_device(config.device)
    toy = config.toy_config()
    environment = collect_environment(device)
    _warm_process(toy, device)
    rows = []
    for policy in config.policies:
        paths = ("fixed",) if policy == "full" else ("fixed", "legacy")  # FULL always built metadata
        for flavor in config.flavors:
            for path in paths:
                rows.append(_start(toy, config.capture_sizes, device, policy, flavor, path))
    config_dict = {**asdict(config), "capture_sizes": list(config.capture_sizes), "toy_config": toy_dict(toy)}
    return StartupResult(rows, environment, config_dict)


def _warm_process(toy: ToyConfig, device: torch.device) -> None:
    """Pay what only the first engine of a process pays (imports of the compiler stack, the device's
    context and libraries) on a tiny model, so that it lands in no row."""
    heads = toy.num_heads
    tiny = ToyConfig(layers=("sconv", "attn"), hidden_size=heads * 4, num_heads=heads, dtype=toy.dtype, max_num_reqs=2)
    ModelRunner(tiny, bench_compilation("full_and_piecewise", (1, 2), device.type, False), device=device).close()


def _start(
    toy: ToyConfig, capture_sizes: tuple[int, ...], device: torch.device, policy: str, flavor: str, path: str
) -> dict[str, Any]:
    gc.collect()
    cc = bench_compilation(policy, capture_sizes, device.type, flavor == "breakable", legacy=path == "legacy")
    with _cold_compiles():
        start = time.perf_counter()
        runner = ModelRunner(toy, cc, device=device)
        startup = time.perf_counter() - start
    try:
        manager = runner.cudagraph_manager
        assert manager is not None and manager.capture_stats is not None
        stats = manager.capture_stats
        model = runner.forward_model
        compile_s = model.compile_seconds if isinstance(model, CompiledModel) else 0.0  # breakable: no compile
        memory = math.nan if stats.memory_bytes is None else round(stats.memory_bytes / 2**20, 1)
        values = (manager.backend.name, stats.graphs, round(compile_s, 3), round(stats.seconds, 3), round(startup, 3))
        return dict(zip(STARTUP_COLUMNS, (policy, flavor, path, *values, memory), strict=True))
    finally:
        runner.close()
        del runner
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


@contextlib.contextmanager
def _cold_compiles() -> Iterator[None]:
    import torch._inductor.config as inductor_config

    with caching.disabled(), inductor_config.patch(force_disable_caches=True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")  # it announces what we asked for
        yield


def save_startup(result: StartupResult, path: str, force: bool = False) -> tuple[Path, Path]:
    """``PATH.csv`` and ``PATH.json`` (see ``save_pair``)."""
    return save_pair(path, FORMAT, result, list(STARTUP_COLUMNS), force)


def load_startup(path: str) -> StartupResult:
    rows, sidecar = read_pair(path, STARTUP_COLUMNS, (FORMAT,), "python -m cglab startup")
    return StartupResult(rows, sidecar["environment"], sidecar["config"])
