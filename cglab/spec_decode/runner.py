"""``SpecDecodeRunner``: a target ``ModelRunner`` plus its drafter, one speculative step at a time.

vLLM: the model runner with a speculator and a rejection sampler (``gpu/model_runner.py``). A step
verifies, for every scheduled request, its last token and the K drafts proposed at the previous step,
in one target forward of ``K + 1`` tokens per request; keeps the accepted drafts and the target's next
token; then asks the drafter for K new drafts. A request's first step carries its prompt instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from cglab.batch import BatchExecutionDescriptor
from cglab.compilation_config import CompilationConfig, SpeculativeConfig, draft_layer_pairs
from cglab.config import CUDAGraphMode, ToyConfig
from cglab.errors import ConfigError
from cglab.layer_registry import get_layer_kind
from cglab.runner import ModelRunner, parse_token_ids
from cglab.spec_decode.rejection_sampler import greedy_verify
from cglab.spec_decode.speculator import AutoRegressiveSpeculator

DEFAULT_DRAFT_LAYERS = "attn"  # after the fusion conv: the drafter is sconv (fusion), attn


@dataclass
class SpecStepOutput:
    logits: torch.Tensor  # the target's [num_tokens, vocab] (a copy)
    descriptor: BatchExecutionDescriptor  # how the target step ran
    num_drafts: list[int]  # drafts verified per request (0 in a request's prompt step)
    num_accepted: list[int]
    new_tokens: list[list[int]]  # what each request gained: its accepted drafts, then the target's next token
    draft_prefill: BatchExecutionDescriptor  # how the drafter's phases ran
    draft_decode: list[BatchExecutionDescriptor]


class SpecDecodeRunner:
    """Speculative decoding with greedy verification: the target ``ModelRunner`` gets ``compilation_config``
    and the drafter captures with the same settings. ``speculative_config``: K and the drafter's layers
    (``draft_layer_pairs``; none: ``DEFAULT_DRAFT_LAYERS``). As in vLLM's model runner v2, FULL uniform-decode
    graphs round the capture sizes up to multiples of ``K + 1``. ``frozen_step_index``: a toy analogue of
    vLLM #48892 (see ``AutoRegressiveSpeculator``)."""

    def __init__(
        self,
        config: ToyConfig,
        compilation_config: CompilationConfig | str | CUDAGraphMode,
        speculative_config: SpeculativeConfig,
        *,
        frozen_step_index: bool = False,
        device: str | torch.device = "cpu",
    ) -> None:
        spec, k = speculative_config, speculative_config.num_speculative_tokens
        if not spec.draft_layers:
            spec = dataclasses.replace(spec, draft_layers=draft_layer_pairs(DEFAULT_DRAFT_LAYERS))
        # A request holds at least one prompt token, then K + 1 tokens are verified at a time.
        if k + 2 > config.max_model_len or k + 1 > config.max_num_batched_tokens:
            raise ConfigError(
                f"num_speculative_tokens {k} does not fit: a verification step writes {k + 1} tokens "
                f"per request after its prompt, but max_model_len is {config.max_model_len} and "
                f"max_num_batched_tokens {config.max_num_batched_tokens}; use fewer speculative tokens"
            )
        # One recurrent state per request would absorb the drafts that verification rejects: the toy keeps
        # no earlier state to go back to.
        kinds = (*config.layers, *(kind for _, kind in spec.draft_layers))
        unsupported = [k for k in kinds if not get_layer_kind(k).spec_decode]
        if unsupported:
            raise ConfigError(
                f"speculative decoding does not support {unsupported[0]} layers (target or drafter): their one state "
                "per request would absorb the rejected drafts; use attn, sconv or compressor layers"
            )
        self.config = config
        self.target = ModelRunner(config, compilation_config, device=device, speculative_config=spec)
        # The draft layers' weights differ from the target's, as a real drafter's would.
        self.speculator = AutoRegressiveSpeculator(self.target, spec, config.seed + 1, frozen_step_index)
        self.prompts: dict[str, list[int]] = {}
        self.next_token: dict[str, int] = {}  # each request's latest token, not yet run through the target
        self.drafts: dict[str, list[int]] = {}  # the drafter's proposals for the tokens after it
        self.outputs: dict[str, list[int]] = {}  # every token a request generated, in order

    def add_request(self, req_id: str, prompt: Sequence[int]) -> None:
        """Admit a request; its first step carries the whole prompt."""
        tokens = parse_token_ids(req_id, prompt)
        if not tokens:
            raise ConfigError(f"request {req_id!r} needs a prompt of at least one token")
        self.target.add_request(req_id, num_prompt_tokens=len(tokens))
        self.prompts[req_id] = tokens
        self.outputs[req_id] = []

    def step(
        self, req_ids: Sequence[str], eager: bool = False, drafts: Mapping[str, Sequence[int]] | None = None
    ) -> SpecStepOutput:
        """One step for ``req_ids``: verify their drafts (or run their prompts), then draft again. ``drafts``
        replaces the runner's own proposals (an eager shadow verifies what a graph runner proposed);
        ``eager=True`` runs the target step eagerly (the draft prefill follows it; draft decode dispatches)."""
        if len(set(req_ids)) != len(req_ids):
            raise ConfigError(f"a step schedules each request once; {list(req_ids)} names one more than once")
        tokens, num_drafts = [], []
        for req_id in req_ids:
            if req_id in self.next_token:
                proposal = list((drafts or {}).get(req_id, self.drafts[req_id]))
                tokens.append([self.next_token[req_id], *proposal])
                num_drafts.append(len(proposal))
            else:
                tokens.append(self.prompts.get(req_id, []))
                num_drafts.append(0)
        prepared = self.target.prepare_step(dict(zip(req_ids, tokens)), eager)
        output = self.target.execute(prepared)  # rows: logits, then the hidden state the drafter reads
        logits = output[: prepared.num_tokens, : self.config.vocab_size].clone()
        accepted, next_tokens = greedy_verify(logits, tokens, num_drafts)
        num_valid = [len(t) - d + a for t, d, a in zip(tokens, num_drafts, accepted)]
        new_tokens = []
        for req_id, request, seq_len, toks, drafted, valid, nxt in zip(
            req_ids, prepared.requests, prepared.seq_lens, tokens, num_drafts, num_valid, next_tokens
        ):
            # Only the verified tokens count as computed: the rejected drafts' cache rows are
            # rewritten by the next step, which starts right after the last verified token.
            request.num_computed_tokens = seq_len - len(toks) + valid
            new_tokens.append([*toks[len(toks) - drafted : valid], nxt])
            self.outputs[req_id] += new_tokens[-1]
            self.next_token[req_id] = nxt
        proposals, prefill, decodes = self.speculator.propose(prepared, output, tokens, num_valid, next_tokens)
        for req_id, proposal in zip(req_ids, proposals):
            self.drafts[req_id] = proposal
        return SpecStepOutput(logits, prepared.descriptor, num_drafts, accepted, new_tokens, prefill, decodes)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The target's caches, then the drafter's."""
        return {**self.target.state_tensors(), **self.speculator.state_tensors()}

    def close(self) -> None:
        self.speculator.close()
        self.target.close()


def greedy_decode(runner: ModelRunner, req_id: str, prompt: Sequence[int], num_tokens: int) -> list[int]:
    """Plain greedy decoding on ``runner``, one token a step: the tokens speculative decoding with greedy
    verification must reproduce exactly."""
    runner.add_request(req_id)
    tokens = [int(runner.step({req_id: list(prompt)}).logits[-1].argmax())]
    while len(tokens) < num_tokens:
        tokens.append(int(runner.step({req_id: tokens[-1:]}).logits[-1].argmax()))
    return tokens
