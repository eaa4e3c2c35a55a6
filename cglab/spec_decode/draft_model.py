"""``DraftModel``: a small EAGLE-style drafter that proposes tokens for the target to verify.

vLLM: the draft models of ``vllm/v1/worker/gpu/spec_decode/`` (EAGLE heads, MTP modules). Like them, the
drafter shares the target's embeddings and LM head, reads the target's last hidden states, and has layers
of its own with their own paged caches, indexed through the target's block tables (one slot mapping).
EAGLE's input convention: the row at position ``p`` holds the target's hidden state at ``p`` and the token
at ``p + 1``, so a draft prefill has the target's batch shape and reuses its metadata; it proposes ``p + 2``.

How an untrained drafter can propose anything (the toy's construction): EAGLE learns to move the target's
state one token on. Here the first layer, a short conv over the rows' input embeddings (``cglab::short_conv``,
with its ``metadata is None`` guard inside the op), adds ``embed(token p+1) - embed(token p)`` to the
target's state, and the target's next token depends mostly on its token and position embeddings. The
subtraction reads the previous row from the conv's state cache: a conv that recorded its no-op (the bug)
adds the whole embedding instead, and the drafts stop agreeing with the target. Its decoder layers
(``layers``, default one attention layer) follow, then the target's norm and LM head.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cglab.compilation_config import FUSION_LAYER
from cglab.config import ToyConfig
from cglab.layers import short_conv
from cglab.model import DecoderLayer, ToyTransformer


class InputFusion(nn.Module):
    """Adds to the target's state what changed since the previous row: ``embed(p) - embed(p - 1)``,
    from a short conv whose taps are +1 on the current row and -1 on the one before."""

    def __init__(self, config: ToyConfig, layer_name: str) -> None:
        super().__init__()
        self.layer_name, self.strict = layer_name, config.strict_layers
        taps = torch.zeros(config.sconv_kernel_size, config.hidden_size)
        taps[-1], taps[-2] = 1.0, -1.0
        self.register_buffer("conv_weight", taps, persistent=False)
        # One row per cache slot, plus a spare last row that PAD_SLOT_ID (-1) writes land in.
        self.register_buffer("conv_state", torch.zeros(config.num_slots + 1, config.hidden_size), persistent=False)

    def forward(self, target_hidden: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        delta = torch.empty_like(embedded)
        short_conv(embedded, delta, self.conv_state, self.conv_weight, self.layer_name, self.strict)
        return target_hidden + delta

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"conv_state": self.conv_state[:-1]}


class DraftModel(nn.Module):
    """The target's embeddings and LM head around a fusion conv and decoder layers of its own.

    The embeddings and head are the target's very modules, not copies (EAGLE and MTP heads share
    them). ``layer_pairs``: ``draft_layer_pairs``'s; the decoder layers' weights are seeded by ``seed``.
    """

    def __init__(
        self, config: ToyConfig, layer_pairs: Sequence[tuple[str, str]], target: ToyTransformer, seed: int
    ) -> None:
        super().__init__()
        self.layer_pairs = layer_pairs
        self.max_position = config.max_model_len - 1
        self.embed_tokens, self.embed_positions = target.embed_tokens, target.embed_positions
        self.norm, self.lm_head = target.norm, target.lm_head
        device = target.lm_head.weight.device
        self.fusion = InputFusion(config, FUSION_LAYER)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.layers = nn.ModuleList(DecoderLayer(config, kind, name) for name, kind in self.layer_pairs[1:])
        for module in (self.fusion, self.layers):
            module.requires_grad_(False)
            module.to(device=device, dtype=getattr(torch, config.dtype))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, target_hidden: torch.Tensor) -> torch.Tensor:
        """``[num_tokens, vocab + hidden]``: each row's logits, proposing the token at ``positions + 2``,
        then its last hidden state (the next draft step's ``target_hidden``).

        A row holds the token at ``positions + 1``, so that is the position it embeds (clamped:
        padding rows may point anywhere).
        """
        token_positions = (positions + 1).clamp(max=self.max_position)
        hidden = self.fusion(target_hidden, self.embed_tokens(input_ids) + self.embed_positions(token_positions))
        for layer in self.layers:
            hidden = layer(hidden)
        return torch.cat([self.lm_head(self.norm(hidden)), hidden], dim=-1)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The drafter's caches, keyed ``"draft.layers.0.sconv.conv_state"``."""
        mixers = [self.fusion, *(layer.mixer for layer in self.layers)]
        return {f"{mixer.layer_name}.{key}": value for mixer in mixers for key, value in mixer.state_tensors().items()}
