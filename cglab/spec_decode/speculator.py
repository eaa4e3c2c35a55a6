"""``AutoRegressiveSpeculator``: K draft tokens per request after every target step.

vLLM: ``vllm/v1/worker/gpu/spec_decode/autoregressive/speculator.py``. A proposal has two phases:

1. **draft prefill**, over the target's batch: the target's hidden states and its inputs shifted left
   by one, with the target's new token at each request's last accepted row. It has the target's batch
   shape and block tables, so it reuses the target's metadata. It yields the first draft.
2. **draft decode**, K - 1 steps of one token per request, each feeding the previous draft and the
   drafter's own hidden state back (EAGLE). Each step replays its own graph, as vLLM's fallback
   ``_multi_step_decode`` does; vLLM's default fuses the K - 1 steps in one FULL graph (#46849).

A FULL graph records the whole routine (model, picking the rows, argmax, writing the drafts); under
PIECEWISE only the model's pieces are graphs and the rest runs eagerly, as in vLLM.

Per-step values live in device tensors that the host writes between replays: the rows to sample
(``last_token_indices``) and the draft step (``current_draft_step``). ``frozen_step_index=True`` passes
the step as a Python int instead, which a graph freezes at capture: the toy's analogue of vLLM #48892,
where a multi-layer MTP drafter picks its layer with a Python ``spec_step_idx`` and a PIECEWISE capture
would keep layer 0 (why PIECEWISE was not enabled for it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from cglab.batch import BatchExecutionDescriptor, CudagraphDispatcher
from cglab.buffers import InputBuffers, write_padded
from cglab.compilation.wrapper import build_forward_model, piecewise_wrappers
from cglab.compilation_config import SpeculativeConfig
from cglab.config import CUDAGraphMode
from cglab.cudagraph_utils import graph_reads, tensor_source
from cglab.forward_context import set_forward_context
from cglab.metadata import build_attn_groups
from cglab.runner import ModelRunner, PreparedStep, prepare_inputs
from cglab.spec_decode.cudagraph_utils import SpeculatorCudaGraphManager
from cglab.spec_decode.draft_model import DraftModel

NONE, PIECEWISE, FULL = CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL


class AutoRegressiveSpeculator:
    """The drafter of one target ``ModelRunner`` (built with a ``SpeculativeConfig``, as ``SpecDecodeRunner``
    does): its model, buffers, builders and two graph sets, captured after the target's with the target's
    resolved ``compilation_config`` and graph backend (one memory pool)."""

    def __init__(self, target: ModelRunner, spec: SpeculativeConfig, seed: int, frozen_step_index: bool) -> None:
        config, cc = target.config, target.compilation_config
        self.target, self.compilation_config = target, cc
        self.num_speculative_tokens = k = spec.num_speculative_tokens
        self.frozen_step_index = frozen_step_index
        self.model = DraftModel(config, spec.draft_layers, target.model, seed)
        self.forward_model: Any = self.model
        device = target.device
        # Draft decode writes all its inputs here; draft prefill only ids and positions (its metadata
        # is the target's).
        self.input_buffers = InputBuffers(config.max_num_reqs, config.max_num_tokens, device, cc.pre_49751_dummy_split)
        # The hidden states the drafter reads: the target's (draft prefill), then its own (draft decode).
        self.hidden_states = torch.zeros(
            config.max_num_tokens, config.hidden_size, dtype=getattr(torch, config.dtype), device=device
        )
        self.vocab_size = config.vocab_size
        self.attn_groups = build_attn_groups(config, device, layers=self.model.layer_pairs)  # draft decode's own
        self.draft_tokens = torch.zeros(config.max_num_reqs, k, dtype=torch.long, device=device)
        self.last_token_indices = torch.zeros(config.max_num_reqs, dtype=torch.long, device=device)
        self.current_draft_step = torch.zeros((), dtype=torch.long, device=device)
        mode, sizes = cc.cudagraph_mode, cc.cudagraph_capture_sizes
        self.prefill_dispatcher = CudagraphDispatcher(mode, sizes, config.max_num_reqs, decode_query_len=k + 1)
        # Draft decode: FULL uniform-decode graphs where the target decodes in FULL, else eager (a PIECEWISE
        # draft decode is not supported).
        decode_mode = CUDAGraphMode.FULL_DECODE_ONLY if mode.decode_mode() is FULL else NONE
        self.decode_dispatcher = CudagraphDispatcher(decode_mode, sizes, config.max_num_reqs)
        self.prefill_manager: SpeculatorCudaGraphManager | None = None
        self.decode_manager: SpeculatorCudaGraphManager | None = None
        backend = target.graph_backend
        if backend is not None:  # one compilation config for both models, as in vLLM
            self.forward_model = build_forward_model(self.model, cc, backend)
            checks = (cc.check_addresses, not cc.use_breakable_cg)
            self.prefill_manager = SpeculatorCudaGraphManager(backend, self.prefill_dispatcher, *checks)
            self.decode_manager = SpeculatorCudaGraphManager(backend, self.decode_dispatcher, *checks)
            self.capture()

    # ------------------------------------------------------------ capture
    def capture(self) -> None:
        """Capture the draft prefill graphs (through the target's buffers and builders), then the draft
        decode graphs (through the drafter's own)."""
        assert self.prefill_manager is not None and self.decode_manager is not None
        target, cc = self.target, self.compilation_config
        # Indices left by earlier runs must not index out of range in the dummy batches.
        self.last_token_indices.zero_()
        self.prefill_manager.capture_routine(
            self._captured_prefill, target.input_buffers, target.block_tables, target.attn_groups, self._reads, cc
        )
        if self.num_speculative_tokens > 1:
            self.current_draft_step.fill_(1)  # warmup and capture run step 1, the first draft decode step
            self.decode_manager.capture_routine(
                self._captured_decode, self.input_buffers, target.block_tables, self.attn_groups, self._reads, cc
            )

    def _captured_prefill(self, desc: BatchExecutionDescriptor, num_reqs: int) -> torch.Tensor:
        out = self._run_model(desc.num_tokens)
        if desc.cg_mode is not FULL:  # PIECEWISE: only the model's pieces are graphs, sampling runs eagerly
            return out
        self._sample_prefill(out, num_reqs)
        return self.draft_tokens

    def _captured_decode(self, desc: BatchExecutionDescriptor, num_reqs: int) -> torch.Tensor:
        return self._decode(desc.num_tokens, step=1)

    def _reads(self, attn_metadata: Mapping[str, Any] | None) -> dict[str, torch.Tensor]:
        return graph_reads(
            attn_metadata,
            input_ids=self.input_buffers.input_ids,
            positions=self.input_buffers.positions,
            last_token_indices=self.last_token_indices,
            hidden_states=self.hidden_states,
            draft_tokens=self.draft_tokens,
            current_draft_step=self.current_draft_step,
            **self.model.state_tensors(),
        )

    def _source(self, name: str) -> str:
        groups = [*self.target.attn_groups, *self.attn_groups]
        return tensor_source(name, groups, self.model.state_tensors(), " (AutoRegressiveSpeculator buffers)")

    # ------------------------------------------------------------ the routines
    def _run_model(self, num_tokens: int) -> torch.Tensor:
        """``[num_tokens, vocab + hidden]``: logits, then hidden states (``DraftModel.forward``)."""
        return self.forward_model(
            self.input_buffers.input_ids[:num_tokens],
            self.input_buffers.positions[:num_tokens],
            self.hidden_states[:num_tokens],
        )

    def _sample_prefill(self, out: torch.Tensor, num_reqs: int) -> None:
        """Greedy first draft from each request's last accepted row; with that row's hidden state it is
        also draft decode's first input."""
        rows = out.index_select(0, self.last_token_indices[:num_reqs])
        self._feed_back(rows, num_reqs, lambda tokens: self.draft_tokens[:num_reqs, 0].copy_(tokens))

    def _decode(self, num_tokens: int, step: int) -> torch.Tensor:
        """One draft decode step: one token per request in, the next draft out (greedy)."""

        def write(tokens: torch.Tensor) -> None:
            if self.frozen_step_index:  # a Python int: a graph keeps the column it was captured with
                self.draft_tokens[:num_tokens, step] = tokens
            else:  # the column comes from a device tensor, read at every replay
                self.draft_tokens[:num_tokens].index_copy_(1, self.current_draft_step.view(1), tokens[:, None])

        self._feed_back(self._run_model(num_tokens), num_tokens, write)
        return self.draft_tokens

    def _feed_back(self, rows: torch.Tensor, num_reqs: int, write_drafts: Callable[[torch.Tensor], object]) -> None:
        """Write each request's draft, and make it and the row's hidden state the next step's inputs,
        on the device: the host never reads a draft until the last one is done."""
        tokens = rows[:, : self.vocab_size].argmax(-1)
        write_drafts(tokens)
        self.input_buffers.input_ids[:num_reqs] = tokens
        self.hidden_states[:num_reqs] = rows[:, self.vocab_size :]

    # ------------------------------------------------------------ proposing
    @torch.inference_mode()
    def propose(
        self,
        step: PreparedStep,
        target_output: torch.Tensor,
        tokens: Sequence[Sequence[int]],
        num_valid: Sequence[int],
        next_tokens: Sequence[int],
    ) -> tuple[list[list[int]], BatchExecutionDescriptor, list[BatchExecutionDescriptor]]:
        """``K`` drafts per request after the target ran ``step`` (``target_output``: its padded logits and
        hidden states) on ``tokens``, of which it kept ``num_valid`` and then produced ``next_tokens``; and
        how the draft prefill and each draft decode step ran."""
        batch = step.input_batch
        shifted, last_rows, start = [], [], 0
        for toks, valid, nxt in zip(tokens, num_valid, next_tokens):
            row = [*toks[1:], nxt]
            row[valid - 1] = nxt  # rows past it held rejected drafts: garbage the next steps overwrite
            shifted += row
            last_rows.append(start + valid - 1)
            start += len(toks)
        num_reqs, padded = len(tokens), batch.num_tokens_after_padding
        write_padded(self.input_buffers.input_ids, shifted, 0, padded)
        self.input_buffers.positions[:padded].copy_(batch.positions)  # the target's positions, on the device
        write_padded(self.last_token_indices, last_rows, 0, self.last_token_indices.shape[0])
        self.hidden_states[:padded].copy_(target_output[:padded, self.vocab_size :])
        # The draft prefill takes the target's descriptor: same policy, sizes and uniform_token_count.
        prefill = step.descriptor
        if prefill.cg_mode is not NONE:
            self._check_reads(self.prefill_manager, prefill, step.attn_metadata)
        if prefill.cg_mode is FULL:  # the graph samples too
            assert self.prefill_manager is not None
            self.prefill_manager.run_fullgraph(prefill)
        else:  # eagerly, or PIECEWISE: the model's wrappers replay, sampling runs eagerly
            with set_forward_context(step.attn_metadata, prefill.cg_mode, prefill):
                self._sample_prefill(
                    self._run_model(prefill.num_tokens if prefill.cg_mode is PIECEWISE else batch.num_tokens), num_reqs
                )
        last_positions = [seq - len(toks) + valid - 1 for seq, toks, valid in zip(step.seq_lens, tokens, num_valid)]
        decodes = [self._decode_step(step, last_positions, k) for k in range(1, self.num_speculative_tokens)]
        return self.draft_tokens[:num_reqs].tolist(), prefill, decodes

    def _decode_step(self, step: PreparedStep, last_positions: Sequence[int], k: int) -> BatchExecutionDescriptor:
        """Draft decode step ``k``: each request's row sits ``k`` positions after its last accepted one."""
        requests, num_reqs = step.requests, len(last_positions)
        seq_lens = [p + k + 1 for p in last_positions]
        for request, seq_len in zip(requests, seq_lens):
            self.target.reserve_blocks(request, seq_len)
        desc = self.decode_dispatcher.dispatch(num_reqs, num_reqs, uniform_token_count=1)
        graph = desc.cg_mode is not NONE
        num_padded = desc.num_tokens if graph else num_reqs
        _, attn_metadata = prepare_inputs(
            requests,
            [1] * num_reqs,
            seq_lens,
            None,
            self.input_buffers,
            self.target.block_tables,
            self.attn_groups,
            num_padded,
            (desc.num_reqs or num_reqs) if graph else num_reqs,
        )
        self.current_draft_step.fill_(k)
        if graph:  # FULL only: PIECEWISE graphs are not captured for draft decode
            assert self.decode_manager is not None
            self._check_reads(self.decode_manager, desc, attn_metadata)
            self.decode_manager.run_fullgraph(desc)
        else:
            with set_forward_context(attn_metadata, desc.cg_mode, desc):
                self._decode(num_reqs, k)
        return desc

    def _check_reads(
        self,
        manager: SpeculatorCudaGraphManager | None,
        desc: BatchExecutionDescriptor,
        attn_metadata: Mapping[str, Any],
    ) -> None:
        assert manager is not None
        if manager.check_addresses:
            manager.check_reads(desc, self._reads(attn_metadata), self._source)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return self.model.state_tensors()

    def close(self) -> None:
        for manager in (self.prefill_manager, self.decode_manager):
            if manager is not None:
                manager.reset()
        for wrapper in piecewise_wrappers(self.forward_model):
            wrapper.release()
