"""Tests of model.sequence (spec/kv-vllm.md, SEQ-1..SEQ-11, HASH-1..HASH-5).

The ``test_<name>`` tests port the upstream unit tests of
lib/mocker/src/common/sequence.rs at a822423412a0 (same names, same
assertions); the rest check the model's own rules.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model.errors import InternalInvariantBroken, InvalidInput
from model.hashing import Plh, block_hashes, plh_fragment_bits, sequence_hashes, tokens_hash
from model.sequence import (
    Deref,
    FullBlock,
    PartialBlock,
    Promote,
    Use,
    commit_allocation,
    generate,
    new_sequence,
    pop,
    prepare_allocation,
    push,
    reset_with_signal,
    take_creation_signal,
)


def new_with_signal(tokens, max_out, bs, caching=True, key=1):
    """Upstream ``ActiveSequence::new_with_signal``: construct, then allocate everything."""
    seq = new_sequence(key, tokens, max_out, bs, caching, False)
    return take_creation_signal(seq)


def assert_single_partial_use(signal):
    assert isinstance(signal, Use)
    assert len(signal.blocks) == 1
    assert isinstance(signal.blocks[0], PartialBlock)
    assert signal.hashes == ()


def assert_promote_parent(signal, expected_parent):
    assert isinstance(signal, Promote)
    assert signal.parent_hash == expected_parent


def assert_use_signal(signal, blocks, hashes):
    assert isinstance(signal, Use)
    assert signal.blocks == tuple(blocks)
    assert signal.hashes == tuple(hashes)


def full_block_hashes_match(seq):
    """Upstream helper assert_cached_hashes_match_promoted_blocks."""
    n_full = sum(isinstance(b, FullBlock) for b in seq.unique_blocks)
    toks = [seq.token_at(i) for i in range(len(seq))]
    assert list(seq.block_hashes) == block_hashes(toks, seq.block_size)[:n_full]


# --------------------------------------------------------------------------
# Ports of lib/mocker/src/common/sequence.rs tests
# --------------------------------------------------------------------------


def test_validate_hash_constants():
    """HASH-1, HASH-2, HASH-3: upstream's own constants (lib/tokens/src/lib.rs:1897-1949 at the pin,
    ``test_validate_hash_constants``): the block hashes of [1,2,3,4], [5,6,7,8] and [9,10,11,12]
    with seed 1337 and the chained sequence hashes. The chain hash hashes the parent first, so these
    pin its byte order, which prefix matching alone cannot see."""
    h_1_4, h_5_8, h_9_12 = 14643705804678351452, 16777012769546811212, 483935686894639516
    assert [tokens_hash([1, 2, 3, 4]), tokens_hash([5, 6, 7, 8]), tokens_hash([9, 10, 11, 12])] == [
        h_1_4, h_5_8, h_9_12]
    assert block_hashes(list(range(1, 14)), 4) == [h_1_4, h_5_8, h_9_12]  # the 13th token is no block
    assert sequence_hashes([h_1_4, h_5_8, h_9_12]) == [h_1_4, 4945711292740353085, 12583592247330656132]


def test_new_with_signal_creates_initial_partial_block():
    # Rule: SEQ-5, SEQ-6
    seq, signal = new_with_signal(list(range(15)), 100, 16)
    assert seq.num_input_tokens == 15
    assert len(seq) == 15
    assert_single_partial_use(signal)


def test_push_across_block_boundary_promotes_and_allocates_partial():
    # Rule: SEQ-7
    seq, _ = new_with_signal(list(range(15)), 100, 16)
    seq, sig15 = push(seq, 15)
    assert sig15 == ()
    seq, sig16 = push(seq, 16)
    assert len(sig16) == 2
    assert_promote_parent(sig16[0], None)
    assert_single_partial_use(sig16[1])
    assert len(seq.unique_blocks) == 2
    assert len(seq) % seq.block_size == 1


def test_equivalent_histories_preserve_full_block_identity():
    # Rule: SEQ-4, SEQ-7, SEQ-11
    seq1, _ = new_with_signal(list(range(15)), 100, 16)
    seq1, _ = push(seq1, 15)
    seq1, _ = push(seq1, 16)
    seq2, _ = new_with_signal(list(range(16)), 100, 16, key=2)
    seq2, _ = push(seq2, 16)
    seq2 = pop(seq2)
    seq2, _ = push(seq2, 16)
    assert seq1.unique_blocks[0] == seq2.unique_blocks[0]
    # the trailing partial blocks belong to different requests
    assert seq1.unique_blocks[1] != seq2.unique_blocks[1]


def test_promote_uses_previous_full_block_as_parent():
    # Rule: SEQ-7, SEQ-11
    seq, _ = new_with_signal(list(range(15)), 100, 16)
    seq, _ = push(seq, 15)
    seq, _ = push(seq, 16)
    seq, _ = push(seq, 17)
    seq = pop(seq)
    seq = pop(seq)
    seq, _ = push(seq, 16)
    eq, _ = new_with_signal(list(range(16)), 100, 16, key=2)
    eq, _ = push(eq, 16)
    eq = pop(eq)
    eq, _ = push(eq, 16)
    for tok in range(17, 33):
        seq, _ = push(seq, tok)
        eq, _ = push(eq, tok)
    assert list(seq.unique_blocks[0:2]) == list(eq.unique_blocks[0:2])
    for tok in range(33, 48):
        seq, _ = push(seq, tok)
    seq, signal = push(seq, 48)
    assert signal
    expected = seq.unique_blocks[1]
    assert isinstance(expected, FullBlock)
    assert_promote_parent(signal[0], expected.seq_hash)
    assert_single_partial_use(signal[1])


def test_reset_with_signal_frees_blocks_and_resets_allocation():
    # rules: SEQ-9 (free signals) and SEQ-10
    # Rule: SEQ-10
    seq, _ = new_with_signal(list(range(15)), 100, 16)
    seq, _ = push(seq, 15)
    seq, _ = push(seq, 16)
    seq = commit_allocation(seq, len(seq))
    seq, free = reset_with_signal(seq)
    assert free
    assert seq.num_allocated_tokens == 0
    assert seq.generated_tokens == 2


def test_active_sequence_generate_signals():
    # Rule: SEQ-8
    seq, signal = new_with_signal(list(range(14)), 5, 16)
    assert_single_partial_use(signal)
    seq, _ = generate(seq)
    seq, first = generate(seq)
    assert first == ()
    seq, second = generate(seq)
    assert len(second) == 2
    assert_promote_parent(second[0], None)
    assert_single_partial_use(second[1])
    seq, third = generate(seq)
    assert third == ()
    seq, last = generate(seq)
    assert len(last) == 2
    assert isinstance(last[0], Deref) and isinstance(last[0].blocks[0], PartialBlock)
    assert isinstance(last[1], Deref) and isinstance(last[1].blocks[0], FullBlock)


def test_prepare_allocation_slices_full_and_partial_blocks():
    # Rule: SEQ-6
    seq = new_sequence(1, list(range(10)), 4, 4, True, False)
    assert_use_signal(prepare_allocation(seq, 4), seq.unique_blocks[0:1], seq.block_hashes[0:1])
    assert_use_signal(prepare_allocation(seq, 8), seq.unique_blocks[0:2], seq.block_hashes[0:2])
    assert_use_signal(prepare_allocation(seq, 10), seq.unique_blocks[0:3], seq.block_hashes[0:2])


def test_prepare_allocation_is_stable_until_commit():
    # Rule: SEQ-6
    seq = new_sequence(1, list(range(10)), 4, 4, True, False)
    assert prepare_allocation(seq, 4) == prepare_allocation(seq, 4)
    seq = commit_allocation(seq, 4)
    assert_use_signal(prepare_allocation(seq, 8), seq.unique_blocks[1:2], seq.block_hashes[1:2])


def test_block_hash_cache_stays_in_sync_after_promote_and_pop():
    # Rule: SEQ-7, SEQ-11
    seq, _ = new_with_signal(list(range(15)), 4, 16)
    full_block_hashes_match(seq)
    seq, _ = push(seq, 15)
    full_block_hashes_match(seq)
    seq, sigs = push(seq, 16)
    assert len(sigs) == 2
    full_block_hashes_match(seq)
    seq = pop(seq)
    full_block_hashes_match(seq)


# --------------------------------------------------------------------------
# Model rules
# --------------------------------------------------------------------------


def test_prompt_identities_follow_hash_rules():
    # Rule: SEQ-4, HASH-1, HASH-2, HASH-3, HASH-4
    prompt = [7] * 10 + list(range(20))
    seq = new_sequence(3, prompt, 1, 8)
    local = block_hashes(prompt, 8)
    chained = sequence_hashes(local)
    assert list(seq.block_hashes) == local
    assert [b.seq_hash for b in seq.unique_blocks[:3]] == chained
    assert seq.unique_blocks[3] == PartialBlock(3, 3)
    assert list(seq.plhs) == [Plh.new(chained[i], chained[i - 1] if i else None, i) for i in range(3)]
    assert local[0] == tokens_hash(prompt[:8])


def test_hash4_fragment_widths_and_packing():
    # Rule: HASH-4.  Widths by hand from upstream's bit_layout (tokens.rs): mode 0 keeps
    # 8 position bits and a 54-bit parent fragment below position 256, mode 1 16 and 46
    # below 65 536, mode 2 24 and 38 below 2^24; 2 + P + 64 + R = 128 in every mode.
    for pos, bits in ((0, 54), (255, 54), (256, 46), (65_535, 46), (65_536, 38), ((1 << 24) - 1, 38)):
        assert plh_fragment_bits(pos) == bits
        plh = Plh.new(0xFFFF_FFFF_FFFF_FFFF, (1 << 64) - 1, pos)
        assert plh.parent_fragment == (1 << bits) - 1
    # the mode choice has no upper bound (lib.rs:665-673): a child at 2^24 stores 38 bits too;
    # building a PLH there panics (test_hash4_positions_up_to_2_to_the_24)
    assert plh_fragment_bits(1 << 24) == 38
    # The packing [mode | position | current | parent fragment], by hand:
    # position 5 (mode 0): 5 << (64 + 54) | 0xABC << 54 | 0x123
    assert Plh.new(0xABC, 0x123, 5).as_u128() == (5 << 118) | (0xABC << 54) | 0x123
    # position 300 (mode 1): 1 << 126 | 300 << (64 + 46) | 0xABC << 46 | 0x123
    assert Plh.new(0xABC, 0x123, 300).as_u128() == (1 << 126) | (300 << 110) | (0xABC << 46) | 0x123
    # position 70 001 (mode 2, odd, so the position's lowest bit shows): 2 << 126 | ...
    assert Plh.new(0xABC, 0x123, 70_001).as_u128() == (2 << 126) | (70_001 << 102) | (0xABC << 38) | 0x123


def test_partial_block_is_named_by_its_index_at_block_size_2():
    # Rule: SEQ-5, SEQ-7.  A partial block is named (request key, block index); at block
    # size 2 a new token at length 2k + 1 opens block k (k + 1 would only be right for
    # larger block sizes by the floor's accident).
    seq, _ = new_with_signal([1, 2, 3], 4, 2, key=9)  # blocks [full 0, partial 1]
    assert seq.unique_blocks[-1] == PartialBlock(9, 1)
    seq, _ = push(seq)  # length 4: block 1 fills, no signal
    seq, signals = push(seq)  # length 5 = 2*2 + 1: block 2 opens
    assert seq.unique_blocks[-1] == PartialBlock(9, 2)
    assert signals[-1] == Use((PartialBlock(9, 2),))
    assert [b.index for b in seq.unique_blocks if isinstance(b, PartialBlock)] == [len(seq.unique_blocks) - 1]


def test_prompt_aligned_has_no_partial_block():
    # Rule: SEQ-5
    seq = new_sequence(1, list(range(8)), 2, 4)
    assert all(isinstance(b, FullBlock) for b in seq.unique_blocks)
    seq, sigs = generate(seq)
    # the new token opens a block: no Promote (the last unique block is full), one Use
    assert len(sigs) == 1 and isinstance(sigs[0], Use)


def test_generated_tokens_are_deterministic():
    # Rule: SEQ-2, HASH-5
    def run(key):
        seq = new_sequence(key, [1, 2, 3], 9, 4)
        out = []
        for _ in range(9):
            seq, sigs = generate(seq)
            out.append(sigs)
        return seq, out

    a1, s1 = run(5)
    a2, s2 = run(5)
    assert s1 == s2
    assert [a1.token_at(i) for i in range(len(a1))] == [a2.token_at(i) for i in range(len(a2))]
    b, _ = run(6)
    assert a1.unique_blocks[0] != b.unique_blocks[0]  # block 0 holds a generated token


def test_hash5_stand_ins_follow_their_formulas():
    """HASH-5 (a)-(c), SEQ-2: each stand-in is the spec's formula, computed here by hand with xxhash
    (seed 1337): a generated token is the low 32 bits of XXH3-64("T" + le_u128(k) + le_u64(p)); a
    block holding one hashes its u32 tokens then le_u128(k); private ids hash "F" / "P" + le_u128(k)
    + le_u64(i). A full block's tokens, taken in one batch (``block_tokens``), equal ``token_at``
    position by position, so the two code paths cannot drift apart."""
    import struct

    import xxhash

    from model.hashing import generated_block_hash, generated_token, generated_tokens, private_block_id

    k = (7 << 64) | 3
    kb = k.to_bytes(16, "little")

    def x(data):
        return xxhash.xxh3_64_intdigest(data, seed=1337)

    assert [generated_token(k, p) for p in (0, 5, 1 << 40)] == [
        x(b"T" + kb + struct.pack("<Q", p)) & 0xFFFFFFFF for p in (0, 5, 1 << 40)]
    assert generated_tokens(k, 3, 9) == [generated_token(k, p) for p in range(3, 9)]
    assert generated_block_hash([1, 2, 0xFFFFFFFF], k) == x(struct.pack("<3I", 1, 2, 0xFFFFFFFF) + kb)
    assert private_block_id(b"F", k, 4) == x(b"F" + kb + struct.pack("<Q", 4))
    assert private_block_id(b"P", k, 4) == x(b"P" + kb + struct.pack("<Q", 4))

    seq = new_sequence(k, [1, 2, 3], 9, 4)
    for _ in range(9):
        seq, _sigs = generate(seq)
    for index in range(len(seq) // 4):
        assert seq.block_tokens(index) == tuple(seq.token_at(i) for i in range(index * 4, index * 4 + 4))


def test_identical_prompts_diverge_at_first_generated_block():
    # Rule: SEQ-2: a block holding a generated token is private to its request
    prompt = list(range(8))
    a = new_sequence(10, prompt, 5, 4)
    b = new_sequence(11, prompt, 5, 4)
    for _ in range(5):
        a, _ = generate(a)
        b, _ = generate(b)
    assert list(a.unique_blocks[:2]) == list(b.unique_blocks[:2])  # prompt blocks shared
    assert a.unique_blocks[2] != b.unique_blocks[2]


def test_preempted_sequence_reproduces_its_own_blocks():
    # Rule: SEQ-10: tokens and unique blocks survive a reset
    seq = new_sequence(4, list(range(6)), 10, 4)
    for _ in range(5):
        seq, _ = generate(seq)
    seq = commit_allocation(seq, len(seq))
    before = seq.unique_blocks
    seq, derefs = reset_with_signal(seq)
    assert seq.unique_blocks == before
    assert [d.blocks[0] for d in derefs] == list(reversed(list(before)))
    use = prepare_allocation(seq, len(seq))
    assert use.blocks == tuple(before)
    assert use.parent is None


def test_prefix_caching_off_uses_private_ids():
    # Rule: SEQ-4, HASH-5c
    a = new_sequence(1, list(range(8)), 6, 4, enable_prefix_caching=False)
    b = new_sequence(2, list(range(8)), 6, 4, enable_prefix_caching=False)
    assert len(a.block_hashes) == len(b.block_hashes) == 0
    assert set(a.unique_blocks).isdisjoint(b.unique_blocks)
    assert all(p.parent_fragment == 0 for p in a.plhs)
    assert [p.position for p in a.plhs] == [0, 1]
    for _ in range(5):
        a, sigs = generate(a)
        for s in sigs:
            if isinstance(s, Promote):
                assert s.local_hash is None
                assert s.plh.position == 2 and s.plh.parent_fragment == 0


def test_emit_token_ids_only_with_prefix_caching():
    # Rule: SEQ-6
    seq = new_sequence(1, list(range(10)), 2, 4, True, True)
    assert prepare_allocation(seq, 10).token_ids == ((0, 1, 2, 3), (4, 5, 6, 7))
    off = new_sequence(1, list(range(10)), 2, 4, False, True)
    assert off.emit_token_ids is False
    assert prepare_allocation(off, 10).token_ids is None


def test_prepare_allocation_parent_and_none():
    # Rule: SEQ-6
    seq = new_sequence(1, list(range(10)), 2, 4)
    seq = commit_allocation(seq, 5)
    use = prepare_allocation(seq, 10)
    assert use.parent == seq.unique_blocks[1]
    assert use.blocks == (seq.unique_blocks[2],)
    assert prepare_allocation(seq, 8) is None


def test_guards():
    # Rule: SEQ-3, SEQ-8, SEQ-11
    with pytest.raises(InvalidInput):
        new_sequence(1, [1, 2], 1, 1)
    with pytest.raises(InvalidInput):
        new_sequence(1, [1 << 32], 1, 4)
    seq = new_sequence(1, [1, 2], 1, 4)
    with pytest.raises(InternalInvariantBroken):
        pop(seq)
    seq, _ = generate(seq)
    with pytest.raises(InternalInvariantBroken):
        generate(seq)


@settings(max_examples=60, deadline=None)
@given(
    prompt_len=st.integers(0, 20),
    bs=st.integers(2, 6),
    steps=st.lists(st.sampled_from(["gen", "pop", "reset"]), max_size=30),
)
def test_structure_invariants(prompt_len, bs, steps):
    # rules: SEQ-12
    # Rule: SEQ-1
    seq = new_sequence(9, list(range(prompt_len)), 40, bs)
    for step in steps:
        if step == "gen" and seq.generated_tokens < seq.max_output_tokens:
            seq, _ = generate(seq)
            seq = commit_allocation(seq, len(seq))
        elif step == "pop" and seq.generated_tokens and len(seq) % bs == 1:
            seq = pop(seq)  # only the upstream use: undo a block-opening token
        elif step == "reset":
            seq, _ = reset_with_signal(seq)
        n_full = sum(isinstance(b, FullBlock) for b in seq.unique_blocks)
        assert all(isinstance(b, FullBlock) for b in seq.unique_blocks[:n_full])
        assert len(seq.plhs) == n_full == len(seq.block_hashes)
        assert len(seq.unique_blocks) == -(-len(seq) // bs) == seq.current_known_blocks()
        assert seq.extra_tokens == len(seq) % bs
        toks = [seq.token_at(i) for i in range(len(seq))]
        assert [b.seq_hash for b in seq.unique_blocks[:n_full]] == sequence_hashes(
            [seq._block_local_hash(i) for i in range(n_full)]
        )
        assert n_full <= len(toks) // bs


def test_hash4_positions_up_to_2_to_the_24():
    """HASH-4: building a PLH at position 2^24 or more panics upstream with this text
    (lib/tokens/src/lib.rs:562-567; the compiled build gives it for a prompt of 2^24 + 1 blocks);
    the last position, 2^24 - 1, is keyed in the lineage index by the 38-bit fragment a child at
    2^24 would store, since upstream's mode choice has no upper bound (lib.rs:665-673)."""
    from model.errors import UpstreamPanic
    from model.hashing import Plh

    last = Plh.new(0xFFFF_FFFF_FFFF_FFFF, 7, 2**24 - 1)
    assert last.lineage_key() == (2**24 - 1, (1 << 38) - 1)
    with pytest.raises(UpstreamPanic) as info:
        Plh.new(1, 2, 2**24)
    assert info.value.message == "Position 16777216 exceeds maximum supported value (2^24 - 1 = 16,777,215)"
