"""``CompilationConfig`` and ``SpeculativeConfig``: how a runner compiles and captures, one frozen value
each, checked once (vLLM: ``vllm/config/compilation.py``, ``vllm/config/speculative.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from cglab.config import (
    OP_OF_KIND,
    CUDAGraphMode,
    ToyConfig,
    check_no_empty_item,
    check_num_speculative_tokens,
    check_sizes,
    dummy_longest_request,
)
from cglab.errors import ConfigError

COMPILE_BACKENDS = ("auto", "eager", "inductor")
GRAPH_BACKENDS = ("auto", "sim", "cuda")
DEFAULT_CAPTURE_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class CompilationConfig:
    """How the model is compiled and its CUDA graphs captured.

    ``cudagraph_mode``: a runtime mode or a policy (``"full_and_piecewise"`` is vLLM's default).
    ``cudagraph_capture_sizes``: the token counts graphs are captured for (sorted; empty: none).
    ``use_breakable_cg``: PIECEWISE as one breakable capture of the plain model, instead of
    torch.compile pieces split at ``splitting_ops`` (None: the model's attention ops).
    ``backend``: how compiled pieces are compiled; ``"auto"`` is inductor on CUDA and the FX piece
    as it is on the CPU, unless ``$CGLAB_COMPILE_BACKEND`` says otherwise.
    ``legacy_skip_attn``: capture with the code from before vLLM PR #49364 (the bug).
    ``uniform_decode_by_shape``: classify a batch as uniform decode by its shape alone, as vLLM did
    before PR #51865 (a prompt chunk of one token per request then takes a decode graph).
    ``pre_49751_dummy_split``: the capture batch's split from before vLLM PR #49751 (the whole remainder
    of the tokens to the last dummy request, which may then exceed ``max_model_len``): the revert of #49364.
    ``graph_backend``: ``"sim"`` (the CPU simulator), ``"cuda"``, or ``"auto"`` by device.
    ``check_addresses``: before every replay, check that each tensor a graph read at capture was
    written in place (None: on for the simulator, off for real CUDA graphs, where it costs time).
    """

    cudagraph_mode: CUDAGraphMode = CUDAGraphMode.NONE
    cudagraph_capture_sizes: tuple[int, ...] = DEFAULT_CAPTURE_SIZES
    use_breakable_cg: bool = False
    splitting_ops: tuple[str, ...] | None = None
    backend: str = "auto"
    legacy_skip_attn: bool = False
    uniform_decode_by_shape: bool = False
    pre_49751_dummy_split: bool = False
    graph_backend: str = "auto"
    check_addresses: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cudagraph_mode", CUDAGraphMode.parse(self.cudagraph_mode))
        sizes = check_sizes(
            "capture size", self.cudagraph_capture_sizes, example="(1, 2, 4, 8)", allow_empty=True, distinct=True
        )
        object.__setattr__(self, "cudagraph_capture_sizes", tuple(sorted(sizes)))
        for name in ("use_breakable_cg", "legacy_skip_attn", "uniform_decode_by_shape", "pre_49751_dummy_split"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.check_addresses, (bool, type(None))):
            raise ConfigError(
                f"check_addresses must be True, False or None (the graph backend's default), "
                f"got {self.check_addresses!r}"
            )
        if self.backend not in COMPILE_BACKENDS:
            raise ConfigError(f"unknown compile backend {self.backend!r}; use {', '.join(map(repr, COMPILE_BACKENDS))}")
        if self.graph_backend not in GRAPH_BACKENDS:
            raise ConfigError(
                f"unknown graph backend {self.graph_backend!r}; valid names: {', '.join(map(repr, GRAPH_BACKENDS))}"
            )
        if self.splitting_ops is not None:
            object.__setattr__(self, "splitting_ops", _parse_splitting_ops(self.splitting_ops, self.use_breakable_cg))

    @classmethod
    def of(cls, value: CompilationConfig | str | CUDAGraphMode) -> CompilationConfig:
        """``value`` itself, or a mode name as shorthand for a config with only that mode."""
        return value if isinstance(value, CompilationConfig) else cls(cudagraph_mode=value)

    def check_capture_sizes(self, config: ToyConfig) -> None:
        """Every capture size fits ``config`` (vLLM checks them against the scheduler's limits): no more
        tokens than a step may hold, and a dummy capture batch whose longest request fits a request."""
        sizes = self.cudagraph_capture_sizes
        if sizes and max(sizes) > config.max_num_batched_tokens:
            raise ConfigError(
                f"capture size {max(sizes)} exceeds max_num_batched_tokens "
                f"({config.max_num_batched_tokens}); raise max_num_batched_tokens or drop that size"
            )
        # The capture batch is a real batch to the metadata builders: a request longer than
        # max_model_len would index past its block-table row. The old split is let through: its failure
        # at capture is the lesson.
        if self.pre_49751_dummy_split:
            return
        too_long = [s for s in sizes if dummy_longest_request(s, config.max_num_reqs) > config.max_model_len]
        if too_long:
            s = min(too_long)
            longest = dummy_longest_request(s, config.max_num_reqs)
            raise ConfigError(
                f"capture size {s} does not fit: its capture batch puts {longest} tokens in one request "
                f"(max_num_reqs {config.max_num_reqs}), above max_model_len "
                f"({config.max_model_len}); raise max_model_len or max_num_reqs, or drop that size"
            )

    @property
    def piecewise_flavor(self) -> str:
        """``"breakable"`` or ``"compiled"``, as the notebooks and the command line name them."""
        return "breakable" if self.use_breakable_cg else "compiled"


def _parse_splitting_ops(value: object, use_breakable_cg: bool) -> tuple[str, ...]:
    """Known op names, at least one, each once; compiled PIECEWISE only (the model: ``resolve_splitting_ops``)."""
    if use_breakable_cg:
        raise ConfigError(
            "splitting_ops applies to piecewise_flavor='compiled' (use_breakable_cg=False); breakable "
            "graphs split where the eager-break functions are called (attention)"
        )
    parts = value.split(",") if isinstance(value, str) else value
    if not isinstance(parts, (list, tuple)) or not all(isinstance(p, str) for p in parts):
        raise ConfigError(
            f"splitting_ops must be a list of op names such as ['cglab::unified_attention'], got {value!r}"
        )
    names = [p.strip() for p in parts]
    if not any(names):
        raise ConfigError(
            "splitting_ops is empty: compiled PIECEWISE needs at least one op to split at; "
            "for one graph over the whole forward use mode 'full'"
        )
    check_no_empty_item("splitting_ops", value, names)
    unknown = [op for op in names if op not in OP_OF_KIND.values()]
    if unknown:
        raise ConfigError(
            f"unknown splitting op(s) {', '.join(map(repr, unknown))}; valid names: {', '.join(OP_OF_KIND.values())}"
        )
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class SpeculativeConfig:
    """What a target runner needs to serve a drafter: K (uniform decode batches hold ``K + 1`` tokens per
    request) and the drafter's ``(layer name, kind)`` pairs, whose metadata the target builds too."""

    num_speculative_tokens: int
    draft_layers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if check_num_speculative_tokens(self.num_speculative_tokens) == 0:
            raise ConfigError("num_speculative_tokens is 0: there is nothing to draft; use a plain ModelRunner")
        object.__setattr__(self, "draft_layers", tuple(tuple(pair) for pair in self.draft_layers))

    @property
    def uniform_decode_query_len(self) -> int:
        return self.num_speculative_tokens + 1
