"""``ToyTransformer``: a small seeded decoder built from a layer pattern such as ``"sconv,attn,compressor,attn"``."""

from __future__ import annotations

import torch
from torch import nn

from cglab.config import ToyConfig
from cglab.kernels.fused_linear import Linear
from cglab.layer_registry import get_layer_kind


class MLP(nn.Module):
    """Pre-norm gated MLP: stateless, so it only adds ordinary kernels to every segment."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(hidden)
        self.gate_up = Linear(hidden, 4 * hidden)
        self.down = Linear(2 * hidden, hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up(hidden, self.norm)
        return self.down(gate_up, act="silu_mul", residual=hidden)  # silu(gate) * up


class DecoderLayer(nn.Module):
    def __init__(self, config: ToyConfig, kind: str, layer_name: str) -> None:
        super().__init__()
        self.mixer: nn.Module = get_layer_kind(kind).make_layer(config, layer_name)  # built-in or registered
        self.mlp = MLP(config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.mixer(hidden))


def position_table(config: ToyConfig, rows_per_draw: int = 64) -> torch.Tensor:
    """``max_model_len`` position embeddings, drawn in blocks of equal shape from their own generator: row
    ``p`` depends on the seed alone, so a longer run (a larger table) keeps the same model."""
    gen = torch.Generator().manual_seed(config.seed)
    blocks = -(-config.max_model_len // rows_per_draw)
    table = [torch.randn(rows_per_draw, config.hidden_size, generator=gen) for _ in range(blocks)]
    return torch.cat(table)[: config.max_model_len]


class ToyTransformer(nn.Module):
    """Embeddings, one ``DecoderLayer`` per pattern entry, a norm and the LM head; weights depend only on ``config``."""

    def __init__(
        self, config: ToyConfig, device: str | torch.device = "cpu", return_hidden_states: bool = False
    ) -> None:
        super().__init__()
        self.config = config
        self.return_hidden_states = return_hidden_states
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
            self.embed_positions = nn.Embedding.from_pretrained(position_table(config), freeze=True)
            self.layers = nn.ModuleList(
                DecoderLayer(config, kind, name) for kind, name in zip(config.layers, config.layer_names)
            )
            self.norm = nn.RMSNorm(config.hidden_size)
            self.lm_head = Linear(config.hidden_size, config.vocab_size)
        self.requires_grad_(False)
        self.to(device=device, dtype=getattr(torch, config.dtype))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits ``[num_tokens, vocab]`` (``return_hidden_states``: ``[num_tokens, vocab + hidden]``: a drafter)."""
        hidden = self.embed_tokens(input_ids) + self.embed_positions(positions)
        for layer in self.layers:
            hidden = layer(hidden)
        logits = self.lm_head(hidden, self.norm)
        if self.return_hidden_states:
            return torch.cat([logits, hidden], dim=-1)
        return logits

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every cache and state tensor, keyed ``"layers.2.compressor.state_cache"``."""
        return {
            f"{layer.mixer.layer_name}.{key}": value
            for layer in self.layers
            for key, value in layer.mixer.state_tensors().items()
        }
