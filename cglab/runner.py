"""``ModelRunner``: one step from the request to the logits (vLLM: ``gpu/model_runner.py``): write the
batch into the persistent buffers, build its metadata, dispatch it, replay a graph or run eagerly."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cglab.batch import (
    BatchExecutionDescriptor,
    CudagraphDispatcher,
    InputBatch,
    decode_graph_eligible,
    get_uniform_decode_token_count,
)
from cglab.buffers import BlockTables, InputBuffers
from cglab.capacity import check_engine_fits
from cglab.compilation import CglabBackend, CompiledModel, CUDAGraphWrapper
from cglab.compilation.wrapper import build_forward_model, piecewise_wrappers
from cglab.compilation_config import CompilationConfig, SpeculativeConfig
from cglab.config import DEVICES, CUDAGraphMode, ToyConfig, check_int
from cglab.cudagraph_utils import CaptureForward, CudaGraphManager, create_capture_forward, graph_reads, tensor_source
from cglab.errors import RELEASED, CapacityError, CaptureError, ConfigError, MissingMetadataError
from cglab.forward_context import set_forward_context
from cglab.graphs import CapturedGraph, get_backend
from cglab.metadata import AttentionGroup, MetadataBuilder, build_attn_groups, prepare_attn
from cglab.model import ToyTransformer
from cglab.requests import BlockPool, RequestState


def resolve_device(device: str | torch.device) -> torch.device:
    """``"cpu"`` or ``"cuda"``, with an error that says how to go on without a GPU."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        resolved = None
    if resolved is None or resolved.type not in DEVICES:
        raise ConfigError(f"unknown device {device!r}; use 'cpu' or 'cuda'")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device 'cuda' was asked for but no CUDA GPU is visible; "
            "use device 'cpu' (--device cpu) to run the CPU simulator of CUDA graphs"
        )
    return resolved


@dataclass
class PreparedStep:
    """A step written into the buffers and ready to run; ``execute`` may run it more than once."""

    descriptor: BatchExecutionDescriptor
    input_batch: InputBatch
    attn_metadata: dict[str, Any]
    requests: list[RequestState]
    seq_lens: list[int]

    @property
    def num_tokens(self) -> int:
        return self.input_batch.num_tokens


@dataclass
class StepOutput:
    logits: torch.Tensor  # [num_tokens, vocab]: a copy, since a graph's output is overwritten next step
    descriptor: BatchExecutionDescriptor  # how the step ran (cg_mode NONE: eagerly)


class ModelRunner:
    """A toy engine: a model, its persistent buffers, its metadata builders and its graphs.

    ``compilation_config``: a config or a mode name (``"none"``: the eager reference), kept resolved.
    ``builders``: metadata builders by layer kind. ``progress(desc)``: called after each capture.
    ``forward_model``: what every step calls, the model or the model through torch.compile.
    """

    requests: dict[str, RequestState]  # by request id

    def __init__(
        self,
        config: ToyConfig,
        compilation_config: CompilationConfig | str | CUDAGraphMode = "none",
        *,
        device: str | torch.device = "cpu",
        builders: dict[str, MetadataBuilder] | None = None,
        progress: Callable[[BatchExecutionDescriptor], None] | None = None,
        speculative_config: SpeculativeConfig | None = None,
    ) -> None:
        if progress is not None and not callable(progress):
            raise ConfigError(f"progress must be a function called with each descriptor captured, got {progress!r}")
        spec = self.speculative_config = speculative_config
        decode_query_len = spec.uniform_decode_query_len if spec else 1
        self.config, self.device = config, resolve_device(device)
        layers = [*zip(config.layer_names, config.layers), *(spec.draft_layers if spec else ())]
        # Before anything is sized by the config: whether it fits.
        cc = check_engine_fits(config, CompilationConfig.of(compilation_config), self.device, spec)
        self.attn_groups = build_attn_groups(config, self.device, builders, layers)
        cc = self.compilation_config = cc.resolve(config, self.device, self.attn_groups, decode_query_len)
        self.model = ToyTransformer(config, self.device, return_hidden_states=spec is not None)
        reqs, tokens = config.max_num_reqs, config.max_num_tokens
        self.input_buffers = InputBuffers(reqs, tokens, self.device, cc.pre_49751_dummy_split)
        self.block_tables = BlockTables(reqs, config.max_blocks_per_req, config.block_size, tokens, self.device)
        self.dispatcher = CudagraphDispatcher(cc.cudagraph_mode, cc.cudagraph_capture_sizes, reqs, decode_query_len)
        self.block_pool, self.requests = BlockPool(config.num_blocks), {}
        graphs = cc.cudagraph_mode is not CUDAGraphMode.NONE
        backend = self.graph_backend = get_backend(cc.graph_backend, self.device) if graphs else None
        self.forward_model: Callable[..., torch.Tensor] = build_forward_model(self.model, cc, backend)
        self.cudagraph_manager: CudaGraphManager | None = None
        self.profile_run()
        if backend is not None:
            self.cudagraph_manager = CudaGraphManager(
                backend, self.dispatcher, cc.check_addresses, not cc.use_breakable_cg
            )
            self.cudagraph_manager.capture(self.create_forward_fn, progress)

    @property
    def compiled_backend(self) -> CglabBackend | None:
        """The torch.compile backend of a compiled model (split graph, pieces, wrappers)."""
        return self.forward_model.backend if isinstance(self.forward_model, CompiledModel) else None

    def graph_replays(self) -> dict[BatchExecutionDescriptor, int]:
        """Every captured descriptor, in capture order, with the steps its graph served."""
        manager, wrappers = self.cudagraph_manager, self.piecewise_wrappers()
        if manager is None:
            return {}
        self.check_open()
        full = {desc: entry.replays for desc, entry in manager.graphs.items()}
        pieces = {desc: entry.replays for desc, entry in wrappers[0].entries.items()} if wrappers else {}
        return {desc: full[desc] if desc in full else pieces.get(desc, 0) for desc in manager.addresses}

    def captured_graphs(self, desc: BatchExecutionDescriptor) -> list[CapturedGraph]:
        """The graphs a step of ``desc`` replays: its FULL graph, or one per PIECEWISE wrapper."""
        self.check_open()
        manager = self.cudagraph_manager
        if manager is not None and desc in manager.graphs:
            return [manager.graphs[desc].graph]
        return [w.entries[desc].graph for w in self.piecewise_wrappers() if desc in w.entries]

    def check_open(self) -> None:
        """Refuse to show graphs that ``close()`` released."""
        if self.cudagraph_manager is not None and self.cudagraph_manager.released:
            raise CaptureError(f"this ModelRunner is closed: {RELEASED}")

    def piecewise_wrappers(self) -> list[CUDAGraphWrapper]:
        """Where the PIECEWISE graphs live: one wrapper per compiled piece, or the breakable one."""
        return piecewise_wrappers(self.forward_model)

    @property
    def backend_name(self) -> str:
        return self.cudagraph_manager.backend.name if self.cudagraph_manager else "eager"

    # ------------------------------------------------------------ start-up
    @torch.inference_mode()
    def profile_run(self) -> None:
        """One forward over the largest batch with no metadata, as vLLM's start-up measures memory. Compiled,
        dynamo traces here (a ``python_guards`` guard is decided for good); a strict layer fails at capture."""
        num_tokens = self.config.max_num_tokens
        try:
            with set_forward_context(None, CUDAGraphMode.NONE):
                self.forward_model(self.input_buffers.input_ids[:num_tokens], self.input_buffers.positions[:num_tokens])
        except MissingMetadataError:  # only a strict layer raises it: the trace is done, capture will fail
            pass
        except CaptureError as exc:  # same type, so callers can still tell the rules apart
            raise type(exc)(f"the profiling run before capture (where torch.compile traces) failed: {exc}") from exc

    # ------------------------------------------------------------ capture
    def create_forward_fn(self, desc: BatchExecutionDescriptor, warmup: bool) -> CaptureForward:
        """Prepare ``desc``'s dummy inputs and metadata; return the forward the manager captures."""
        input_ids = self.input_buffers.input_ids[: desc.num_tokens]
        positions = self.input_buffers.positions[: desc.num_tokens]
        return create_capture_forward(
            desc,
            self.config.max_num_reqs,
            self.input_buffers,
            self.block_tables,
            self.attn_groups,
            self.compilation_config,
            lambda num_reqs: self.forward_model(input_ids, positions),
            lambda metadata: self._graph_reads(metadata, input_ids, positions),
        )

    def _graph_reads(self, attn_metadata: Any, input_ids: torch.Tensor, positions: torch.Tensor) -> dict[str, Any]:
        return graph_reads(attn_metadata, input_ids=input_ids, positions=positions, **self.state_tensors())

    def _source(self, name: str) -> str:
        return tensor_source(name, self.attn_groups, self.state_tensors(), " (ModelRunner.input_buffers)")

    # ------------------------------------------------------------ requests
    def add_request(self, req_id: str, num_prompt_tokens: int | None = None) -> None:
        """Admit a request. ``num_prompt_tokens``: its prompt length, if it comes in chunks (None: in one step)."""
        if req_id in self.requests:
            raise ConfigError(f"request {req_id!r} already exists; use a new id or free_request() it first")
        if num_prompt_tokens is not None:
            check_int("num_prompt_tokens", num_prompt_tokens)
        self.requests[req_id] = RequestState(req_id, num_prompt_tokens=num_prompt_tokens)

    def free_request(self, req_id: str) -> None:
        self.block_pool.free(self._request(req_id).block_ids)
        del self.requests[req_id]

    def _request(self, req_id: str) -> RequestState:
        if req_id not in self.requests:
            raise ConfigError(f"unknown request {req_id!r}; call add_request({req_id!r}) first")
        return self.requests[req_id]

    # ------------------------------------------------------------ one step
    def step(self, scheduled: Mapping[str, Sequence[int]], eager: bool = False) -> StepOutput:
        """Run one step: ``scheduled`` maps each request id to its new token ids (one for decode)."""
        prepared = self.prepare_step(scheduled, eager)
        logits = self.execute(prepared)[: prepared.num_tokens].clone()
        for request, seq_len in zip(prepared.requests, prepared.seq_lens):
            request.num_computed_tokens = seq_len
        return StepOutput(logits, prepared.descriptor)

    def prepare_step(self, scheduled: Mapping[str, Sequence[int]], eager: bool = False) -> PreparedStep:
        """Dispatch the batch and write it, padded, into the persistent buffers; build its metadata."""
        if not isinstance(eager, bool):  # "no" is truthy: it would silently skip the graphs
            raise ConfigError(f"eager must be True or False, got {eager!r}")
        reqs, new_tokens = self._validate(scheduled)
        query_lens = [len(t) for t in new_tokens]
        seq_lens = [r.num_computed_tokens + q for r, q in zip(reqs, query_lens)]
        for r, s in zip(reqs, seq_lens):
            self.reserve_blocks(r, s)
        num_reqs, num_tokens = len(reqs), sum(query_lens)
        desc = (
            BatchExecutionDescriptor(CUDAGraphMode.NONE, num_tokens, num_reqs)
            if eager
            else self.dispatcher.dispatch(num_reqs, num_tokens, self._uniform_token_count(reqs, query_lens))
        )
        graph = desc.cg_mode is not CUDAGraphMode.NONE
        num_tokens_padded = desc.num_tokens if graph else num_tokens
        num_reqs_padded = (desc.num_reqs or num_reqs) if graph else num_reqs

        input_batch, attn_metadata = prepare_inputs(
            reqs,
            query_lens,
            seq_lens,
            [t for ts in new_tokens for t in ts],
            self.input_buffers,
            self.block_tables,
            self.attn_groups,
            num_tokens_padded,
            num_reqs_padded,
        )
        return PreparedStep(desc, input_batch, attn_metadata, reqs, seq_lens)

    def _uniform_token_count(self, reqs: Sequence[RequestState], query_lens: Sequence[int]) -> int | None:
        computed, prefilling = [r.num_computed_tokens for r in reqs], [r.is_prefilling() for r in reqs]
        eligible = decode_graph_eligible(query_lens, computed, prefilling, self.compilation_config.uniform_decode_rule)
        return get_uniform_decode_token_count(query_lens, eligible)

    def execute(self, prepared: PreparedStep) -> torch.Tensor:
        """Replay ``prepared``'s FULL graph, or run the model under its forward context (NONE, PIECEWISE).
        Returns the padded output, which a graph overwrites at its next replay."""
        desc, batch = prepared.descriptor, prepared.input_batch
        manager = self.cudagraph_manager
        with torch.inference_mode():
            if desc.cg_mode is not CUDAGraphMode.NONE and manager is not None and manager.check_addresses:
                manager.check_reads(
                    desc, self._graph_reads(prepared.attn_metadata, batch.input_ids, batch.positions), self._source
                )
            if desc.cg_mode is CUDAGraphMode.FULL:
                assert manager is not None
                return manager.run_fullgraph(desc)
            with set_forward_context(prepared.attn_metadata, desc.cg_mode, desc):
                return self.forward_model(batch.input_ids, batch.positions)

    def _validate(self, scheduled: Mapping[str, Sequence[int]]) -> tuple[list[RequestState], list[list[int]]]:
        if not isinstance(scheduled, Mapping):
            raise ConfigError(f"step() takes a dict {{request_id: [token ids]}}, got {type(scheduled).__name__}")
        if not scheduled:
            raise ConfigError("the step schedules no request; pass {request_id: [token ids], ...}")
        if len(scheduled) > self.config.max_num_reqs:
            raise ConfigError(
                f"{len(scheduled)} requests in one step, but max_num_reqs is "
                f"{self.config.max_num_reqs}; schedule fewer or raise ToyConfig.max_num_reqs"
            )
        reqs, tokens = [], []
        for req_id, ids in scheduled.items():
            reqs.append(self._request(req_id))
            ids = parse_token_ids(req_id, ids)
            if not ids:
                raise ConfigError(f"request {req_id!r} has no new tokens in this step; give at least one")
            bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
            if bad:
                raise ConfigError(
                    f"token id {bad[0]} of request {req_id!r} is outside the vocabulary [0, {self.config.vocab_size})"
                )
            tokens.append(ids)
        total = sum(map(len, tokens))
        if total > self.config.max_num_batched_tokens:
            raise CapacityError(
                f"{total} tokens in one step, but max_num_batched_tokens is "
                f"{self.config.max_num_batched_tokens}; split the prompt over several steps "
                "or raise ToyConfig.max_num_batched_tokens"
            )
        return reqs, tokens

    def reserve_blocks(self, request: RequestState, seq_len: int) -> None:
        """Give ``request`` the blocks to hold ``seq_len`` tokens (a drafter reserves ahead of its drafts)."""
        if seq_len > self.config.max_model_len:
            raise CapacityError(
                f"request {request.req_id!r} would reach {seq_len} tokens, but max_model_len is "
                f"{self.config.max_model_len}; raise ToyConfig.max_model_len or stop it sooner"
            )
        needed = -(-seq_len // self.config.block_size) - len(request.block_ids)
        if needed > 0:
            request.block_ids += self.block_pool.allocate(needed)

    # ------------------------------------------------------------ inspection
    def state_tensors(self) -> dict[str, torch.Tensor]:
        return self.model.state_tensors()

    def close(self) -> None:
        """Release the graphs (and, on a GPU, their memory pool). Eager steps still work afterwards."""
        if self.cudagraph_manager is not None:
            self.cudagraph_manager.reset()
        for wrapper in self.piecewise_wrappers():
            wrapper.release()


def prepare_inputs(
    requests: Sequence[RequestState],
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    input_ids: Sequence[int] | None,
    input_buffers: InputBuffers,
    block_tables: BlockTables,
    attn_groups: Sequence[AttentionGroup],
    num_tokens_padded: int,
    num_reqs_padded: int,
) -> tuple[InputBatch, dict[str, Any]]:
    """Write one batch, padded, in place into the persistent buffers; build every layer's metadata."""
    input_batch = InputBatch.prepare(query_lens, seq_lens, input_ids, input_buffers, num_tokens_padded, num_reqs_padded)
    block_table = block_tables.write_block_tables([r.block_ids for r in requests], num_reqs_padded)
    bs = block_tables.block_size
    slots = [r.slot(p, bs) for r, q, s in zip(requests, query_lens, seq_lens) for p in range(s - q, s)]
    slot_mapping = block_tables.write_slot_mappings(slots, num_tokens_padded)
    return input_batch, prepare_attn(input_batch, block_table, slot_mapping, attn_groups, for_capture=False)


def parse_token_ids(req_id: str, ids: object) -> list[int]:
    """``ids`` as a list of ints; a float, a bool, a string or a bare int gets an error, not a silent cast."""
    try:
        if not isinstance(ids, (str, bytes, Mapping)) and not any(isinstance(t, bool) for t in ids):
            return [operator.index(t) for t in ids]  # a 0-d tensor, like an int, is not iterable
    except TypeError:
        pass
    raise ConfigError(
        f"request {req_id!r} must get a list of integer token ids, got {ids!r}; write {{{req_id!r}: [5]}} for one"
    )
