"""What a benchmark run measures (``BenchConfig``), and its limits: cglab's own, far above any run
that ends in minutes, low enough that a typo fails at once instead of exhausting the machine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cglab.bench.modes import BENCH_MODES, MODE_NAMES, available_modes
from cglab.config import (
    ToyConfig,
    check_int,
    check_no_empty_item,
    check_sizes,
    parse_layer_pattern,
)
from cglab.errors import ConfigError
from cglab.kernels import check_kernels

__all__ = ["LIMIT_NOTE", "MAX_BATCH", "MAX_LAYERS", "MAX_MEMORY_GIB", "BenchConfig", "check_bounds", "memory_estimate"]

# Said wherever a size limit refuses a value, so nobody mistakes it for a property of their machine.
LIMIT_NOTE = "(a limit cglab sets against typos, not a hardware limit)"
MAX_LAYERS = 64
MAX_BATCH = 1024
MAX_MEMORY_GIB = 16  # the whole run, all runners; by this estimate the defaults (six modes) need about 9 GiB
BLOCK_SIZE = 4
_BOUNDS = {
    "num_heads": (1, 256),
    "hidden_size": (1, 8192),
    "repeats": (5, 100_000),
    "warmup": (0, 10_000),
    "profile_steps": (1, 100),
    "prompt_len": (1, 8192),
    "max_model_len": (2, 8192),
}


def check_bounds(owner: object, bounds: dict[str, tuple[int, int]]) -> None:
    """Every named field of ``owner`` an integer within its bounds, else one ConfigError naming it."""
    for name, (low, high) in bounds.items():
        check_int(name, getattr(owner, name), low, high, f" {LIMIT_NOTE}")


def memory_estimate(toy: ToyConfig, n_runners: int) -> int:
    """Rough bytes a run holds: per runner, weights, paged caches and FULL attention's key gather."""
    itemsize = 4 if toy.dtype == "float32" else 2
    h = toy.hidden_size
    per_layer = 10 * h * h + 2 * toy.num_blocks * toy.block_size * h + 2 * toy.max_num_reqs * toy.max_model_len * h
    return n_runners * len(toy.layers) * per_layer * itemsize


def check_memory(toy: ToyConfig, n_runners: int, what: str) -> None:
    """Refuse a run whose ``memory_estimate`` exceeds ``MAX_MEMORY_GIB``."""
    gib = memory_estimate(toy, n_runners) / 2**30
    if gib > MAX_MEMORY_GIB:
        raise ConfigError(
            f"this run would need about {gib:.0f} GiB ({what}, {len(toy.layers)} layers, hidden "
            f"{toy.hidden_size}, {toy.max_num_reqs} requests of up to {toy.max_model_len} tokens), "
            f"above the {MAX_MEMORY_GIB} GiB limit {LIMIT_NOTE}; use fewer layers, a smaller "
            "hidden_size, fewer modes, smaller batch sizes or max_model_len"
        )


def parse_modes(modes: object, device_type: str) -> tuple[str, ...]:
    """Row kinds in ladder order; ``None``: every one the device can measure."""
    if modes is None:
        return available_modes(device_type)
    chosen = choose_names("modes", modes, MODE_NAMES)
    gpu_only = sorted(m for m in chosen if BENCH_MODES[m].cuda_only and device_type != "cuda")
    if gpu_only:
        raise ConfigError(
            f"mode {gpu_only[0]} needs a CUDA GPU (torch.compile's CUDA graph trees run on CUDA "
            "only); drop it from the modes or use device 'cuda'"
        )
    return chosen


def choose_names(name: str, values: object, valid: tuple[str, ...]) -> tuple[str, ...]:
    """``"a,b"`` or ``("a", "b")`` -> the chosen names of ``valid``, in ``valid``'s order."""
    names = values.split(",") if isinstance(values, str) else values
    if not isinstance(names, (list, tuple)) or not all(isinstance(v, str) for v in names):
        raise ConfigError(f"{name} must be names from {', '.join(valid)}, got {values!r}")
    stripped = [v.strip().lower() for v in names]
    if any(stripped):
        check_no_empty_item(name, values, stripped)
    chosen = set(stripped) - {""}
    if not chosen or not chosen <= set(valid):
        raise ConfigError(f"{name} must be some of {', '.join(valid)}, got {sorted(chosen)}")
    return tuple(v for v in valid if v in chosen)


@dataclass(frozen=True)
class BenchConfig:
    """What to measure; the defaults are the GPU-sized model (8 layers, hidden 1024, bf16, batch 1-256).

    ``modes=None``: every row kind the device can measure. ``max_model_len`` is small on purpose: the
    toy's FULL attention reads that many keys with the aten kernels (a toy artefact; the Triton kernel
    reads the live ones), which would make the gather the story.
    Capture sizes equal the batch sizes, so no padding is timed."""

    layers: str = "sconv,attn,compressor,attn,sconv,attn,compressor,attn"
    hidden_size: int = 1024
    num_heads: int = 8
    dtype: str = "bfloat16"
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    modes: tuple[str, ...] | None = None
    repeats: int = 300  # timed steps per mode and batch size
    warmup: int = 20  # untimed steps first (lazy init, clocks, caches, compiles of the peer)
    device: str = "cpu"
    kernels: str | None = None  # the custom ops' kernels, "aten" or "triton"; None: triton on CUDA, aten on the CPU
    prompt_len: int = 32  # history of every request before the timed decode step
    max_model_len: int = 128
    profile_steps: int = 3  # profiled steps per mode and batch size (kernel floor, launches)
    seed: int = 0
    quick: bool = False  # built by quick_preset(): a CPU run that ends in seconds

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "layers", ",".join(parse_layer_pattern(self.layers)))
        sizes = check_sizes("batch size", self.batch_sizes, MAX_BATCH, note=f" {LIMIT_NOTE}")
        set_(self, "batch_sizes", tuple(sorted(set(sizes))))
        device_type = str(self.device).split(":")[0]
        set_(self, "modes", parse_modes(self.modes, device_type))
        set_(self, "kernels", check_kernels(self.kernels, device_type))
        check_bounds(self, _BOUNDS)
        if self.max_model_len <= self.prompt_len:
            raise ConfigError(
                f"max_model_len ({self.max_model_len}) must exceed prompt_len ({self.prompt_len}): "
                "the timed decode step adds one token"
            )
        check_memory(self.toy_config(), len(self.modes), f"{len(self.modes)} runners")

    @classmethod
    def quick_preset(cls, **overrides: Any) -> BenchConfig:
        """The small CPU run (well under a minute): 4 layers, hidden 32, fp32, batch 1-8, 20 repeats."""
        quick = dict(
            layers="sconv,attn,compressor,attn",
            hidden_size=32,
            num_heads=2,
            dtype="float32",
            batch_sizes=(1, 2, 4, 8),
            repeats=20,
            warmup=3,
            prompt_len=8,
            max_model_len=32,
            profile_steps=2,
        )
        return cls(**{**quick, "quick": True, **overrides})

    @classmethod
    def live_preset(cls, device: str) -> BenchConfig:
        """Notebook 05's live run, under half a minute: on a GPU the plain model's three rungs at batch
        1, 16 and 128 (13 s on an H200; compiled rows would add a cold compile each), on a CPU the
        quick preset at batch 1 and 8."""
        if str(device).split(":")[0] == "cuda":
            return cls(
                device=device,
                batch_sizes=(1, 16, 128),
                modes=("none", "piecewise", "full"),
                repeats=50,
                warmup=5,
                profile_steps=1,
            )
        return cls.quick_preset(device=device, batch_sizes=(1, 8), repeats=5, profile_steps=1)

    def toy_config(self) -> ToyConfig:
        """The engine's config: one request per batch row, caches just large enough for the run."""
        pool = max(self.batch_sizes)
        blocks_per_request = -(-(self.prompt_len + 1) // BLOCK_SIZE)
        return ToyConfig(
            layers=self.layers,
            hidden_size=self.hidden_size,
            num_heads=self.num_heads,
            dtype=self.dtype,
            block_size=BLOCK_SIZE,
            num_blocks=pool * blocks_per_request,
            max_num_reqs=pool,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=max(pool, self.prompt_len),
            seed=self.seed,
        )
