"""Persistent buffers and metadata builders: values right, storage reused."""

import pytest
import torch

from cglab import PAD_SLOT_ID, BlockTables, InputBatch, InputBuffers, ToyConfig, prepare_attn
from cglab.buffers import prepare_dcp_local_seq_lens
from cglab.metadata import AllocatingShortConvMetadataBuilder, build_attn_groups, token_requests_and_positions


def _setup(config):
    buffers = InputBuffers(config.max_num_reqs, config.max_num_tokens, torch.device("cpu"))
    tables = BlockTables(
        config.max_num_reqs, config.max_blocks_per_req, config.block_size, config.max_num_tokens, torch.device("cpu")
    )
    return buffers, tables, build_attn_groups(config, torch.device("cpu"))


def _step(config, buffers, tables, groups, query_lens, seq_lens, blocks, padded_tokens, padded_reqs):
    batch = InputBatch.prepare(query_lens, seq_lens, [1] * sum(query_lens), buffers, padded_tokens, padded_reqs)
    table = tables.write_block_tables(blocks, padded_reqs)
    bs = config.block_size
    slots = [
        blocks[r][p // bs] * bs + p % bs for r, (q, s) in enumerate(zip(query_lens, seq_lens)) for p in range(s - q, s)
    ]
    mapping = tables.write_slot_mappings(slots, padded_tokens)
    return prepare_attn(batch, table, mapping, groups), batch


def test_dummy_batch_splits_evenly_and_pads_slots():
    """8 tokens over 3 requests: 2 each, the 2 left over one each on the last two (model runner v2)."""
    config = ToyConfig()
    buffers, tables, _ = _setup(config)
    batch = InputBatch.make_dummy(3, 8, buffers)
    assert batch.query_start_loc.tolist() == [0, 2, 5, 8]
    assert batch.seq_lens.tolist() == [2, 3, 3]
    assert InputBatch.make_dummy(4, 11, buffers).seq_lens.tolist() == [2, 3, 3, 3]
    buffers.pre_49751_dummy_split = True  # the split before vLLM #49751: the whole remainder on the last request
    assert InputBatch.make_dummy(4, 11, buffers).seq_lens.tolist() == [2, 2, 2, 5]
    assert tables.get_dummy_slot_mappings(8).tolist() == [PAD_SLOT_ID] * 8


def test_padding_tail_and_padded_requests():
    config = ToyConfig()
    buffers, tables, groups = _setup(config)
    md, batch = _step(config, buffers, tables, groups, [1, 1, 1], [5, 9, 2], [[3, 4], [7, 8, 9], [1]], 4, 4)
    assert batch.query_start_loc.tolist() == [0, 1, 2, 3, 3]  # the padded request is empty
    assert batch.seq_lens.tolist() == [5, 9, 2, 0]
    attn = md["layers.1.attn"]
    assert attn.slot_mapping.tolist() == [4 * 4 + 0, 9 * 4 + 0, 1 * 4 + 1, PAD_SLOT_ID]
    req, pos = token_requests_and_positions(batch.query_start_loc, batch.seq_lens, 4)
    assert req[:3].tolist() == [0, 1, 2] and pos[:3].tolist() == [4, 8, 1]


def test_sconv_taps_and_compressor_groups():
    config = ToyConfig(sconv_kernel_size=3, compress_ratio=2, block_size=4)
    buffers, tables, groups = _setup(config)
    md, _ = _step(config, buffers, tables, groups, [1, 1], [4, 1], [[5], [6]], 2, 2)
    sconv = md["layers.0.sconv"]
    assert sconv.tap_slots.tolist() == [[21, 22], [PAD_SLOT_ID, PAD_SLOT_ID]]  # positions 1, 2 of block 5
    comp = md["layers.2.compressor"]
    assert comp.group_slots[0].tolist() == [22, 23]  # position 3 completes group (2, 3)
    assert comp.compress_slots.tolist() == [5 * 2 + 1, PAD_SLOT_ID]
    assert comp.visible_slots[0, :3].tolist() == [10, 11, PAD_SLOT_ID]


def test_builders_reuse_their_storage_every_step():
    config = ToyConfig()
    buffers, tables, groups = _setup(config)
    first, _ = _step(config, buffers, tables, groups, [1, 1], [3, 6], [[0], [1, 2]], 2, 2)
    second, _ = _step(config, buffers, tables, groups, [2], [9], [[4, 5, 6]], 2, 1)
    for name in first:
        for field in vars(first[name]):
            a, b = getattr(first[name], field), getattr(second[name], field)
            if isinstance(a, torch.Tensor):
                assert a.data_ptr() == b.data_ptr(), f"{name}.{field} moved"


def test_allocating_builder_breaks_storage_reuse():
    config = ToyConfig()
    buffers, tables, _ = _setup(config)
    groups = build_attn_groups(
        config, torch.device("cpu"), {"sconv": AllocatingShortConvMetadataBuilder(config, torch.device("cpu"))}
    )
    first, _ = _step(config, buffers, tables, groups, [1], [3], [[0]], 1, 1)
    keep = first["layers.0.sconv"].tap_slots
    second, _ = _step(config, buffers, tables, groups, [1], [4], [[0]], 1, 1)
    assert second["layers.0.sconv"].tap_slots.data_ptr() != keep.data_ptr()


def test_for_capture_sizes_attention_for_any_replay():
    config = ToyConfig()
    buffers, tables, groups = _setup(config)
    batch = InputBatch.make_dummy(2, 2, buffers)
    args = (batch, tables.get_dummy_block_tables(2), tables.get_dummy_slot_mappings(2), groups)
    assert prepare_attn(*args, for_capture=True)["layers.1.attn"].max_seq_len == config.max_model_len
    assert prepare_attn(*args, for_capture=False)["layers.1.attn"].max_seq_len == 1


def test_padding_rows_get_no_slot_in_any_stateful_builder():
    """A padded PIECEWISE step (one request, 1 token padded to 2): the padding row maps to the last
    request, one past its sequence, so only the real-token count keeps it from reading or writing."""
    config = ToyConfig()  # sconv kernel 4, compress ratio 4, block size 4
    buffers, tables, groups = _setup(config)
    md, _ = _step(config, buffers, tables, groups, [1], [10], [[5, 6, 7]], 2, 1)
    sconv, comp = md["layers.0.sconv"], md["layers.2.compressor"]
    assert sconv.tap_slots.tolist() == [[26, 27, 28], [PAD_SLOT_ID] * 3]  # positions 6, 7, 8; padding: none
    assert comp.compress_slots.tolist() == [PAD_SLOT_ID, PAD_SLOT_ID]  # position 9 completes no group
    assert comp.group_slots[1].tolist() == [PAD_SLOT_ID] * 4
    assert comp.visible_slots[0, :3].tolist() == [5, 6, PAD_SLOT_ID]  # the groups of blocks 5 and 6
    assert comp.visible_slots[1].tolist() == [PAD_SLOT_ID] * comp.visible_slots.shape[1]


def test_a_dummy_batch_completes_groups_but_emits_nothing():
    """One dummy request of 8 tokens (max_num_reqs 1): its 4th and 8th tokens complete compressor
    groups, but their slots are PAD_SLOT_ID, so no compressed entry may be written anywhere real."""
    config = ToyConfig(max_num_reqs=1)
    buffers, tables, groups = _setup(config)
    batch = InputBatch.make_dummy(1, 8, buffers)
    md = prepare_attn(batch, tables.get_dummy_block_tables(1), tables.get_dummy_slot_mappings(8), groups)
    comp = md["layers.2.compressor"]
    assert comp.compress_slots.tolist() == [PAD_SLOT_ID] * 8
    assert (comp.group_slots == PAD_SLOT_ID).all()
    assert md["layers.0.sconv"].slot_mapping.tolist() == [PAD_SLOT_ID] * 8  # and no conv input is stored


# Decode context parallel, counted by hand: with 2 ranks and cp_interleave 1, rank 0 holds tokens 0, 2, 4, ...
# and rank 1 tokens 1, 3, 5, ...; with cp_interleave 4, rank 0 holds 0-3, 8-11, ... and rank 1 4-7, 12-15, ...
DCP_SEQ_LENS = [1, 2, 5, 8, 10, 13]
DCP_TABLE = {  # (cp_interleave, rank) -> local lengths of DCP_SEQ_LENS
    (1, 0): [1, 1, 3, 4, 5, 7],
    (1, 1): [0, 1, 2, 4, 5, 6],
    (4, 0): [1, 2, 4, 4, 6, 8],
    (4, 1): [0, 0, 1, 4, 4, 5],
}


@pytest.mark.parametrize(("cp_interleave", "rank"), DCP_TABLE)
def test_dcp_local_seq_lens_match_a_hand_count(cp_interleave, rank):
    """vLLM's ``prepare_dcp_local_seq_lens``: the rows of the real requests get each rank's share, in the
    persistent buffer itself, and the rows past ``num_reqs`` get 0."""
    out = torch.full((8,), 99)
    storage = out.data_ptr()
    prepare_dcp_local_seq_lens(out, torch.tensor(DCP_SEQ_LENS + [7, 7]), len(DCP_SEQ_LENS), 2, rank, cp_interleave)
    assert out.tolist() == DCP_TABLE[cp_interleave, rank] + [0, 0]
    assert out.data_ptr() == storage
    # The hand count itself: every token is on exactly one rank.
    assert [a + b for a, b in zip(DCP_TABLE[cp_interleave, 0], DCP_TABLE[cp_interleave, 1])] == DCP_SEQ_LENS


@pytest.mark.parametrize("rank", [-1, 2])
def test_dcp_rank_outside_the_group_is_an_assertion(rank: int) -> None:
    """Rank 2 of 2 ranks would get a share of no rank (the lengths would not add up): below the boundary, an
    assertion says so."""
    with pytest.raises(AssertionError):
        prepare_dcp_local_seq_lens(torch.zeros(8, dtype=torch.long), torch.tensor(DCP_SEQ_LENS), 6, 2, rank)
