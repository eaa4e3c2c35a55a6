"""Attention metadata and its builders (vLLM: ``CommonAttentionMetadata``, the metadata builders,
``prepare_attn`` in ``vllm/v1/worker/gpu/model_states/default.py``). Builders write into buffers allocated
once and return views: a PIECEWISE graph keeps reading the addresses it saw at capture."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from cglab.buffers import PAD_SLOT_ID
from cglab.config import ToyConfig
from cglab.cudagraph_support import AttentionCGSupport, can_build_metadata
from cglab.errors import ConfigError, MetadataBuildError
from cglab.layer_registry import get_layer_kind, layer_kinds

if TYPE_CHECKING:
    from cglab.batch import InputBatch


@dataclass
class CommonAttentionMetadata:
    """What every builder starts from: views of the persistent buffers plus host-side sizes."""

    query_start_loc: torch.Tensor  # [num_reqs + 1]
    seq_lens: torch.Tensor  # [num_reqs]
    block_table_tensor: torch.Tensor  # [num_reqs, max_blocks_per_req]
    slot_mapping: torch.Tensor  # [num_tokens_padded], PAD_SLOT_ID on padding
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]


def token_requests_and_positions(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token row's request index and position (padding: the last request); no host sync."""
    token = torch.arange(num_tokens, device=query_start_loc.device)
    num_reqs = seq_lens.shape[0]
    request = torch.searchsorted(query_start_loc[1:], token, right=True).clamp(max=num_reqs - 1)
    position = seq_lens[request] - (query_start_loc[request + 1] - token)
    return request, position


def slots_at(block_table: torch.Tensor, request: torch.Tensor, position: torch.Tensor, block_size: int) -> torch.Tensor:
    """The cache slot of ``position`` in ``request``'s sequence; ``PAD_SLOT_ID`` where position < 0."""
    safe = position.clamp(min=0)
    block = block_table[request, torch.div(safe, block_size, rounding_mode="floor")]
    slot = block * block_size + safe % block_size
    return torch.where(position >= 0, slot, PAD_SLOT_ID)


class MetadataBuilder(Protocol):
    cudagraph_support: AttentionCGSupport  # which batches it can build capture metadata for

    def build(self, common: CommonAttentionMetadata, for_capture: bool = False) -> Any: ...


class _PersistentBuilder:
    """A builder whose outputs are views of buffers it allocated once."""

    def _out(self, name: str, num_tokens: int) -> torch.Tensor:
        return getattr(self, name)[:num_tokens]


# ---------------------------------------------------------------- attention
@dataclass
class AttentionMetadata:
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int  # the width of the key range the kernel reads
    for_capture: bool = False  # capture-safe metadata, built for the dummy capture batch
    plan: SchedulerPlan | None = None  # a lazily planned kernel's work plan (LazyPlanAttentionMetadataBuilder)


class AttentionMetadataBuilder:
    """Paged attention reads the common buffers directly: nothing to derive, nothing to allocate."""

    cudagraph_support = AttentionCGSupport.ALWAYS  # capture metadata sized for any replay (max_seq_len)

    def __init__(self, config: ToyConfig, device: torch.device | None = None) -> None:
        self.max_model_len = config.max_model_len

    def build(self, common: CommonAttentionMetadata, for_capture: bool = False) -> AttentionMetadata:
        # A FULL graph freezes every host-side number at capture, so capture metadata must fit any
        # replay: the key range is sized for the longest sequence the model allows. (A toy artefact:
        # vLLM's kernels stop at the live seq_lens, which they read on the device.)
        max_seq_len = self.max_model_len if for_capture else common.max_seq_len
        return AttentionMetadata(
            common.query_start_loc,
            common.seq_lens,
            common.block_table_tensor,
            common.slot_mapping,
            common.num_reqs,
            common.num_actual_tokens,
            common.max_query_len,
            max_seq_len,
            for_capture,
        )


# ---------------------------------------------------------------- lazily planned attention
@dataclass
class SchedulerPlan:
    """A kernel's work plan, made by its first call and reused after (FlashMLA's ``tile_scheduler_metadata``):
    a graph decides at capture whether to plan; a stale plan hides keys."""

    key_blocks: torch.Tensor | None = None  # [num_reqs]: key blocks each request reads

    @property
    def ready(self) -> bool:
        return self.key_blocks is not None

    def blocks_to_read(self, seq_lens: torch.Tensor, block_size: int) -> torch.Tensor:
        if self.key_blocks is None:
            self.key_blocks = torch.div(seq_lens + (block_size - 1), block_size, rounding_mode="floor")
        return self.key_blocks


class LazyPlanAttentionMetadataBuilder(AttentionMetadataBuilder):
    """Metadata with an empty ``SchedulerPlan``: a FULL graph records the planning only if its capture finds
    the plan empty, hence fresh metadata for warmup and capture (vLLM #42444)."""

    def build(self, common: CommonAttentionMetadata, for_capture: bool = False) -> AttentionMetadata:
        return replace(super().build(common, for_capture), plan=SchedulerPlan())


# ---------------------------------------------------------------- short convolution
@dataclass
class ShortConvMetadata:
    slot_mapping: torch.Tensor  # where each token's conv input is stored
    tap_slots: torch.Tensor  # [num_tokens, kernel_size - 1]: slots of the previous inputs, oldest first


class ShortConvMetadataBuilder(_PersistentBuilder):
    """Slots of each token's previous ``kernel_size - 1`` conv inputs, in the paged conv-state cache."""

    cudagraph_support = AttentionCGSupport.ALWAYS  # per-token slots: any batch shape

    def __init__(self, config: ToyConfig, device: torch.device) -> None:
        self.kernel_size = config.sconv_kernel_size
        self.block_size = config.block_size
        # Allocated once: graphs read this storage at every replay.
        self.tap_slots = torch.full(
            (config.max_num_tokens, self.kernel_size - 1), PAD_SLOT_ID, dtype=torch.long, device=device
        )

    def build(self, common: CommonAttentionMetadata, for_capture: bool = False) -> ShortConvMetadata:
        request, position = _real_tokens(common, self.block_size)
        back = torch.arange(self.kernel_size - 1, 0, -1, device=position.device)  # K-1, ..., 1
        tap_position = torch.where(position[:, None] >= 0, position[:, None] - back, -1)
        tap_slots = self._out("tap_slots", common.num_tokens)
        tap_slots.copy_(slots_at(common.block_table_tensor, request[:, None], tap_position, self.block_size))
        return ShortConvMetadata(common.slot_mapping, tap_slots)


# ---------------------------------------------------------------- compressor
@dataclass
class CompressorMetadata:
    slot_mapping: torch.Tensor  # where each token's partial state is saved
    group_slots: torch.Tensor  # [num_tokens, ratio]: the group a token completes (PAD if it completes none)
    compress_slots: torch.Tensor  # [num_tokens]: where that group's compressed entry goes (PAD: none)
    visible_slots: torch.Tensor  # [num_tokens, max_groups]: compressed entries the token may read


class CompressorMetadataBuilder(_PersistentBuilder):
    """Index math for a compressor that folds every ``ratio`` saved states into one compressed entry."""

    cudagraph_support = AttentionCGSupport.ALWAYS  # per-token slots: any batch shape

    def __init__(self, config: ToyConfig, device: torch.device) -> None:
        self.ratio = config.compress_ratio
        self.block_size = config.block_size
        self.max_groups = config.max_model_len // self.ratio
        n = config.max_num_tokens
        self.group_slots = torch.full((n, self.ratio), PAD_SLOT_ID, dtype=torch.long, device=device)
        self.compress_slots = torch.full((n,), PAD_SLOT_ID, dtype=torch.long, device=device)
        self.visible_slots = torch.full((n, max(self.max_groups, 1)), PAD_SLOT_ID, dtype=torch.long, device=device)

    def build(self, common: CommonAttentionMetadata, for_capture: bool = False) -> CompressorMetadata:
        request, position = _real_tokens(common, self.block_size)
        ratio, table = self.ratio, common.block_table_tensor
        # Only a token that is really stored (its slot is not PAD_SLOT_ID) may emit an entry, so dummy
        # capture batches write nothing into any real cache slot.
        completes = (common.slot_mapping >= 0) & (position >= 0) & ((position + 1) % ratio == 0)
        group_start = position - (ratio - 1)
        member = group_start[:, None] + torch.arange(ratio, device=position.device)
        group_slots = torch.where(
            completes[:, None], slots_at(table, request[:, None], member, self.block_size), PAD_SLOT_ID
        )
        # A compressed entry lives in the block that holds its group, `block_size // ratio` per block.
        compress_slots = torch.where(completes, self._compressed_slot(table, request, group_start), PAD_SLOT_ID)
        groups = torch.arange(self.visible_slots.shape[1], device=position.device)
        done = torch.div(position + 1, ratio, rounding_mode="floor").clamp(min=0)
        visible = groups[None, :] < done[:, None]
        visible_slots = torch.where(
            visible, self._compressed_slot(table, request[:, None], groups[None, :] * ratio), PAD_SLOT_ID
        )
        n = common.num_tokens
        outs = [self._out(name, n) for name in ("group_slots", "compress_slots", "visible_slots")]
        for out, value in zip(outs, (group_slots, compress_slots, visible_slots)):
            out.copy_(value)
        return CompressorMetadata(common.slot_mapping, *outs)

    def _compressed_slot(
        self, table: torch.Tensor, request: torch.Tensor, first_position: torch.Tensor
    ) -> torch.Tensor:
        safe = first_position.clamp(min=0)
        block = table[request, torch.div(safe, self.block_size, rounding_mode="floor")]
        return block * (self.block_size // self.ratio) + torch.div(
            safe % self.block_size, self.ratio, rounding_mode="floor"
        )


# ---------------------------------------------------------------- linear attention
@dataclass
class LinearAttentionMetadata:
    query_start_loc: torch.Tensor  # [num_reqs + 1]
    seq_lens: torch.Tensor  # [num_reqs]
    state_indices: torch.Tensor  # [num_reqs]: the state_cache row of each request (its first block)
    slot_mapping: torch.Tensor  # [num_tokens]: a PAD_SLOT_ID row updates no state
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int  # the kernel's loop count over query offsets, a host int


class LinearAttentionMetadataBuilder(_PersistentBuilder):
    """One recurrent state per request, at its first block. Capture metadata for decode-only batches, as
    vLLM's ``LinearAttentionMetadataBuilder``: the kernel loops ``max_query_len`` times, which a FULL graph freezes."""

    cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    def __init__(self, config: ToyConfig, device: torch.device) -> None:
        self.max_num_reqs = config.max_num_reqs
        # Allocated once: a FULL graph reads this storage at every replay.
        self.state_indices = torch.zeros(config.max_num_reqs, dtype=torch.long, device=device)

    def build(self, common: CommonAttentionMetadata, for_capture: bool = False) -> LinearAttentionMetadata:
        if not can_build_metadata(
            self.cudagraph_support,
            num_reqs=common.num_reqs,
            num_tokens=common.num_actual_tokens,
            max_query_len=common.max_query_len,
            for_capture=for_capture,
        ):
            raise MetadataBuildError(
                f"{type(self).__name__} cannot build capture metadata (for_capture=True) for a batch of "
                f"{common.num_actual_tokens} tokens in {common.num_reqs} requests (longest query "
                f"{common.max_query_len} tokens): its cudagraph_support is {self.cudagraph_support.name}, capture "
                f"metadata for {self.cudagraph_support.describe()} only. Keep every capture size at or below "
                f"max_num_reqs ({self.max_num_reqs}) so that capture batches are decode-shaped, or build ordinary "
                "metadata (for_capture=False) for PIECEWISE capture, as vLLM PR #49364 does"
            )
        state_indices = self._out("state_indices", common.num_reqs)
        state_indices.copy_(common.block_table_tensor[:, 0])
        return LinearAttentionMetadata(
            common.query_start_loc,
            common.seq_lens,
            state_indices,
            common.slot_mapping,
            common.num_reqs,
            common.num_actual_tokens,
            common.max_query_len,
        )


def _real_tokens(common: CommonAttentionMetadata, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request and position per token row; -1 for padding rows and for positions past the block-table row
    (a capture batch split as before vLLM #49751, which attention refuses)."""
    request, position = token_requests_and_positions(common.query_start_loc, common.seq_lens, common.num_tokens)
    is_real = torch.arange(common.num_tokens, device=position.device) < common.num_actual_tokens
    in_row = position < common.block_table_tensor.shape[1] * block_size
    return request, torch.where(is_real & in_row, position, -1)


class AllocatingShortConvMetadataBuilder(ShortConvMetadataBuilder):
    """Breaks the fragile assumption: ``build()`` returns fresh tensors, so a graph reads the capture's slots."""

    def _out(self, name: str, num_tokens: int) -> torch.Tensor:
        return torch.empty_like(getattr(self, name)[:num_tokens])


# ---------------------------------------------------------------- groups and prepare_attn
@dataclass
class AttentionGroup:
    """Layers of one kind share one builder, so their metadata is built once per step."""

    kind: str
    builder: MetadataBuilder
    layer_names: list[str]


def build_attn_groups(
    config: ToyConfig,
    device: torch.device,
    builders: Mapping[str, MetadataBuilder] | None = None,
    layers: Sequence[tuple[str, str]] | None = None,
) -> list[AttentionGroup]:
    """One group per layer kind, with its registered builder (``builders`` overrides one). ``layers``:
    ``(name, kind)`` pairs (default: the model's; a drafter's join the target's groups)."""
    builders = dict(builders or {})
    # A bad builder fails here, not as an AttributeError mid-capture.
    for kind, builder in builders.items():
        if kind not in layer_kinds():  # a typo would otherwise silently keep the default builder
            raise ConfigError(f"builders has unknown layer kind {kind!r}; valid kinds: {', '.join(layer_kinds())}")
        support = getattr(builder, "cudagraph_support", None)
        if builder is not None and not (
            callable(getattr(builder, "build", None)) and isinstance(support, AttentionCGSupport)
        ):
            raise ConfigError(
                f"builders[{kind!r}] ({type(builder).__name__}) must have a build(common, for_capture) method "
                "and a cudagraph_support such as AttentionCGSupport.ALWAYS; pass e.g. "
                "ShortConvMetadataBuilder(config, device)"
            )
    pairs = list(zip(config.layer_names, config.layers)) if layers is None else list(layers)
    groups = []
    for kind in dict.fromkeys(k for _, k in pairs):
        names = [n for n, k in pairs if k == kind]
        builder = builders.get(kind) or get_layer_kind(kind).make_builder(config, device)
        groups.append(AttentionGroup(kind, builder, names))
    return groups


def min_cudagraph_support(attn_groups: Sequence[AttentionGroup]) -> tuple[AttentionCGSupport, str]:
    """The least capable builder's ``cudagraph_support`` and class name (the first on a tie)."""
    support, name = AttentionCGSupport.ALWAYS, ""
    for group in attn_groups:
        if group.builder.cudagraph_support < support or not name:
            support, name = group.builder.cudagraph_support, type(group.builder).__name__
    return support, name


def prepare_attn(
    input_batch: InputBatch,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    attn_groups: Sequence[AttentionGroup],
    for_capture: bool = False,
) -> dict[str, Any]:
    """Every layer's metadata for one step, ``{layer_name: metadata}``; ``for_capture``: capture-safe (FULL)."""
    common = CommonAttentionMetadata(
        query_start_loc=input_batch.query_start_loc,
        seq_lens=input_batch.seq_lens,
        block_table_tensor=block_table,
        slot_mapping=slot_mapping,
        num_reqs=input_batch.num_reqs,
        num_actual_tokens=input_batch.num_tokens,
        max_query_len=input_batch.max_query_len,
        max_seq_len=input_batch.max_seq_len,
    )
    metadata: dict[str, Any] = {}
    for group in attn_groups:
        built = group.builder.build(common, for_capture=for_capture)
        metadata.update(dict.fromkeys(group.layer_names, built))
    return metadata
