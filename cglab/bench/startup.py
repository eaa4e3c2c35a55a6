"""What starting an engine costs: compiling the model, warming up and capturing every graph of the
default capture-size ladder, and the memory the capture takes; per policy, flavor and capture path.

The capture path is the point of the comparison: the fix (vLLM PR #49364) builds metadata at every
capture, so under compiled PIECEWISE the stateful ops inside the pieces really run and are recorded
at capture, where the legacy path recorded a no-op. ``fix_ratio`` is the fixed path's warmup and
capture time over the legacy path's. A FULL-only policy has one path (FULL always built metadata),
so it gets one row.

Every row starts cold: inductor's caches and the shared dynamo traces (``compilation/caching.py``) are
switched off while it is measured, so each compile is the one a first start pays (a warm cache
removes most of it, and nothing else).
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from cglab.bench.config import BLOCK_SIZE, check_bounds, check_memory, choose_names
from cglab.bench.environment import collect_environment
from cglab.bench.files import read_pair, save_pair
from cglab.bench.modes import POLICIES, bench_compiler
from cglab.compilation import CompiledModel, caching
from cglab.compilation_config import CompilationConfig
from cglab.config import PIECEWISE_FLAVORS, ToyConfig, default_capture_sizes, parse_layer_pattern
from cglab.runner import ModelRunner, resolve_device

__all__ = [
    "POLICIES",
    "STARTUP_COLUMNS",
    "StartupConfig",
    "StartupResult",
    "load_startup",
    "measure_startup",
    "save_startup",
]

STARTUP_COLUMNS = ("policy", "flavor", "path", "backend", "graphs", "compile_s", "capture_s", "startup_s", "memory_mib")
FORMAT = "cglab-startup/1"
_BOUNDS = {"num_heads": (1, 256), "hidden_size": (1, 8192), "max_capture_size": (1, 1024), "max_model_len": (2, 8192)}


@dataclass(frozen=True)
class StartupConfig:
    """The engines to start. Defaults: the benchmark's GPU-sized model, vLLM's default ladder to 256
    (35 sizes: 1, 2, 4, then steps of 8), every policy and flavor."""

    layers: str = "sconv,attn,compressor,attn,sconv,attn,compressor,attn"
    hidden_size: int = 1024
    num_heads: int = 8
    dtype: str = "bfloat16"
    max_capture_size: int = 256
    max_model_len: int = 128
    policies: tuple[str, ...] = POLICIES
    flavors: tuple[str, ...] = PIECEWISE_FLAVORS
    device: str = "cpu"
    seed: int = 0
    quick: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "layers", ",".join(parse_layer_pattern(self.layers)))
        check_bounds(self, _BOUNDS)
        set_(self, "policies", choose_names("policies", self.policies, POLICIES))
        set_(self, "flavors", choose_names("flavors", self.flavors, PIECEWISE_FLAVORS))
        check_memory(self.toy_config(), 1, "one runner")

    @classmethod
    def quick_preset(cls, **overrides: Any) -> StartupConfig:
        """A CPU run of seconds: the small model, FULL_AND_PIECEWISE compiled, the ladder to 8."""
        quick = dict(
            layers="sconv,attn,compressor,attn",
            hidden_size=32,
            num_heads=2,
            dtype="float32",
            max_capture_size=8,
            max_model_len=32,
            policies=("full_and_piecewise",),
            flavors=("compiled",),
        )
        return cls(**{**quick, "quick": True, **overrides})

    def toy_config(self) -> ToyConfig:
        """One request per captured token at the largest size; capture writes no cache slot."""
        size = self.max_capture_size
        return ToyConfig(
            layers=self.layers,
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            dtype=self.dtype,
            block_size=BLOCK_SIZE,
            num_blocks=size,
            max_num_reqs=size,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=size,
            seed=self.seed,
        )

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
    environment["compile_caches"] = "inductor caches off while each row is measured (every compile is cold)"
    environment["capture_memory"] = (
        "device memory in use after capture minus before (torch.cuda.mem_get_info, cached free blocks returned first)"
        if device.type == "cuda"
        else "growth of the process's resident memory (simulator: host memory)"
    )
    environment["order"] = "rows measured one after the other as listed, after one untimed warm-up start"
    _warm_process(toy, device)
    rows = []
    for policy in config.policies:
        paths = ("fixed",) if policy == "full" else ("fixed", "legacy")  # FULL always built metadata
        for flavor in config.flavors:
            for path in paths:
                rows.append(_start(toy, config.capture_sizes, device, policy, flavor, path))
    return StartupResult(
        rows,
        environment,
        {
            **asdict(config),
            "capture_sizes": list(config.capture_sizes),
            "toy_config": {f.name: getattr(toy, f.name) for f in fields(toy) if f.init},
        },
    )


def _warm_process(toy: ToyConfig, device: torch.device) -> None:
    """Pay what only the first engine of a process pays (imports of the compiler stack, the device's
    context and libraries) on a tiny model, so that it lands in no row."""
    tiny = ToyConfig(
        layers=("sconv", "attn"),
        hidden_size=toy.num_heads * 4,
        num_heads=toy.num_heads,
        dtype=toy.dtype,
        max_num_reqs=2,
    )
    cc = _compilation_config("full_and_piecewise", "compiled", "fixed", device, (1, 2))
    ModelRunner(tiny, cc, device=device).close()


def _compilation_config(
    policy: str, flavor: str, path: str, device: torch.device, capture_sizes: tuple[int, ...]
) -> CompilationConfig:
    # The address guard is a debugging aid: off, so that it costs nothing in the measured start-up.
    return CompilationConfig(
        policy,
        capture_sizes,
        use_breakable_cg=flavor == "breakable",
        legacy_skip_attn=path == "legacy",
        backend=bench_compiler(device.type),
        check_addresses=False,
    )


def _start(
    toy: ToyConfig, capture_sizes: tuple[int, ...], device: torch.device, policy: str, flavor: str, path: str
) -> dict[str, Any]:
    gc.collect()
    with _cold_compiles():
        start = time.perf_counter()
        runner = ModelRunner(toy, _compilation_config(policy, flavor, path, device, capture_sizes), device=device)
        startup = time.perf_counter() - start
    try:
        manager = runner.cudagraph_manager
        assert manager is not None and manager.capture_stats is not None
        stats = manager.capture_stats
        compiled = runner.forward_model.compile_seconds if isinstance(runner.forward_model, CompiledModel) else None
        compile_s = compiled or 0.0  # the breakable flavor compiles nothing
        memory = math.nan if stats.memory_bytes is None else round(stats.memory_bytes / 2**20, 1)
        return {
            "policy": policy,
            "flavor": flavor,
            "path": path,
            "backend": manager.backend.name,
            "graphs": stats.graphs,
            "compile_s": round(compile_s, 3),
            "capture_s": round(stats.seconds, 3),
            "startup_s": round(startup, 3),
            "memory_mib": memory,
        }
    finally:
        runner.close()
        del runner
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


@contextlib.contextmanager
def _cold_compiles() -> Iterator[None]:
    import torch._inductor.config as inductor_config

    with caching.disabled(), warnings.catch_warnings(), contextlib.ExitStack() as stack:
        if "force_disable_caches" in getattr(inductor_config, "_config", {}):  # older torch: no such switch
            stack.enter_context(inductor_config.patch(force_disable_caches=True))
            # Announces only what this context asked for.
            warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
        yield


# ----------------------------------------------------------------------------------- files
def save_startup(result: StartupResult, path: str, force: bool = False) -> tuple[Any, Any]:
    """``PATH.csv`` and ``PATH.json``, written as a pair (never over a result without ``force``)."""
    sidecar = {
        "format": FORMAT,
        "environment": result.environment,
        "config": result.config,
        "columns": list(STARTUP_COLUMNS),
    }
    return save_pair(path, result.rows, list(STARTUP_COLUMNS), sidecar, force)


def load_startup(path: str) -> StartupResult:
    """Read a pair ``save_startup`` wrote; a damaged one is refused."""

    def parse(lines: list[dict[str | None, str | None]], sidecar: dict[str, Any]) -> StartupResult:
        if not lines:
            raise ValueError("the CSV has no rows, only a header")
        rows = [_parse_row(n, line) for n, line in enumerate(lines, start=2)]
        return StartupResult(rows, dict(sidecar["environment"]), dict(sidecar["config"]))

    return read_pair(path, STARTUP_COLUMNS, (FORMAT,), "start-up results", "python -m cglab startup", parse)


def _parse_row(line: int, text: dict[str | None, str | None]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for column in STARTUP_COLUMNS:
        value = text.get(column)
        if value is None:
            raise ValueError(f"line {line}: a row has a different number of fields than the header")
        if column in ("policy", "flavor", "path", "backend"):
            row[column] = value
            continue
        number = float(value)
        if column == "memory_mib" and math.isnan(number):
            row[column] = number  # not measurable on this backend
        elif not math.isfinite(number) or (number < 0 and column != "memory_mib"):
            raise ValueError(f"line {line}: {column} must be a finite number >= 0, got {value!r}")
        else:
            row[column] = int(number) if column == "graphs" else number
    if (
        row["policy"] not in POLICIES
        or row["flavor"] not in PIECEWISE_FLAVORS
        or row["path"] not in ("fixed", "legacy")
    ):
        raise ValueError(f"line {line}: unknown policy, flavor or path {row['policy']}/{row['flavor']}/{row['path']}")
    return row
