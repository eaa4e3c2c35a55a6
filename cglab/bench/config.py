"""What a benchmark run measures (``BenchConfig``); ``ToyConfig`` checks the model's sizes."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from cglab.bench.modes import MODE_NAMES, available_modes
from cglab.config import ToyConfig, check_int, check_no_empty_item
from cglab.errors import ConfigError
from cglab.kernels import check_kernels

__all__ = ["QUICK_MODEL", "BenchConfig", "ModelOptions", "choose_names", "toy_dict"]

BLOCK_SIZE = 4


def choose_names(name: str, values: object, valid: tuple[str, ...]) -> tuple[str, ...]:
    """``"a,b"`` or ``("a", "b")`` -> the chosen names of ``valid``, in ``valid``'s order."""
    names = values.split(",") if isinstance(values, str) else values
    if not isinstance(names, (list, tuple)) or not all(isinstance(v, str) for v in names):
        raise ConfigError(f"{name} must be names from {', '.join(valid)}, got {values!r}")
    stripped = [v.strip().lower() for v in names]
    check_no_empty_item(name, values, stripped)
    if not stripped or not set(stripped) <= set(valid):
        raise ConfigError(f"{name} must be some of {', '.join(valid)}, got {values!r}")
    return tuple(v for v in valid if v in stripped)


def toy_dict(toy: ToyConfig) -> dict[str, Any]:
    """The engine's config as the JSON sidecar records it."""
    return {f.name: getattr(toy, f.name) for f in fields(toy) if f.init}


@dataclass(frozen=True)
class ModelOptions:
    """The toy model both benchmarks start (by default the GPU-sized one: 8 layers, hidden 1024, bf16)."""

    layers: str = "sconv,attn,compressor,attn,sconv,attn,compressor,attn"
    hidden_size: int = 1024
    num_heads: int = 8
    dtype: str = "bfloat16"
    max_model_len: int = 128
    device: str = "cpu"
    seed: int = 0
    quick: bool = False  # built by quick_preset(): a CPU run that ends in seconds

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", ",".join(self.toy_config().layers))  # the model's own checks

    def _toy(self, requests: int, blocks: int, tokens: int) -> ToyConfig:
        model = {name: getattr(self, name) for name in ("layers", "hidden_size", "num_heads", "dtype", "seed")}
        return ToyConfig(
            **model,
            max_model_len=self.max_model_len,
            block_size=BLOCK_SIZE,
            num_blocks=blocks,
            max_num_reqs=requests,
            max_num_batched_tokens=tokens,
        )

    def toy_config(self) -> ToyConfig:  # each benchmark sizes the caches for its run
        raise NotImplementedError


# The small model of the quick presets (CPU runs of seconds).
QUICK_MODEL = dict(layers="sconv,attn,compressor,attn", hidden_size=32, num_heads=2, dtype="float32", max_model_len=32)


@dataclass(frozen=True)
class BenchConfig(ModelOptions):
    """What to measure, by default every row kind the device can (``modes=None``). ``max_model_len`` is small
    because the aten attention of FULL reads that many keys (a toy artefact). Capture sizes equal the
    batch sizes: no padding is timed."""

    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    modes: tuple[str, ...] | None = None
    repeats: int = 300  # timed steps per mode and batch size
    warmup: int = 20  # untimed steps first (lazy init, clocks, caches)
    kernels: str | None = None  # the custom ops' kernels, "aten" or "triton"; None: triton on CUDA, aten on the CPU
    prompt_len: int = 32  # history of every request before the timed decode step
    profile_steps: int = 3  # profiled steps per mode and batch size (kernel floor, launches)
    fused_linear: bool = False  # every linear as one launch of cglab::fused_linear (cglab/kernels/fused_linear.py)

    def __post_init__(self) -> None:
        sizes = self.batch_sizes
        if not isinstance(sizes, (list, tuple)) or not sizes:
            raise ConfigError(f"batch_sizes must be a non-empty list of positive integers, got {sizes!r}")
        for name, value, low in (
            *(("every batch size", b, 1) for b in sizes),
            ("repeats", self.repeats, 5),  # deciles need samples
            ("warmup", self.warmup, 0),
            ("profile_steps", self.profile_steps, 1),
            ("prompt_len", self.prompt_len, 1),
        ):
            check_int(name, value, low)
        check_int("max_model_len (the timed step adds a token to prompt_len)", self.max_model_len, self.prompt_len + 1)
        device_type = str(self.device).split(":")[0]
        object.__setattr__(self, "batch_sizes", tuple(sorted(set(sizes))))
        modes = choose_names("modes", self.modes or available_modes(device_type), MODE_NAMES)
        if not set(modes) <= set(available_modes(device_type)):
            raise ConfigError("mode reduce_overhead needs a CUDA GPU (torch's graph trees): drop it or use device cuda")
        object.__setattr__(self, "modes", modes)
        object.__setattr__(self, "kernels", check_kernels(self.kernels, device_type))
        super().__post_init__()

    @classmethod
    def quick_preset(cls, **overrides: Any) -> BenchConfig:
        """The small CPU run (well under a minute): 4 layers, hidden 32, fp32, batch 1-8, 20 repeats."""
        quick = dict(QUICK_MODEL, batch_sizes=(1, 2, 4, 8), repeats=20, warmup=3, prompt_len=8, profile_steps=2)
        return cls(**{**quick, "quick": True, **overrides})

    @classmethod
    def live_preset(cls, device: str) -> BenchConfig:
        """Notebook 05's live run, under half a minute: on a GPU three rungs at batch 1, 16 and 128, on a
        CPU the quick preset at batch 1 and 8."""
        if str(device).split(":")[0] == "cuda":
            plain = ("none", "piecewise", "full")
            return cls(device=device, batch_sizes=(1, 16, 128), modes=plain, repeats=50, warmup=5, profile_steps=1)
        return cls.quick_preset(device=device, batch_sizes=(1, 8), repeats=5, profile_steps=1)

    def toy_config(self) -> ToyConfig:
        """The engine's config: one request per batch row, caches just large enough for the run."""
        pool = max(self.batch_sizes)
        return self._toy(pool, pool * -(-(self.prompt_len + 1) // BLOCK_SIZE), max(pool, self.prompt_len))
