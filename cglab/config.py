"""Configuration: the toy model's shape and the CUDA graph modes (vLLM: ``vllm/config/compilation.py``)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from cglab.errors import ConfigError
from cglab.layer_registry import layer_kinds


class CUDAGraphMode(enum.Enum):
    """How a forward pass runs. ``NONE``, ``PIECEWISE`` and ``FULL`` are *runtime* modes (what a step does);
    ``FULL_DECODE_ONLY`` and ``FULL_AND_PIECEWISE`` (vLLM's default) are *policies*: uniform decode batches
    get ``decode_mode()``, the others ``mixed_mode()``."""

    NONE = "none"
    PIECEWISE = "piecewise"
    FULL = "full"
    FULL_DECODE_ONLY = "full_decode_only"
    FULL_AND_PIECEWISE = "full_and_piecewise"

    def decode_mode(self) -> CUDAGraphMode:
        """Runtime mode for a uniform decode batch (one token per request)."""
        if self in (CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE):
            return CUDAGraphMode.FULL
        return self

    def mixed_mode(self) -> CUDAGraphMode:
        """Runtime mode for any other batch."""
        return {
            CUDAGraphMode.FULL_DECODE_ONLY: CUDAGraphMode.NONE,
            CUDAGraphMode.FULL_AND_PIECEWISE: CUDAGraphMode.PIECEWISE,
        }.get(self, self)

    def runtime_modes(self) -> tuple[CUDAGraphMode, ...]:
        """The runtime modes this policy captures graphs for, PIECEWISE first."""
        modes = {self.mixed_mode(), self.decode_mode()} - {CUDAGraphMode.NONE}
        return tuple(m for m in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL) if m in modes)

    @classmethod
    def parse(cls, value: str | CUDAGraphMode) -> CUDAGraphMode:
        """``"piecewise"`` -> ``CUDAGraphMode.PIECEWISE``, with an error that lists the valid names."""
        if isinstance(value, CUDAGraphMode):
            return value
        valid = ", ".join(m.value for m in cls)
        if not isinstance(value, str):  # str(None) is "none": a missing value must not pick a mode
            raise ConfigError(
                f"the CUDA graph mode must be a name such as 'piecewise', got {value!r}; choose one of: {valid}"
            )
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise ConfigError(f"unknown CUDA graph mode {value!r}; choose one of: {valid}") from None


def check_int(name: str, value: object, low: int = 1, high: int | None = None) -> int:
    """``value`` if it is an int (``True`` is not a size) from ``low`` to ``high``, else a ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        wanted = "a positive integer" if low == 1 and high is None else f"an integer of at least {low}"
        wanted = wanted if high is None else f"an integer from {low} to {high}"
        raise ConfigError(f"{name} must be {wanted}, got {value!r}")
    return value


def check_no_empty_item(what: str, given: object, items: Sequence[str]) -> None:
    """Refuse ``"a,,b"``: an empty item is a typo (a name or a number left out), not a separator."""
    if not all(items):
        raise ConfigError(f"{what} {given!r} has an empty item (two commas in a row, or one at an end); remove it")


def parse_names(
    value: object, valid: Sequence[str], *, what: str, item: str, example: str, if_empty: str, lower: bool = False
) -> tuple[str, ...]:
    """``"a,b"`` or ``["a", "b"]`` as names from ``valid``, at least one; ``what``, ``item``: for errors."""
    parts = value.split(",") if isinstance(value, str) else value
    if not isinstance(parts, (list, tuple)) or not all(isinstance(p, str) for p in parts):
        raise ConfigError(f"{what} must be {example}, got {value!r}")
    names = tuple(p.strip().lower() if lower else p.strip() for p in parts)
    if not any(names):
        raise ConfigError(f"{what} is empty; {if_empty}")
    check_no_empty_item(what, value, names)
    unknown = [n for n in dict.fromkeys(names) if n not in valid]
    if unknown:
        raise ConfigError(
            f"unknown {item}(s) {', '.join(map(repr, unknown))}; valid {item.split()[-1]}s: {', '.join(valid)}"
        )
    return names


def parse_layer_pattern(pattern: object) -> tuple[str, ...]:
    """``"sconv,attn"`` -> ``("sconv", "attn")``: kinds registered in ``cglab.layer_registry``."""
    return parse_names(
        pattern,
        layer_kinds(),
        what="the layer pattern",
        item="layer kind",
        example="a string such as 'sconv,attn' or a list of kinds",
        if_empty=f"give comma-separated kinds such as 'sconv,attn' (valid kinds: {', '.join(layer_kinds())})",
        lower=True,
    )


PIECEWISE_FLAVORS = ("compiled", "breakable")
DTYPES = ("float32", "bfloat16", "float16")
# The devices a runner takes: "cuda" captures real CUDA graphs, "cpu" runs the simulator.
DEVICES = ("cpu", "cuda")


def parse_piecewise_flavor(value: object) -> str:
    """``"compiled"`` (torch.compile split at ``splitting_ops``, vLLM's default) or ``"breakable"``."""
    if isinstance(value, str) and value.strip().lower() in PIECEWISE_FLAVORS:
        return value.strip().lower()
    raise ConfigError(
        f"unknown PIECEWISE flavor {value!r}; choose 'compiled' (torch.compile, split at "
        "splitting_ops) or 'breakable' (one capture, split at the eager breaks)"
    )


def default_capture_sizes(max_size: int) -> tuple[int, ...]:
    """vLLM's default ladder (1, 2, 4, then steps of 8 to 256, then steps of 16), cut at ``max_size``."""
    sizes = [1, 2, 4, *range(8, 257, 8), *range(272, 1025, 16)]
    return tuple(s for s in sizes if s <= max_size)


def dummy_query_lens(num_reqs: int, num_tokens: int, pre_49751: bool = False) -> list[int]:
    """The query lengths of a dummy capture batch: an even split, the remainder one token each on the last
    requests (vLLM PR #49751); ``pre_49751``: all of the remainder on the last request, as before it."""
    base, extra = divmod(num_tokens, num_reqs)
    if pre_49751:
        return [base] * (num_reqs - 1) + [base + extra]
    return [base] * (num_reqs - extra) + [base + 1] * extra


def dummy_longest_request(num_tokens: int, max_num_reqs: int) -> int:
    """Tokens in the longest request of the dummy batch a graph of ``num_tokens`` is captured on."""
    return max(dummy_query_lens(min(num_tokens, max_num_reqs), num_tokens))


@dataclass(frozen=True)
class ToyConfig:
    """Everything that shapes the toy engine. Small defaults so the CPU simulator runs in seconds."""

    layers: tuple[str, ...] = ("sconv", "attn", "compressor", "attn")
    hidden_size: int = 32
    num_heads: int = 2
    vocab_size: int = 64
    block_size: int = 4  # tokens per KV / state block
    num_blocks: int = 96  # blocks in every paged cache (shared block table)
    max_num_reqs: int = 8
    max_model_len: int = 48
    max_num_batched_tokens: int = 128
    sconv_kernel_size: int = 4  # taps of the short convolution, the current token included
    compress_ratio: int = 4  # the compressor emits one entry every `compress_ratio` tokens
    strict_layers: bool = False  # stateful layers without the `metadata is None` guard
    # The stateful layers' guard in plain Python in the module's forward, as Inkling and DeepSeek V4 write
    # it (InklingShortConv.forward, DeepseekCompressor.forward), not inside their custom op: under
    # torch.compile dynamo then decides it once, when it traces. (vLLM compiles neither model: both run
    # breakable graphs.)
    python_guards: bool = False
    dtype: str = "float32"
    seed: int = 0
    layer_names: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", parse_layer_pattern(self.layers))
        for f in fields(self):
            if f.type == "int" and f.name != "seed":  # every size
                check_int(f.name, getattr(self, f.name))
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        if self.block_size % self.compress_ratio:
            raise ConfigError(
                f"block_size ({self.block_size}) must be a multiple of compress_ratio ({self.compress_ratio}) "
                "so that a compressed group never straddles two blocks"
            )
        check_int("seed", self.seed, 0, 2**32 - 1)  # what numpy accepts too, so every tool can replay it
        for name in ("strict_layers", "python_guards"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.strict_layers and self.python_guards:
            raise ConfigError(
                "strict_layers drops the stateful layers' None guard and python_guards moves it into "
                "their forward: choose one"
            )
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        object.__setattr__(self, "layer_names", tuple(f"layers.{i}.{k}" for i, k in enumerate(self.layers)))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_blocks_per_req(self) -> int:
        return -(-self.max_model_len // self.block_size)

    @property
    def max_num_tokens(self) -> int:
        """Rows in every per-token persistent buffer: the largest step (no graph is larger)."""
        return max(self.max_num_batched_tokens, self.max_num_reqs)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size
