"""``CompilationConfig`` and ``SpeculativeConfig``: how a runner compiles and captures, one frozen value
each, checked once (vLLM: ``vllm/config/compilation.py``, ``vllm/config/speculative.py``)."""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cglab.config import CUDAGraphMode, ToyConfig, check_int, parse_layer_pattern, parse_names
from cglab.cudagraph_support import AttentionCGSupport
from cglab.errors import ConfigError
from cglab.layer_registry import get_layer_kind, layer_kinds

if TYPE_CHECKING:
    import torch

    from cglab.metadata import AttentionGroup

COMPILE_BACKENDS = ("auto", "eager", "inductor")
GRAPH_BACKENDS = ("auto", "sim", "cuda")
DEFAULT_CAPTURE_SIZES = (1, 2, 4, 8)
COMPILE_BACKEND_ENV = "CGLAB_COMPILE_BACKEND"
# Which batches may take a uniform-decode graph (``cglab.batch.decode_graph_eligible``), dated: vLLM's rule
# today, the rule of vLLM PR #51865 (August 2026), and the rule before it (the shape alone).
UNIFORM_DECODE_RULES = ("current", "51865", "shape")


@dataclass(frozen=True)
class CompilationConfig:
    """How the model is compiled and its CUDA graphs captured; ``resolve`` fills every "auto" and None.

    ``cudagraph_mode``: a runtime mode or a policy (``"full_and_piecewise"`` is vLLM's default).
    ``use_breakable_cg``: PIECEWISE as one breakable capture of the plain model, instead of torch.compile
    pieces split at ``splitting_ops`` (None: the model's attention ops). ``backend``: how pieces compile
    (``"auto"``: ``$CGLAB_COMPILE_BACKEND``, else inductor on CUDA, the FX piece as it is on the CPU).
    ``legacy_skip_attn``: capture as before vLLM PR #49364 (the bug). ``uniform_decode_rule``: which batches
    count as uniform decode (``UNIFORM_DECODE_RULES``): vLLM's rule today, PR #51865's or the
    shape alone, as before it. ``pre_49751_dummy_split``: the capture
    batch's split from before PR #49751 (which fixed the crash that got #49364 reverted).
    ``check_addresses``: check before every replay that each tensor a graph read was written in place (None:
    on for the simulator only).
    ``cudagraph_mode_note``: set by ``resolve``: why the mode was lowered.
    """

    cudagraph_mode: CUDAGraphMode = CUDAGraphMode.NONE
    cudagraph_capture_sizes: tuple[int, ...] = DEFAULT_CAPTURE_SIZES
    use_breakable_cg: bool = False
    splitting_ops: tuple[str, ...] | None = None
    backend: str = "auto"
    legacy_skip_attn: bool = False
    uniform_decode_rule: str = "current"
    pre_49751_dummy_split: bool = False
    graph_backend: str = "auto"
    check_addresses: bool | None = None
    cudagraph_mode_note: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cudagraph_mode", CUDAGraphMode.parse(self.cudagraph_mode))
        sizes = self.cudagraph_capture_sizes
        if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
            raise ConfigError(
                f"give the capture sizes as a list of positive integers such as (1, 2, 4, 8), got {sizes!r}"
            )
        for size in sizes:
            check_int("every capture size", size)
        if len(set(sizes)) != len(sizes):
            raise ConfigError(f"capture sizes must be distinct, got {list(sizes)}; drop the duplicates")
        object.__setattr__(self, "cudagraph_capture_sizes", tuple(sorted(sizes)))
        for name in ("use_breakable_cg", "legacy_skip_attn", "pre_49751_dummy_split"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.uniform_decode_rule not in UNIFORM_DECODE_RULES:
            raise ConfigError(
                f"uniform_decode_rule must be one of {UNIFORM_DECODE_RULES}, got {self.uniform_decode_rule!r}"
            )
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
        if self.splitting_ops is not None and self.use_breakable_cg:
            raise ConfigError(
                "splitting_ops applies to piecewise_flavor='compiled' (use_breakable_cg=False); breakable "
                "graphs split where the eager-break functions are called (attention)"
            )
        if self.splitting_ops is not None:
            names = parse_names(
                self.splitting_ops,
                tuple(get_layer_kind(k).op for k in layer_kinds()),
                what="splitting_ops",
                item="splitting op",
                example="a list of op names such as ['cglab::unified_attention']",
                if_empty="give one op or more; for one graph over the whole forward use mode 'full'",
            )
            object.__setattr__(self, "splitting_ops", tuple(dict.fromkeys(names)))

    @classmethod
    def of(cls, value: CompilationConfig | str | CUDAGraphMode) -> CompilationConfig:
        """``value`` itself, or a mode name as shorthand for a config with only that mode."""
        return value if isinstance(value, CompilationConfig) else cls(cudagraph_mode=value)

    def resolve(
        self,
        config: ToyConfig,
        device: torch.device,
        attn_groups: Sequence[AttentionGroup],
        decode_query_len: int = 1,
    ) -> CompilationConfig:
        """A new config with nothing left to decide, for ``config`` on ``device`` with these builders
        (``decode_query_len``: ``K + 1`` under speculative decoding): the one place "auto" and None are
        resolved, as vLLM resolves its ``VllmConfig`` once. The mode is lowered to what the builders support."""
        kinds = [get_layer_kind(k) for k in dict.fromkeys(config.layers)]
        layer_ops = [kind.op for kind in kinds]
        if self.use_breakable_cg:
            ops: tuple[str, ...] = ()  # breakable graphs split where the model calls an eager break
        elif self.splitting_ops is None:
            ops = tuple(kind.op for kind in kinds if kind.splitting)
        else:
            ops = self.splitting_ops
            absent = [op for op in ops if op not in layer_ops]
            if absent:
                raise ConfigError(
                    f"splitting op(s) {', '.join(map(repr, absent))} are not in this model (layers "
                    f"{','.join(config.layers)}: {', '.join(layer_ops)}); add the layer or drop the op"
                )
        from cglab.metadata import min_cudagraph_support  # here: the command line checks configs before torch

        support, builder_name = min_cudagraph_support(attn_groups)
        mode, note = resolve_cudagraph_mode(
            self.cudagraph_mode,
            support,
            builder_name=builder_name,
            splitting_ops_contain_attention=splitting_ops_contain_attention(ops, config.layers, self.piecewise_flavor),
            uniform_decode_query_len=decode_query_len,
        )
        unsplit = [kind.op for kind in kinds if kind.must_split and kind.op not in ops]
        if not self.use_breakable_cg and CUDAGraphMode.PIECEWISE in mode.runtime_modes() and unsplit:
            # Inside a piece it would replay the capture batch's request count and loop count forever.
            raise ConfigError(
                f"{unsplit[0]} must be a splitting op under compiled PIECEWISE: it reads per-request metadata "
                "(query_start_loc, seq_lens, state indices) that a captured piece would freeze at the "
                f"dummy batch's size; add {unsplit[0]} to splitting_ops (the default has it)"
            )
        backend = self.backend
        if backend == "auto":  # the notebooks set eager on a GPU (cglab.lab.notebook.setup_notebook)
            env = os.environ.get(COMPILE_BACKEND_ENV, "")
            backend = env.strip().lower() or ("inductor" if device.type == "cuda" else "eager")
            if backend not in COMPILE_BACKENDS[1:]:
                raise ConfigError(
                    f"{COMPILE_BACKEND_ENV}={env!r} is not a compile backend; set it to eager or inductor, "
                    "or unset it (inductor on CUDA, eager on the CPU)"
                )
        graph_backend = self.graph_backend
        if graph_backend == "auto":
            graph_backend = "cuda" if device.type == "cuda" else "sim"
        resolved = copy.copy(self)  # not dataclasses.replace: () splitting ops are valid once resolved
        for name, value in {
            "cudagraph_mode": mode,
            "cudagraph_mode_note": note or self.cudagraph_mode_note,
            "splitting_ops": ops,
            "backend": backend,
            "graph_backend": graph_backend,
            "check_addresses": graph_backend == "sim" if self.check_addresses is None else self.check_addresses,
        }.items():
            object.__setattr__(resolved, name, value)
        return resolved

    @property
    def piecewise_flavor(self) -> str:
        return "breakable" if self.use_breakable_cg else "compiled"


def splitting_ops_contain_attention(splitting_ops: Sequence[str], layers: tuple[str, ...], flavor: str) -> bool:
    """Whether attention runs outside the PIECEWISE graphs (vLLM's ``splitting_ops_contain_attention``)."""
    if flavor == "breakable":
        return True
    attention_ops = {get_layer_kind(k).op for k in layers if get_layer_kind(k).splitting}
    return bool(attention_ops) and attention_ops <= set(splitting_ops)


def resolve_cudagraph_mode(
    mode: CUDAGraphMode,
    min_support: AttentionCGSupport,
    *,
    builder_name: str,
    splitting_ops_contain_attention: bool,
    uniform_decode_query_len: int = 1,
) -> tuple[CUDAGraphMode, str | None]:
    """The mode to run when the least capable builder has ``min_support``, and why it was lowered (vLLM:
    ``resolve_cudagraph_mode_and_sizes``): mixed FULL graphs need ``ALWAYS``, speculative ones ``UNIFORM_BATCH``."""
    support = f"{builder_name}'s cudagraph_support is {min_support.name}"
    notes: list[str] = []

    def lower(to: CUDAGraphMode, why: str) -> CUDAGraphMode:
        notes.append(f"cudagraph_mode {resolved.name} lowered to {to.name}: {support}; {why}")
        return to

    resolved = mode
    if mode is CUDAGraphMode.NONE:
        return mode, None
    if mode.mixed_mode() is CUDAGraphMode.FULL and min_support is not AttentionCGSupport.ALWAYS:
        if min_support is AttentionCGSupport.NEVER:
            raise ConfigError(
                f"cudagraph_mode {mode.name} is not supported: {support} (no capture metadata for "
                "any batch); use cudagraph_mode='piecewise', with attention among the splitting ops"
            )
        mixed = (
            "mixed batches run PIECEWISE (attention is outside the graphs)"
            if splitting_ops_contain_attention
            else "mixed batches run eagerly (attention is not a splitting op)"
        )
        resolved = lower(
            CUDAGraphMode.FULL_AND_PIECEWISE if splitting_ops_contain_attention else CUDAGraphMode.FULL_DECODE_ONLY,
            f"FULL graphs of mixed batches need ALWAYS; {mixed}, uniform decode batches FULL",
        )
    if resolved.decode_mode() is CUDAGraphMode.FULL and min_support is AttentionCGSupport.NEVER:
        resolved = (
            lower(CUDAGraphMode.PIECEWISE, "no FULL graph can be captured; attention is compiled piecewise")
            if splitting_ops_contain_attention
            else lower(CUDAGraphMode.NONE, "no FULL graph can be captured, and attention is not compiled piecewise")
        )
    if (
        resolved.decode_mode() is CUDAGraphMode.FULL
        and uniform_decode_query_len > 1
        and min_support < AttentionCGSupport.UNIFORM_BATCH
    ):
        why = (
            f"speculative decoding verifies {uniform_decode_query_len} tokens per request, and FULL graphs of such "
            "batches need UNIFORM_BATCH or more"
        )
        resolved = lower(CUDAGraphMode.PIECEWISE if splitting_ops_contain_attention else CUDAGraphMode.NONE, why)
    return resolved, "; then ".join(notes) or None


@dataclass(frozen=True)
class SpeculativeConfig:
    """What a target runner needs to serve a drafter: K, and the drafter's ``(layer name, kind)`` pairs."""

    num_speculative_tokens: int
    draft_layers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if check_int("num_speculative_tokens", self.num_speculative_tokens, 0) == 0:
            raise ConfigError("num_speculative_tokens is 0: there is nothing to draft; use a plain ModelRunner")
        pairs = self.draft_layers
        try:  # the names the drafter builds its layers under, from the kinds after its fusion conv
            pairs = tuple(map(tuple, pairs))
            ok = not pairs or pairs == tuple(draft_layer_pairs([kind for _, kind in pairs[1:]]))
        except (TypeError, ValueError):  # not pairs, or an unknown kind
            ok = False
        if not ok:
            raise ConfigError(
                f"draft_layers must be the drafter's (name, kind) pairs as draft_layer_pairs('attn') gives them "
                f"(kinds from {', '.join(layer_kinds())}), got {self.draft_layers!r}"
            )
        object.__setattr__(self, "draft_layers", pairs)

    @property
    def uniform_decode_query_len(self) -> int:
        return self.num_speculative_tokens + 1


DRAFT_PREFIX = "draft."  # draft layer names, "draft.layers.0.sconv": they share metadata dicts with the target's
FUSION_LAYER = f"{DRAFT_PREFIX}layers.0.sconv"


def draft_layer_pairs(layers: str | Sequence[str]) -> list[tuple[str, str]]:
    """``[("draft.layers.0.sconv", "sconv"), ("draft.layers.1.attn", "attn"), ...]``: the fusion conv,
    then the decoder layers of the pattern ``layers``."""
    kinds = parse_layer_pattern(layers)
    return [(FUSION_LAYER, "sconv"), *((f"{DRAFT_PREFIX}layers.{i}.{kind}", kind) for i, kind in enumerate(kinds, 1))]
