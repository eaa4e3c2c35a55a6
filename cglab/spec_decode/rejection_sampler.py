"""Greedy verification of draft tokens (vLLM: ``spec_decode/rejection_sampler.py``, at temperature 0).

The target scores every request's last token and its K drafts in one step. Draft ``i`` is accepted
while it equals the target's own greedy choice at the row before it; the first mismatch ends the run,
and the target's choice there (or after the last draft, if all were accepted) is the next token. So
the tokens a request gains are exactly the ones greedy decoding of the target alone would produce: a
bad drafter can only lower how many arrive per step, never change them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def greedy_verify(
    target_logits: torch.Tensor, tokens: Sequence[Sequence[int]], num_drafts: Sequence[int]
) -> tuple[list[int], list[int]]:
    """Per request: the drafts the target accepts, and the token that follows them.

    ``target_logits``: the step's ``[num_tokens, vocab]``, requests in order; ``tokens``: each
    request's tokens in that step, its ``num_drafts`` drafts last (0 drafts: a prompt).
    """
    choices = target_logits.argmax(-1).tolist()  # one read by the host per step, outside any graph
    accepted, next_tokens, start = [], [], 0
    for toks, drafts in zip(tokens, num_drafts):
        first = start + len(toks) - drafts - 1  # the row of the last committed token: it predicts draft 1
        n = 0
        while n < drafts and toks[len(toks) - drafts + n] == choices[first + n]:
            n += 1
        accepted.append(n)
        next_tokens.append(choices[first + n])
        start += len(toks)
    return accepted, next_tokens
