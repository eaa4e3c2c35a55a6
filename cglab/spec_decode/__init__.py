"""Speculative decoding: a drafter with graphs of its own, captured like the target's.

vLLM: ``vllm/v1/worker/gpu/spec_decode/``. ``SpecDecodeRunner`` pairs a target ``ModelRunner`` with
an ``AutoRegressiveSpeculator`` (an EAGLE/MTP-style ``DraftModel``) and verifies drafts greedily, so
the tokens stay exactly the target's; ``run_spec_repro`` measures what a broken drafter costs:
acceptance, silently.
"""

from cglab.compilation_config import draft_layer_pairs
from cglab.spec_decode.rejection_sampler import greedy_verify
from cglab.spec_decode.repro import acceptance_rate, run_spec_repro, summarize_spec
from cglab.spec_decode.runner import DEFAULT_DRAFT_LAYERS, SpecDecodeRunner, greedy_decode

__all__ = [
    "DEFAULT_DRAFT_LAYERS",
    "SpecDecodeRunner",
    "acceptance_rate",
    "draft_layer_pairs",
    "greedy_decode",
    "greedy_verify",
    "run_spec_repro",
    "summarize_spec",
]
