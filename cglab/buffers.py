"""Persistent input buffers and block tables (vLLM: ``vllm/v1/worker/gpu/{input_batch,block_table}.py``):
allocated once at their maximum size and written in place, since a graph keeps the addresses it read."""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Padded token rows get this slot: in-graph stateful kernels must not store them anywhere real.
# Every paged cache in cglab has one spare row at the end, and -1 indexes exactly that row, so a
# branch-free kernel writes padding there (a real kernel skips `slot < 0` rows instead).
PAD_SLOT_ID = -1


def write_padded(dst: torch.Tensor, values: Sequence[int] | torch.Tensor, fill: int, length: int) -> torch.Tensor:
    """Copy ``values`` into ``dst[:len(values)]``, fill up to ``length``, return the view ``dst[:length]``."""
    src = torch.as_tensor(values, dtype=dst.dtype)
    n = src.shape[0]
    dst[:n].copy_(src)
    dst[n:length].fill_(fill)
    return dst[:length]


def prepare_dcp_local_seq_lens(
    out: torch.Tensor, seq_lens: torch.Tensor, num_reqs: int, dcp_size: int, dcp_rank: int, cp_interleave: int = 1
) -> None:
    """Write into ``out`` each request's KV length on one decode context parallel (DCP) rank, 0 past
    ``num_reqs`` (vLLM: ``gpu/cp_utils.py``). DCP deals a request's tokens to ``dcp_size`` ranks in turn,
    ``cp_interleave`` at a time. Device arithmetic only, so a graph can record it; the toy runs one rank."""
    assert 0 <= dcp_rank < dcp_size
    per_round = dcp_size * cp_interleave
    lens = seq_lens[:num_reqs]
    last = (lens % per_round - dcp_rank * cp_interleave).clamp(0, cp_interleave)
    out[:num_reqs] = lens // per_round * cp_interleave + last
    out[num_reqs:] = 0


class InputBuffers:
    """Token ids, positions, query start locations and sequence lengths, allocated once."""

    def __init__(
        self, max_num_reqs: int, max_num_tokens: int, device: torch.device, pre_49751_dummy_split: bool = False
    ) -> None:
        self.pre_49751_dummy_split = pre_49751_dummy_split
        self.max_num_reqs = max_num_reqs
        self.max_num_tokens = max_num_tokens
        self.input_ids = torch.zeros(max_num_tokens, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_num_tokens, dtype=torch.long, device=device)
        self.query_start_loc = torch.zeros(max_num_reqs + 1, dtype=torch.long, device=device)
        self.seq_lens = torch.zeros(max_num_reqs, dtype=torch.long, device=device)

    def write(
        self,
        input_ids: Sequence[int] | None,
        positions: Sequence[int],
        query_start_loc: Sequence[int],
        seq_lens: Sequence[int],
        num_tokens_padded: int,
        num_reqs_padded: int,
    ) -> None:
        """Write one step in place (padding: id 0 at position 0, empty requests); ``input_ids=None``: keep the ids
        (a draft step writes them on the device)."""
        if input_ids is not None:
            write_padded(self.input_ids, input_ids, 0, num_tokens_padded)
        write_padded(self.positions, positions, 0, num_tokens_padded)
        # A padded request starts where the real tokens end and has no query tokens and no history.
        write_padded(self.query_start_loc, query_start_loc, query_start_loc[-1], num_reqs_padded + 1)
        write_padded(self.seq_lens, seq_lens, 0, num_reqs_padded)


class BlockTables:
    """The block table (request row -> physical blocks) and the slot mapping (token -> cache slot)."""

    def __init__(
        self, max_num_reqs: int, max_blocks_per_req: int, block_size: int, max_num_tokens: int, device: torch.device
    ) -> None:
        self.block_size = block_size
        self.block_table = torch.zeros(max_num_reqs, max_blocks_per_req, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_num_tokens,), PAD_SLOT_ID, dtype=torch.long, device=device)

    def get_dummy_block_tables(self, num_reqs: int) -> torch.Tensor:
        """Rows for a capture batch: block 0 everywhere, a valid address that dummy reads may touch."""
        self.block_table[:num_reqs].zero_()
        return self.block_table[:num_reqs]

    def get_dummy_slot_mappings(self, num_tokens: int) -> torch.Tensor:
        """All ``PAD_SLOT_ID``, so warmup and capture write nothing into any real cache slot."""
        self.slot_mapping[:num_tokens].fill_(PAD_SLOT_ID)
        return self.slot_mapping[:num_tokens]

    def write_block_tables(self, rows: Sequence[Sequence[int]], num_reqs_padded: int) -> torch.Tensor:
        """Write each request's block ids into its row (padded rows: block 0), in place."""
        width = self.block_table.shape[1]
        table = torch.zeros(num_reqs_padded, width, dtype=torch.long)
        for i, blocks in enumerate(rows):
            table[i, : len(blocks)] = torch.as_tensor(blocks, dtype=torch.long)
        self.block_table[:num_reqs_padded].copy_(table)
        return self.block_table[:num_reqs_padded]

    def write_slot_mappings(self, slots: Sequence[int], num_tokens_padded: int) -> torch.Tensor:
        """Write each real token's slot; the padded tail gets ``PAD_SLOT_ID``."""
        return write_padded(self.slot_mapping, slots, PAD_SLOT_ID, num_tokens_padded)
