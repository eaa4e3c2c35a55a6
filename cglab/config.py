"""Configuration: the toy model's shape and the CUDA graph modes (vLLM: ``vllm/config/compilation.py``)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from cglab.errors import ConfigError

LAYER_KINDS = ("attn", "sconv", "compressor", "linear_attn")
# The kinds vLLM would call attention backends: their ops are the default splitting ops (vLLM's
# defaults list its linear-attention and Mamba ops beside attention).
ATTENTION_KINDS = ("attn", "linear_attn")
# A forward of 64 layers takes seconds on the CPU simulator (300 took minutes): plenty for a toy.
MAX_LAYERS = 64
# Said wherever a size limit refuses a value, so nobody mistakes it for a property of their machine.
LIMIT_NOTE = "(a limit cglab sets against typos, not a hardware limit)"


class CUDAGraphMode(enum.Enum):
    """How a forward pass runs.

    ``NONE``, ``PIECEWISE`` and ``FULL`` are *runtime* modes: what one step actually does.
    ``FULL_DECODE_ONLY`` and ``FULL_AND_PIECEWISE`` are *policies* (vLLM's default is the latter):
    uniform decode batches get ``decode_mode()``, mixed or prefill batches get ``mixed_mode()``.
    """

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


def check_int(name: str, value: object, low: int = 1, high: int | None = None, note: str = "") -> int:
    """``value`` if it is an int (``True`` is not a size) from ``low`` to ``high``, else a ConfigError
    naming ``name``; ``note`` goes before the value given."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        wanted = (
            "a positive integer"
            if low == 1 and high is None
            else f"an integer of at least {low}"
            if high is None
            else f"an integer from {low} to {high}"
        )
        raise ConfigError(f"{name} must be {wanted}{note}, got {value!r}")
    return value


def check_sizes(
    what: str,
    sizes: object,
    high: int | None = None,
    *,
    note: str = "",
    example: str = "[1, 2, 4]",
    allow_empty: bool = False,
    distinct: bool = False,
) -> tuple[int, ...]:
    """A list of positive ints, each at most ``high``; ``what`` is one item's name ("capture size")."""
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise ConfigError(f"give the {what}s as a list of positive integers such as {example}, got {sizes!r}")
    if not sizes and not allow_empty:
        raise ConfigError(f"give at least one {what}")
    for s in sizes:
        check_int(f"every {what}", s, 1, high, note)
    if distinct and len(set(sizes)) != len(sizes):
        raise ConfigError(f"{what}s must be distinct, got {list(sizes)}; drop the duplicates")
    return tuple(sizes)


check_positive_int = check_int  # check_int with its defaults: above zero


def check_no_empty_item(what: str, given: object, items: Sequence[str]) -> None:
    """Refuse ``"a,,b"``: an empty item is a typo (a name or a number left out), not a separator."""
    if not all(items):
        raise ConfigError(f"{what} {given!r} has an empty item (two commas in a row, or one at an end); remove it")


def parse_layer_pattern(pattern: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``"sconv,attn"`` -> ``("sconv", "attn")``; rejects empty patterns and items, unknown kinds, and
    more than ``MAX_LAYERS`` layers."""
    parts = pattern.split(",") if isinstance(pattern, str) else pattern
    if not isinstance(parts, (list, tuple)) or not all(isinstance(p, str) for p in parts):
        raise ConfigError(
            f"the layer pattern must be a string such as 'sconv,attn' or a list of kinds, got {pattern!r}"
        )
    kinds = tuple(p.strip().lower() for p in parts)
    if not any(kinds):
        raise ConfigError(
            "the layer pattern is empty; give comma-separated kinds such as 'sconv,attn,compressor,attn' "
            f"or 'linear_attn,attn' (valid kinds: {', '.join(LAYER_KINDS)})"
        )
    check_no_empty_item("the layer pattern", pattern, kinds)
    if len(kinds) > MAX_LAYERS:
        raise ConfigError(
            f"the layer pattern has {len(kinds)} layers, above the limit of {MAX_LAYERS} {LIMIT_NOTE}; "
            "use a shorter pattern"
        )
    unknown = sorted({k for k in kinds if k not in LAYER_KINDS})
    if unknown:
        raise ConfigError(
            f"unknown layer kind(s) {', '.join(map(repr, unknown))}; valid kinds: {', '.join(LAYER_KINDS)}"
        )
    return kinds


PIECEWISE_FLAVORS = ("compiled", "breakable")
DTYPES = ("float32", "bfloat16", "float16")
# The devices a runner takes: "cuda" captures real CUDA graphs, "cpu" runs the simulator.
DEVICES = ("cpu", "cuda")
# The custom op each layer kind's kernel is; the names a ``splitting_ops`` list may use.
OP_OF_KIND = {
    "attn": "cglab::unified_attention",
    "sconv": "cglab::short_conv",
    "compressor": "cglab::compressor",
    "linear_attn": "cglab::linear_attention",
}


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
    """The query lengths of a dummy capture batch (``InputBatch.make_dummy``): an even split, with the
    remainder spread one token each over the last ``num_tokens % num_reqs`` requests, so no request holds
    more than ``ceil(num_tokens / num_reqs)`` tokens (vLLM PR #49751). ``pre_49751``: the split before
    that PR, which gave the whole remainder to the last request."""
    base, extra = divmod(num_tokens, num_reqs)
    if pre_49751:
        return [base] * (num_reqs - 1) + [base + extra]
    return [base] * (num_reqs - extra) + [base + 1] * extra


def dummy_longest_request(num_tokens: int, max_num_reqs: int) -> int:
    """Tokens in the longest request of the dummy batch a graph of ``num_tokens`` is captured on, with
    as many requests as it may hold (``min(num_tokens, max_num_reqs)``)."""
    return max(dummy_query_lens(min(num_tokens, max_num_reqs), num_tokens))


# Every speculative step runs K - 1 draft decode forwards after its verification: at 16 a repro takes
# seconds, at 1000 it ran until it was killed. vLLM's drafters usually propose a few.
MAX_SPECULATIVE_TOKENS = 16


def check_num_speculative_tokens(value: object) -> int:
    """Draft tokens per step (0: none), at most ``MAX_SPECULATIVE_TOKENS``."""
    if check_int("num_speculative_tokens", value, 0, note=" (0: no speculative decoding)") > MAX_SPECULATIVE_TOKENS:
        raise ConfigError(
            f"num_speculative_tokens {value} is above {MAX_SPECULATIVE_TOKENS}, the most the toy drafts "
            f"per step {LIMIT_NOTE}: each step runs K - 1 draft decode forwards; use fewer speculative "
            "tokens"
        )
    return value


MAX_SEED = 2**32 - 1
# One engine's weights, caches and largest step. The benchmark's GPU model (8 layers, hidden 1024,
# bf16) needs well under 1 GiB by ToyConfig.memory_estimate.
MAX_CONFIG_MEMORY_GIB = 16


def check_seed(seed: object) -> int:
    """A seed is an integer from 0 to 2**32 - 1 (what numpy accepts too), so every tool can replay it."""
    return check_int("seed", seed, 0, MAX_SEED)


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
    # The stateful layers' guard in plain Python in the module's forward (Inkling's style:
    # InklingShortConv.forward), not inside their custom op: under torch.compile dynamo then decides it
    # once, when it traces. (DeepSeek V4 keeps its compressor inside the splitting op
    # vllm::deepseek_v4_attention, which dynamo never traces.)
    python_guards: bool = False
    dtype: str = "float32"
    seed: int = 0
    layer_names: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", parse_layer_pattern(self.layers))
        for name in (
            "hidden_size",
            "num_heads",
            "vocab_size",
            "block_size",
            "num_blocks",
            "max_num_reqs",
            "max_model_len",
            "max_num_batched_tokens",
            "sconv_kernel_size",
            "compress_ratio",
        ):
            check_int(name, getattr(self, name))
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        if self.block_size % self.compress_ratio:
            raise ConfigError(
                f"block_size ({self.block_size}) must be a multiple of compress_ratio ({self.compress_ratio}) "
                "so that a compressed group never straddles two blocks"
            )
        check_seed(self.seed)
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
        self._check_memory()

    def memory_estimate(self) -> dict[str, int]:
        """Rough bytes one engine holds: weights; paged caches and per-token index buffers; the largest
        step's transient tensors (each token gathers up to ``max_model_len`` keys and values)."""
        h, tokens, n = self.hidden_size, self.max_num_tokens, self.layers.count
        weights = (2 * self.vocab_size + self.max_model_len + 10 * len(self.layers) * h) * h
        caches = (self.num_slots + self.block_size) * h * (2 * n("attn") + n("sconv") + 2 * n("compressor")) + (
            self.num_blocks + 1
        ) * h * self.head_dim * n("linear_attn")
        groups = self.max_model_len // self.compress_ratio
        buffers = 8 * (
            tokens * (self.sconv_kernel_size + self.compress_ratio + groups)
            + self.max_num_reqs * self.max_blocks_per_req
        )
        step = (
            tokens
            * h
            * (
                4
                + self.sconv_kernel_size * bool(n("sconv"))
                + 3 * self.max_model_len * bool(n("attn"))
                + 2 * groups * bool(n("compressor"))
            )
            + tokens * self.vocab_size
            + 3 * self.max_num_reqs * h * self.head_dim * bool(n("linear_attn"))
        )
        item = 4 if self.dtype == "float32" else 2
        return {"weights": weights * item, "caches": caches * item + buffers, "step": step * item}

    def _check_memory(self) -> None:
        parts = self.memory_estimate()
        total = sum(parts.values()) / 2**30
        if total > MAX_CONFIG_MEMORY_GIB:
            remedy = {
                "weights": "hidden_size, vocab_size, max_model_len or the number of layers",
                "caches": "num_blocks, block_size, hidden_size or max_num_batched_tokens",
                "step": "the tokens of a step (max_num_batched_tokens, max_num_reqs), max_model_len, "
                "hidden_size, vocab_size or sconv_kernel_size",
            }
            sizes = ", ".join(f"{name} {value / 2**30:.3g} GiB" for name, value in parts.items())
            raise ConfigError(
                f"this ToyConfig needs about {total:.3g} GiB ({sizes}), above the limit of "
                f"{MAX_CONFIG_MEMORY_GIB} GiB for one engine {LIMIT_NOTE}; lower "
                f"{remedy[max(parts, key=parts.__getitem__)]}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_blocks_per_req(self) -> int:
        return -(-self.max_model_len // self.block_size)

    @property
    def max_num_tokens(self) -> int:
        """Rows in every per-token persistent buffer: the largest step (no graph is larger:
        ``CompilationConfig.check_capture_sizes``)."""
        return max(self.max_num_batched_tokens, self.max_num_reqs)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size
