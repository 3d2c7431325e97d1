"""Tests of model.vllm_kv (spec/kv-vllm.md, KV-1..KV-26).

``test_<name>`` tests port upstream unit tests at a822423412a0 (same names):
lib/mocker/src/kv_manager/kvbm_backend.rs, the lineage backend
(lib/kvbm-logical/src/pools/inactive/backends/lineage/{mod,eviction}.rs) and
the parts of lib/kvbm-logical/src/manager/tests.rs whose semantics the mocker
relies on.  The port table is at the end of spec/kv-vllm.md.  The stateful
Hypothesis machine at the bottom checks the pool invariants.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from model.errors import CommandRejected, InternalInvariantBroken
from model.hashing import Plh, chain_hash, tokens_hash
from model.kv_events import KvRemoved, KvStored, StoredBlock
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
    reset_with_signal,
    take_creation_signal,
)
from model.vllm_kv import (
    active_perc,
    _LineageTxn,
    LineageIndex,
    activate_destination,
    cancel_destination,
    check_invariants,
    get_prefill_cost,
    new_kv_manager,
    num_active_block_refs,
    num_active_blocks,
    num_inactive_blocks,
    process,
    process_decode_signal,
    refcount,
    release_decode_reservation,
    reserve_decode_blocks,
    reserve_destination,
)

# --------------------------------------------------------------------------
# helpers mirroring the upstream test helpers
# --------------------------------------------------------------------------


def make_mgr(capacity, block_size, capture=False):
    return new_kv_manager(capacity, block_size, publish_events=capture)


def plh(v):
    """Upstream ``plh(v)``: a root PLH with current hash ``v``."""
    return Plh.new(v, None, 0)


_LINEAGE = {
    0: (None, 0), 1: (0, 1), 2: (1, 2), 3: (2, 3), 4: (3, 4), 5: (1, 2), 6: (5, 3),
    7: (2, 3), 8: (7, 4), 9: (8, 5), 10: (None, 0), 11: (10, 1), 12: (11, 2), 13: (None, 0),
}


def lineage_plh(i):
    """Upstream ``lineage_plh(id)`` (kvbm_backend.rs:1736-1754)."""
    if i in _LINEAGE:
        parent, pos = _LINEAGE[i]
        return Plh.new(i, parent, pos)
    return plh(i)


def use_full(s, seq_hash, p):
    s, r = process(s, Use((FullBlock(seq_hash),), (), (p,)))
    return s, r.count


def use_partial(s, pid):
    s, r = process(s, Use((pid,)))
    return s, r.count


def deref_full(s, seq_hash):
    return process(s, Deref((FullBlock(seq_hash),)))[0]


def deref_partial(s, pid):
    return process(s, Deref((pid,)))[0]


def events_of(*results):
    out = []
    for r in results:
        out.extend(e.data for e in r.events)
    return out


def run(s, signals):
    """Apply signals in order; return (state, [event data])."""
    evs = []
    for sig in signals:
        s, r = process(s, sig)
        evs.extend(e.data for e in r.events)
    return s, evs


# --------------------------------------------------------------------------
# Ports of lib/mocker/src/kv_manager/kvbm_backend.rs tests
# --------------------------------------------------------------------------


def test_use_single_full_block():
    # rules: KV-7
    # Rule: KV-6
    s = make_mgr(10, 16)
    s, n = use_full(s, 1, plh(100))
    assert n == 1
    assert num_active_blocks(s) == 1


def test_prefill_cost_splits_active_and_inactive_cached_reuse():
    # Rule: KV-11
    # By hand: 8 prompt tokens in blocks of 4 are 2 blocks; the first one is cached, so
    # overlap = 1, new_blocks = 2 - 1 = 1, new_tokens = 8 - 4 = 4, cached_tokens = 4.  Held by a
    # running request it also counts as active (4 tokens); released, as inactive (0).
    s = make_mgr(10, 4)
    seq = new_sequence(1, range(8), 4, 4)
    h0 = seq.unique_blocks[0].seq_hash
    s, _ = use_full(s, h0, seq.plhs[0])
    held = get_prefill_cost(s, seq)
    assert (held.new_blocks, held.new_tokens, held.cached_tokens, held.active_cached_tokens) == (1, 4, 4, 4)
    released = get_prefill_cost(deref_full(s, h0), seq)
    assert (released.new_blocks, released.new_tokens, released.cached_tokens,
            released.active_cached_tokens) == (1, 4, 4, 0)


def test_use_rejects_short_token_ids_before_mutating_state():
    # Rule: KV-6
    s = make_mgr(10, 4, capture=True)
    bad = Use((FullBlock(1), FullBlock(2)), (101, 102), (plh(100), plh(200)), ((1, 2, 3, 4),))
    with pytest.raises(InternalInvariantBroken):
        process(s, bad)
    assert num_active_blocks(s) == 0
    assert len(s.active_full) == 0
    assert s.next_event_id == 0


def test_duplicate_use_bumps_refcount():
    # rules: KV-3
    # Rule: KV-6, KV-2
    s = make_mgr(10, 16)
    s, _ = use_full(s, 1, plh(100))
    s, _ = use_full(s, 1, plh(100))
    assert num_active_blocks(s) == 1
    assert num_active_block_refs(s) == 2


def test_capacity_exhaustion_returns_partial():
    # Rule: KV-6, KV-12
    s = make_mgr(4, 16)
    for i in range(4):
        s, n = use_full(s, i, plh(i + 100))
        assert n == 1
    s, n = use_full(s, 4, plh(500))
    assert n == 0


def test_deref_returns_to_inactive():
    # Rule: KV-9
    s = make_mgr(4, 16)
    s, _ = use_full(s, 1, plh(100))
    s = deref_full(s, 1)
    assert num_active_blocks(s) == 0


def test_inactive_reuse_via_match_blocks():
    # Rule: KV-5, KV-6 (InactiveHit is by PLH, not by the seq hash of the Use)
    s = make_mgr(10, 16)
    p = plh(100)
    s, _ = use_full(s, 1, p)
    s = deref_full(s, 1)
    s, n = use_full(s, 2, p)
    assert n == 1
    assert num_active_blocks(s) == 1 and refcount(s, 2) == 1


def test_failed_decode_reservation_preserves_inactive_cache():
    # Rule: KV-26, KV-12
    s = make_mgr(2, 16, capture=True)
    first, second = plh(100), plh(200)
    s, _ = use_full(s, 1, first)
    s, _ = use_full(s, 2, second)
    s = deref_full(s, 1)
    s = deref_full(s, 2)
    assert num_inactive_blocks(s) == 2
    s2, r = reserve_decode_blocks(s, 3)
    assert r.reservation is None and r.events == ()
    assert num_inactive_blocks(s2) == 2
    s2, n = use_full(s2, 3, first)
    assert n == 1
    s2, n = use_full(s2, 4, second)
    assert n == 1


def test_eviction_frees_inactive_for_new_allocation():
    # Rule: KV-12
    s = make_mgr(4, 16)
    for i in range(4):
        s, _ = use_full(s, i, plh(i + 100))
    for i in range(4):
        s = deref_full(s, i)
    for i in range(10, 14):
        s, n = use_full(s, i, plh(i + 1000))
        assert n == 1
    assert num_active_blocks(s) == 4


def test_promote_basic():
    # Rule: KV-10
    s = make_mgr(10, 16)
    u = PartialBlock(7, 0)
    s, _ = use_partial(s, u)
    s, _ = process(s, Promote(u, 42, None, 0, plh(500)))
    assert num_active_blocks(s) == 1
    assert len(s.active_partial) == 0
    assert 42 in s.active_full


def test_promote_nonexistent_panics():
    # Rule: KV-10
    s = make_mgr(10, 16)
    with pytest.raises(InternalInvariantBroken, match="Promote: partial block not found"):
        process(s, Promote(PartialBlock(7, 0), 42, None, 0, plh(500)))


def test_deref_partial_returns_to_reset():
    # Rule: KV-9
    s = make_mgr(10, 16)
    u = PartialBlock(7, 0)
    s, _ = use_partial(s, u)
    assert len(s.active_partial) == 1
    s = deref_partial(s, u)
    assert len(s.active_partial) == 0
    assert num_active_block_refs(s) == 0
    assert s.reset == 10


def test_prefill_cost_no_overlap():
    # Rule: KV-11
    s = make_mgr(10, 16)
    seq = new_sequence(1, range(35), 10, 16)
    cost = get_prefill_cost(s, seq)
    assert cost.new_blocks == len(seq.unique_blocks)
    assert cost.new_tokens == 35


def test_failure_on_max_capacity():
    # Rule: KV-6, KV-12
    def use_batch(s, ids):
        return process(s, Use(tuple(FullBlock(i) for i in ids), (), tuple(plh(i) for i in ids)))

    s = make_mgr(10, 16)
    s, r = use_batch(s, list(range(10)))
    assert r.count == 10
    assert num_active_blocks(s) == 10
    s, r = use_batch(s, [10])
    assert r.count == 0


def test_block_lifecycle_stringent():
    # Rule: KV-6, KV-9, KV-14..KV-17, KV-21, KV-22
    def use_blocks(s, ids):
        return process(s, Use(tuple(FullBlock(i) for i in ids), (), tuple(lineage_plh(i) for i in ids)))

    def deref_blocks(s, ids):
        s, r = process(s, Deref(tuple(FullBlock(i) for i in ids)))
        return s, r

    def assert_active(s, expected):
        assert num_active_blocks(s) == len(expected)
        assert num_active_block_refs(s) == sum(r for _, r in expected)
        for i, r in expected:
            assert refcount(s, i) == r

    def assert_inactive(s, ids):
        assert num_inactive_blocks(s) == len(ids)
        for i in ids:
            assert s.lineage.has(lineage_plh(i))
            assert i not in s.active_full

    def stored(ids, parent):
        return KvStored(parent, tuple(StoredBlock(i, 0) for i in ids))

    s = make_mgr(10, 16, capture=True)
    s, r = use_blocks(s, [0, 1, 2, 3, 4])
    assert r.count == 5
    assert events_of(r) == [stored([0, 1, 2, 3, 4], None)]
    s, r = use_blocks(s, [0, 1, 5, 6])
    assert r.count == 4
    assert events_of(r) == [stored([5, 6], 1)]
    assert_active(s, [(0, 2), (1, 2), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)])

    s, r = deref_blocks(s, [4, 3, 2, 1, 0])
    assert r.events == ()
    assert_active(s, [(0, 1), (1, 1), (5, 1), (6, 1)])
    assert_inactive(s, [2, 3, 4])

    s, r = deref_blocks(s, [6, 5, 1, 0])
    assert r.events == ()
    assert_active(s, [])
    assert_inactive(s, [0, 1, 2, 3, 4, 5, 6])

    s, r = use_blocks(s, [0, 1, 2, 7, 8, 9])
    assert r.count == 6
    assert events_of(r) == [stored([7, 8, 9], 2)]
    assert_active(s, [(0, 1), (1, 1), (2, 1), (7, 1), (8, 1), (9, 1)])
    assert_inactive(s, [3, 4, 5, 6])

    s, r = use_blocks(s, [10, 11, 12])
    assert r.count == 3
    assert events_of(r) == [stored([10, 11, 12], None), KvRemoved((4, 3, 6))]
    assert_active(s, [(i, 1) for i in (0, 1, 2, 7, 8, 9, 10, 11, 12)])
    assert_inactive(s, [5])

    s, r = use_blocks(s, [13])
    assert r.count == 1
    assert events_of(r) == [stored([13], None), KvRemoved((5,))]
    assert_active(s, [(i, 1) for i in (0, 1, 2, 7, 8, 9, 10, 11, 12, 13)])
    assert num_inactive_blocks(s) == 0
    assert s.next_event_id == 7  # 5 Stored + 2 Removed events, numbered 0..6
    check_invariants(s)


def test_chunked_prefill_parent_hash():
    # Rule: KV-21, SEQ-6
    seq = new_sequence(1, range(512), 100, 64)
    s = make_mgr(256, 64, capture=True)
    s, r1 = process(s, prepare_allocation(seq, 256))
    seq = commit_allocation(seq, 256)
    s, r2 = process(s, prepare_allocation(seq, 512))
    seq = commit_allocation(seq, 512)
    evs = events_of(r1, r2)
    assert len(evs) == 2
    assert evs[0].parent_hash is None
    assert evs[1].parent_hash == seq.unique_blocks[3].seq_hash


def test_repreempt_after_partial_recompute_only_frees_reallocated_blocks():
    # Rule: SEQ-8, SEQ-10, KV-9
    seq = new_sequence(1, range(6), 16, 4)
    s = make_mgr(16, 4)
    seq, sig = take_creation_signal(seq)
    s, r = process(s, sig)
    assert r.count == 2
    for _ in range(3):
        seq, sigs = generate(seq)
        s, _ = run(s, sigs)
        if seq.generated_tokens < seq.max_output_tokens:
            seq = commit_allocation(seq, len(seq))
    assert num_active_blocks(s) == 3
    seq, free = reset_with_signal(seq)
    s, _ = run(s, free)
    assert num_active_blocks(s) == 0
    s, r = process(s, prepare_allocation(seq, seq.num_input_tokens))
    assert r.count == 2
    seq = commit_allocation(seq, seq.num_input_tokens)
    assert num_active_blocks(s) == 2
    seq, free = reset_with_signal(seq)
    s, _ = run(s, free)
    assert num_active_blocks(s) == 0


def test_inactive_hit_does_not_republish_stored():
    # Rule: KV-21
    s = make_mgr(4, 16, capture=True)
    s, r1 = process(s, Use((FullBlock(1),), (), (plh(100),)))
    s, r2 = process(s, Deref((FullBlock(1),)))
    s, r3 = process(s, Use((FullBlock(1),), (), (plh(100),)))
    evs = events_of(r1, r2, r3)
    assert sum(isinstance(e, KvStored) for e in evs) == 1
    assert sum(isinstance(e, KvRemoved) for e in evs) == 0


def test_destination_activation_collision_reuses_canonical_block_and_offload_metadata():
    # Rule: KV-23, KV-24
    s = make_mgr(2, 4, capture=True)
    seq = new_sequence(1, [1, 2, 3, 4], 1, 4, True, True)
    s, r = reserve_destination(s, seq)
    res = r.reservation
    assert res is not None
    assert num_active_blocks(s) == 1
    signal = prepare_allocation(seq, seq.num_input_tokens)
    seq_hash = signal.blocks[0].seq_hash
    s, r = process(s, signal)
    assert r.count == 1
    assert num_active_blocks(s) == 2
    s, act = activate_destination(s, res)
    assert act.commits == ("Reused",)
    assert num_active_blocks(s) == 1
    assert act.events == ()
    assert s.shadow[signal.plhs[0]] == seq_hash
    assert refcount(s, seq_hash) == 2
    check_invariants(s)


def test_destination_transfer_footprint_uses_missing_physical_blocks():
    # rules: KV-23, KV-25 (cancel drops the prefix handles, then the slots)
    # Rule: KV-23
    s = make_mgr(16, 4, capture=True)
    cold = new_sequence(1, range(10), 1, 4, True, True)
    s, r = reserve_destination(s, cold)
    assert r.reservation.transferable_prompt_tokens(4) == 12
    s = cancel_destination(s, r.reservation)
    prefix = new_sequence(2, range(4), 1, 4, True, True)
    s, r = process(s, prepare_allocation(prefix, 4))
    assert r.count == 1
    s, r = reserve_destination(s, cold)
    assert r.reservation.transferable_prompt_tokens(4) == 8
    s = cancel_destination(s, r.reservation)
    aligned = new_sequence(3, range(20, 28), 1, 4, True, True)
    s, r = process(s, prepare_allocation(aligned, 8))
    assert r.count == 2
    s, r = reserve_destination(s, aligned)
    assert r.reservation.transferable_prompt_tokens(4) == 0
    check_invariants(s)


def test_destination_activation_splits_stores_across_reused_middle_block():
    # Rule: KV-24
    s = make_mgr(8, 4, capture=True)
    seq = new_sequence(1, range(12), 1, 4, True, True)
    s, r = reserve_destination(s, seq)
    signal = prepare_allocation(seq, 12)
    first, middle, last = (b.seq_hash for b in signal.blocks)
    s, _ = use_full(s, middle, signal.plhs[1])
    s, act = activate_destination(s, r.reservation)
    evs = events_of(act)
    assert len(evs) == 2
    assert [b.block_hash for b in evs[0].blocks] == [first]
    assert [b.block_hash for b in evs[1].blocks] == [last]
    assert evs[1].parent_hash == middle
    assert act.commits == ("Stored", "Reused", "Stored")


def test_destination_activation_validates_layout_before_committing_blocks():
    # Rule: KV-24.  Upstream drops the reservation while unwinding the panic;
    # the model raises before any change, so the reservation is still held.
    s = make_mgr(4, 4)
    seq = new_sequence(1, range(8), 1, 4)
    s, r = reserve_destination(s, seq)
    res = r.reservation
    bad = attrs.evolve(res, layout=Use((FullBlock(1), FullBlock(2)), (), (plh(1),)))
    s = attrs.evolve(s, destinations=s.destinations.set(res.reservation_id, bad))
    with pytest.raises(InternalInvariantBroken):
        activate_destination(s, res.reservation_id)
    assert len(s.active_full) == 0
    assert len(s.shadow) == 0
    assert num_active_blocks(s) == 2
    s = cancel_destination(s, res.reservation_id)
    assert num_active_blocks(s) == 0


def test_stored_suffix_anchors_to_last_reused_block():
    # rules: KV-8
    # Rule: KV-21
    s = make_mgr(8, 16, capture=True)
    s, _ = process(s, Use((FullBlock(10), FullBlock(11)), (), (plh(10), plh(11))))
    s = deref_full(s, 10)
    s = deref_full(s, 11)
    s, r = process(
        s, Use((FullBlock(10), FullBlock(11), FullBlock(12)), (), (plh(10), plh(11), plh(12)))
    )
    evs = events_of(r)
    assert evs == [KvStored(11, (StoredBlock(12, 0),))]


def test_shared_prefix_distinct_vs_refcount():
    # Rule: KV-2
    s = make_mgr(8, 16)
    s, _ = process(s, Use(tuple(FullBlock(i) for i in (10, 11, 12)), (), tuple(plh(i) for i in (10, 11, 12))))
    assert num_active_blocks(s) == 3 and num_active_block_refs(s) == 3
    s, _ = process(s, Use(tuple(FullBlock(i) for i in (10, 11, 13)), (), tuple(plh(i) for i in (10, 11, 13))))
    assert num_active_blocks(s) == 4
    assert num_active_block_refs(s) == 6
    assert active_perc(s) == 4 / 8  # distinct blocks over the pool, not references (6 / 8)


def test_random_plh_stable_across_preempt_retry():
    # Rule: SEQ-4, SEQ-10, KV-5
    seq = new_sequence(1, range(64), 100, 16, enable_prefix_caching=False)
    s = make_mgr(8, 16, capture=True)
    seq, sig = take_creation_signal(seq)
    s, r1 = process(s, sig)
    assert r1.count == 4 and num_active_blocks(s) == 4
    seq, free = reset_with_signal(seq)
    s, _ = run(s, free)
    assert num_active_blocks(s) == 0 and num_inactive_blocks(s) == 4
    seq, sig = take_creation_signal(seq)
    s, r2 = process(s, sig)
    assert r2.count == 4
    assert num_active_blocks(s) == 4 and num_inactive_blocks(s) == 0
    assert sum(isinstance(e, KvStored) for e in events_of(r1, r2)) == 1


def test_eviction_emits_exact_removed_event():
    # Rule: KV-22, KV-16
    s = make_mgr(2, 16, capture=True)
    s, _ = process(s, Use((FullBlock(10), FullBlock(11)), (), (plh(10), plh(11))))
    s = deref_full(s, 10)
    s = deref_full(s, 11)
    assert num_active_blocks(s) == 0 and num_inactive_blocks(s) == 2
    s, r = process(s, Use((FullBlock(12),), (), (plh(12),)))
    evs = events_of(r)
    removed = [h for e in evs if isinstance(e, KvRemoved) for h in e.block_hashes]
    # upstream accepts 10 or 11; under the Tick order 10 (released first) goes first
    assert removed == [10]
    assert sum(isinstance(e, KvStored) for e in evs) == 1
    assert isinstance(evs[0], KvStored) and isinstance(evs[1], KvRemoved)  # Stored first


# --------------------------------------------------------------------------
# Ports of the lineage backend tests (kvbm-logical)
# --------------------------------------------------------------------------


def create_chain(count, offset):
    """Upstream ``create_chain``: a chain of block-size-1 blocks ``offset..offset+count``."""
    out, parent = [], None
    for i, tok in enumerate(range(offset, offset + count)):
        local = tokens_hash([tok])
        seq = local if parent is None else chain_hash(parent, local)
        out.append(Plh.new(seq, parent, i))
        parent = seq
    return out


def lineage_insert(idx, plhs):
    t = _LineageTxn(idx)
    for p in plhs:
        t.insert(p)
    return t.finish()


def lineage_allocate(idx, n):
    t = _LineageTxn(idx)
    out = []
    for _ in range(n):
        p = t.evict_one()
        if p is None:
            break
        out.append(p)
    return t.finish(), out


def lineage_remove(idx, p):
    t = _LineageTxn(idx)
    ok = t.remove_plh(p)
    return t.finish(), ok


def test_leaf_insertion():
    # rules: KV-13
    # Rule: KV-14, KV-16
    (h1,) = create_chain(1, 1)
    idx = lineage_insert(LineageIndex(), [h1])
    assert idx.count == 1 and len(idx.leaves) == 1
    idx, got = lineage_allocate(idx, 1)
    assert got == [h1]
    assert idx.count == 0 and len(idx.nodes) == 0


def test_parent_child_insertion():
    # Rule: KV-14, KV-16
    h1, h2 = create_chain(2, 0)
    idx = lineage_insert(LineageIndex(), [h1])
    assert len(idx.leaves) == 1
    idx = lineage_insert(idx, [h2])
    assert idx.count == 2 and len(idx.leaves) == 1
    idx, got = lineage_allocate(idx, 1)
    assert got == [h2]
    assert len(idx.leaves) == 1
    idx, got = lineage_allocate(idx, 1)
    assert got == [h1]


def test_out_of_order_insertion():
    # Rule: KV-14 (ghost parent placeholder)
    h1, h2 = create_chain(2, 0)
    idx = lineage_insert(LineageIndex(), [h2])
    assert idx.count == 1 and len(idx.leaves) == 1
    idx = lineage_insert(idx, [h1])
    assert idx.count == 2 and len(idx.leaves) == 1
    idx, got = lineage_allocate(idx, 1)
    assert got == [h2]
    assert len(idx.leaves) == 1
    idx, got = lineage_allocate(idx, 1)
    assert got == [h1]


def test_branching():
    # Rule: KV-16
    idx = lineage_insert(LineageIndex(), create_chain(3, 0) + create_chain(3, 5000))
    assert idx.count == 6 and len(idx.leaves) == 2
    idx, got = lineage_allocate(idx, 1)
    assert len(got) == 1 and idx.count == 5 and len(idx.leaves) == 2


def test_interleaved_chains():
    # Rule: KV-16, KV-17 (a re-leafed node keeps its original tick)
    a, b = create_chain(2, 0)
    x, y = create_chain(2, 1000)
    idx = lineage_insert(LineageIndex(), [a, b, x, y])
    assert idx.count == 4 and len(idx.leaves) == 2
    idx, got = lineage_allocate(idx, 4)
    assert got == [b, a, y, x]


def test_remove_by_hash():
    # Rule: KV-15
    (h1,) = create_chain(1, 1)
    idx = lineage_insert(LineageIndex(), [h1])
    idx, ok = lineage_remove(idx, h1)
    assert ok and idx.count == 0 and len(idx.nodes) == 0


def test_deep_chain_cleanup_iterative():
    # Rule: KV-15 (pruning is iterative)
    depth = 1000
    chain = create_chain(depth, 0)
    idx = lineage_insert(LineageIndex(), chain)
    assert idx.count == depth and len(idx.leaves) == 1
    idx, _ = lineage_remove(idx, chain[-1])
    assert idx.count == depth - 1 and len(idx.leaves) == 1
    leaf = create_chain(101, 0)[100]
    idx = lineage_insert(LineageIndex(), [leaf])
    assert idx.count == 1
    idx, _ = lineage_remove(idx, leaf)
    assert idx.count == 0 and len(idx.nodes) == 0


def test_split_sequence_eviction():
    # Rule: KV-16
    idx = lineage_insert(LineageIndex(), create_chain(5, 0) + create_chain(5, 3000))
    assert idx.count == 10 and len(idx.leaves) == 2
    idx, _ = lineage_allocate(idx, 1)
    assert idx.count == 9
    idx, _ = lineage_allocate(idx, 1)
    assert idx.count == 8 and len(idx.leaves) == 2
    idx, _ = lineage_allocate(idx, 2)
    assert idx.count == 6 and len(idx.leaves) == 2


def test_lookup_rejects_same_position_fragment_but_different_full_hash():
    # Rule: KV-15 (lookups compare the full PLH, not only the node key)
    stored = Plh.new(0xAA, 0x11, 5)
    impostor = Plh.new(0xAA, 0x22, 5)
    assert stored.lineage_key() == impostor.lineage_key() and stored != impostor
    idx = lineage_insert(LineageIndex(), [stored])
    assert idx.has(stored) and not idx.has(impostor)
    idx2, ok = lineage_remove(idx, impostor)
    assert not ok and idx2.count == 1
    idx3, ok = lineage_remove(idx, stored)
    assert ok and idx3.count == 0 and len(idx3.nodes) == 0


def test_tick_re_leafed_node_keeps_original_position():
    # Rule: KV-17 (eviction.rs TickPolicy test, restated on the index)
    a, b = create_chain(2, 0)
    c = create_chain(1, 50)[0]
    d = create_chain(1, 60)[0]
    idx = lineage_insert(LineageIndex(), [a, c, d])  # ticks a0 c1 d2
    assert idx.leaf_order() == [a, c, d]
    idx = lineage_insert(idx, [b])  # a is demoted, b leaf with tick 3
    assert idx.leaf_order() == [c, d, b]
    idx, _ = lineage_remove(idx, b)  # a re-leafed with tick 0
    assert idx.leaf_order() == [a, c, d]
    idx, _ = lineage_remove(idx, a)
    idx = lineage_insert(idx, [a])  # re-inserted: new tick
    assert idx.leaf_order() == [c, d, a]


def test_duplicate_insertion_is_an_invariant_break():
    # Rule: KV-14
    (h,) = create_chain(1, 3)
    idx = lineage_insert(LineageIndex(), [h])
    with pytest.raises(InternalInvariantBroken):
        lineage_insert(idx, [h])


# --------------------------------------------------------------------------
# kvbm-logical manager semantics the mocker relies on (ported at signal level)
# --------------------------------------------------------------------------


def test_allocate_more_than_available():
    # Rule: KV-12 (all or nothing)
    s = make_mgr(5, 4)
    s2, r = reserve_decode_blocks(s, 10)
    assert r.reservation is None and s2 is s


def test_allocate_zero_blocks():
    # Rule: KV-12
    s = make_mgr(10, 4)
    s, r = reserve_decode_blocks(s, 0)
    assert r.reservation is not None and num_active_blocks(s) == 0


def test_registered_block_lifecycle():
    # Rule: KV-4, KV-5
    s = make_mgr(10, 4)
    s, _ = use_full(s, 1, plh(500))
    assert s.reset == 9 and num_inactive_blocks(s) == 0
    s, _ = use_full(s, 1, plh(500))  # another holder: still one slot
    assert num_active_blocks(s) == 1
    s = deref_full(s, 1)
    s = deref_full(s, 1)
    assert num_inactive_blocks(s) == 1 and s.reset == 9
    s, _ = use_full(s, 2, plh(500))  # re-match from the inactive pool
    assert num_inactive_blocks(s) == 0
    s = deref_full(s, 2)
    assert num_inactive_blocks(s) == 1


def test_full_capacity_eviction_cycle():
    # Rule: KV-12
    s = make_mgr(16, 4)
    ids = list(range(6000, 6016))
    s, r = process(s, Use(tuple(FullBlock(i) for i in ids), (), tuple(plh(i) for i in ids)))
    assert r.count == 16 and s.reset == 0
    s, _ = process(s, Deref(tuple(FullBlock(i) for i in ids)))
    assert num_inactive_blocks(s) == 16 and s.reset == 0
    s, r = reserve_decode_blocks(s, 16)
    assert num_inactive_blocks(s) == 0 and s.reset == 0
    s = release_decode_reservation(s, r.reservation)
    assert s.reset == 16 and num_inactive_blocks(s) == 0


def test_mutable_drops_go_to_reset_not_inactive():
    # Rule: KV-9 (a partial block is never cached)
    s = make_mgr(16, 4)
    for i in range(16):
        s, _ = use_partial(s, PartialBlock(1, i))
    assert s.reset == 0
    for i in range(16):
        s = deref_partial(s, PartialBlock(1, i))
    assert s.reset == 16 and num_inactive_blocks(s) == 0


def test_register_mutable_block_from_existing_reject_returns_block_to_reset_pool():
    # Rule: KV-10 (Reject duplicates: the promoted slot returns to reset)
    s = make_mgr(4, 4, capture=True)
    s, _ = use_full(s, 42, plh(42))
    u = PartialBlock(1, 0)
    s, _ = use_partial(s, u)
    assert num_active_blocks(s) == 2
    s, r = process(s, Promote(u, 42, None, 9, plh(42)))
    assert r.events == ()
    assert num_active_blocks(s) == 1 and s.reset == 3 and refcount(s, 42) == 2
    check_invariants(s)


# --------------------------------------------------------------------------
# Model rules beyond the upstream tests
# --------------------------------------------------------------------------


def test_events_disabled_do_not_advance_ids():
    # Rule: KV-20
    s = make_mgr(2, 4)
    s, r = use_full(s, 1, plh(1))
    assert s.next_event_id == 0


def test_promote_stored_event_payload():
    # Rule: KV-10, KV-21
    s = make_mgr(4, 4, capture=True)
    seq = new_sequence(1, [1, 2, 3], 3, 4, True, True)
    seq, sig = take_creation_signal(seq)
    s, _ = process(s, sig)
    seq, sigs = generate(seq)  # completes block 0 (no signal yet)
    assert sigs == ()
    seq, sigs = generate(seq)  # opens block 1: Promote + Use
    s, evs = run(s, sigs)
    toks = seq.block_tokens(0)
    local = seq._block_local_hash(0)
    assert evs == [KvStored(None, (StoredBlock(local, local),), (toks,))]


def test_eviction_prefers_generated_tail_over_shared_prompt():
    # rules: KV-18
    # Rule: KV-16 (release order makes the request tail the oldest leaf)
    s = make_mgr(6, 2)
    a = new_sequence(1, [1, 2, 3, 4], 3, 2)
    a, sig = take_creation_signal(a)
    s, _ = process(s, sig)
    for _ in range(3):
        a, sigs = generate(a)
        s, _ = run(s, sigs)
        if a.generated_tokens < a.max_output_tokens:
            a = commit_allocation(a, len(a))
    assert num_active_blocks(s) == 0 and num_inactive_blocks(s) == 3
    b = new_sequence(2, [9, 9, 9, 9, 9, 9, 9, 9, 9, 9], 1, 2)
    s, r = process(s, prepare_allocation(b, 10))
    assert r.count == 5
    # 3 reset slots, then 2 evictions: the generated block first, then prompt block 1
    assert not s.lineage.has(a.plhs[2]) and not s.lineage.has(a.plhs[1])
    assert s.lineage.has(a.plhs[0])


def test_reserve_failure_reinserts_prefix_with_new_ticks():
    # Rule: KV-23 (a failed probe is not a no-op)
    s = make_mgr(3, 2)
    x = new_sequence(1, [1, 2, 3, 4], 1, 2)
    x, sig = take_creation_signal(x)
    s, _ = process(s, sig)
    y = new_sequence(2, [7, 8], 1, 2)
    y, sig = take_creation_signal(y)
    s, _ = process(s, sig)
    x, free = reset_with_signal(x)
    s, _ = run(s, free)
    y, free = reset_with_signal(y)
    s, _ = run(s, free)
    assert s.lineage.leaf_order() == [x.plhs[1], y.plhs[0]]
    d = new_sequence(3, [1, 2, 3, 4, 5, 6, 7, 8], 1, 2)  # 2 cached blocks + 2 new > capacity
    s2, r = reserve_destination(s, d)
    assert r.reservation is None
    assert s2.lineage.leaf_order() == [y.plhs[0], x.plhs[1]]
    check_invariants(s2)


def test_unknown_reservation_is_rejected():
    # Rule: KV-23, KV-26
    s = make_mgr(2, 2)
    with pytest.raises(CommandRejected):
        activate_destination(s, 5)
    with pytest.raises(CommandRejected):
        cancel_destination(s, 5)


def test_decode_reservation_serves_use():
    # Rule: KV-26
    s = make_mgr(4, 2, capture=True)
    s, r = reserve_decode_blocks(s, 2)
    res = r.reservation
    s, p = process_decode_signal(s, Use((PartialBlock(1, 0),)), res)
    assert p.count == 1 and s.decode_reservations[res.reservation_id] == 1
    with pytest.raises(InternalInvariantBroken):
        process_decode_signal(s, Use((PartialBlock(1, 1), PartialBlock(1, 2))), res)
    s = release_decode_reservation(s, res)
    assert num_active_blocks(s) == 1
    check_invariants(s)


# --------------------------------------------------------------------------
# Cross-check against the compiled mocker (ai-dynamo-runtime 1.3.0.post1)
# --------------------------------------------------------------------------

_REF_CHILD = r"""
import json, sys
import dynamo._core as c
spec = json.loads(sys.argv[1])
args = c.MockEngineArgs.from_json(json.dumps(spec["args"]))
c.run_mocker_trace_replay([spec["trace"]], extra_engine_args=args, num_workers=1,
    trace_block_size=spec["tbs"], report_jsonl_path=spec["report"], router_mode="round_robin")
"""

#: (name, block_size, num_gpu_blocks, prefix caching, [(hash_ids, input_length, output_length)])
REF_SCENARIOS = [
    ("oldest_tail_first", 4, 8, True,
     [([1, 2, 3], 12, 1), ([4, 5, 6], 12, 1), ([7, 8, 9], 12, 1), ([1, 2, 3], 12, 1), ([4, 5, 6], 12, 1)]),
    ("generated_tail", 4, 7, True, [([1, 2], 8, 6), ([5, 6, 7], 12, 1), ([1, 2], 8, 1), ([5, 6, 7], 12, 2)]),
    ("branches", 4, 9, True,
     [([1, 2, 3], 10, 2), ([1, 2, 4], 11, 3), ([8, 9, 10, 11], 16, 1), ([1, 2, 3], 12, 1),
      ([1, 2, 4], 12, 1), ([1, 5], 8, 1)]),
    ("refresh", 4, 6, True,
     [([1, 2], 8, 1), ([3, 4], 8, 1), ([1, 2], 8, 1), ([5, 6, 7], 12, 1), ([1, 2], 8, 1), ([3, 4], 8, 1)]),
    ("no_caching", 4, 6, False, [([1, 2], 8, 1), ([1, 2], 8, 1)]),
]


def _ref_ttft(arrival, new_tokens, active, bs, n):
    """First-token time of a lone request (vllm-core notes §4.1-4.3; restated for this check)."""
    from fractions import Fraction

    def secs(ns):
        return float(ns // 10**9) + float(ns % 10**9) / 1e9

    def dur(ms):
        return round(Fraction(ms / 1000.0) * 1_000_000_000)

    t = float(new_tokens)
    pf = 0 if new_tokens == 0 else dur(max(4.209989e-07 * (t * t) + 1.518344e-02 * t + 1.650142e01, 0.0))
    u = float(active * bs) / float(n * bs)
    dc = dur(max(-25.74 * (u * u) + 54.01 * u + 5.74, 1.0))
    return (arrival + secs(pf) * 1000.0) + secs(dc) * 1000.0


def _model_sequential(reqs, bs, n, caching):
    """Drive the manager like the vLLM core does for requests that never overlap."""
    kv = new_kv_manager(n, bs)
    out = []
    for k, (hids, isl, osl) in enumerate(reqs):
        toks = [h for h in hids for _ in range(bs)][:isl]
        seq = new_sequence(k + 1, toks, osl, bs, caching)
        cost = get_prefill_cost(kv, seq)
        kv, r = process(kv, prepare_allocation(seq, len(seq)))
        seq = commit_allocation(seq, len(seq))
        out.append((cost.cached_tokens, num_active_blocks(kv)))
        while seq.generated_tokens < osl:
            seq, sigs = generate(seq)
            done = seq.generated_tokens >= osl
            imm = [x for x in sigs if not isinstance(x, Deref)]
            kv, _ = run(kv, imm)
            if done:
                kv, _ = run(kv, [x for x in sigs if isinstance(x, Deref)])
            elif imm:
                seq = commit_allocation(seq, len(seq))
    return out


@pytest.mark.reference
@pytest.mark.parametrize("name,bs,n,caching,reqs", REF_SCENARIOS, ids=[s[0] for s in REF_SCENARIOS])
def test_reference_cached_prefix_matches_compiled_mocker(tmp_path, name, bs, n, caching, reqs):
    # rules: KV-18, KV-19 (the prefix-caching-off scenario)
    # Rule: KV-11, KV-12, KV-16 -- the cached prefix each request finds (and so its
    # first-token time) depends on which blocks earlier requests left cached.
    import json
    import subprocess
    import sys

    pytest.importorskip("dynamo._core")
    trace, report = tmp_path / "t.jsonl", tmp_path / "r.jsonl"
    with open(trace, "w") as fh:
        for i, (hids, isl, osl) in enumerate(reqs):
            fh.write(json.dumps({"timestamp": i * 100_000.0, "input_length": isl,
                                 "output_length": osl, "hash_ids": hids}) + "\n")
    spec = {"args": {"block_size": bs, "num_gpu_blocks": n, "enable_prefix_caching": caching},
            "trace": str(trace), "report": str(report), "tbs": bs}
    subprocess.run([sys.executable, "-c", _REF_CHILD, json.dumps(spec)], check=True, timeout=120,
                   capture_output=True)
    rows = sorted((json.loads(x) for x in open(report)), key=lambda r: r["arrival_time_ms"])
    predicted = _model_sequential(reqs, bs, n, caching)
    assert len(rows) == len(reqs)
    for (hids, isl, _osl), (cached, active), row in zip(reqs, predicted, rows):
        # the reference time is consistent with exactly one cached count
        fits = [c for c in range(0, isl + 1, bs)
                if _ref_ttft(row["arrival_time_ms"], isl - c, active, bs, n) == row["first_token_ms"]]
        assert fits == [cached], (name, hids)


# --------------------------------------------------------------------------
# Stateful property test
# --------------------------------------------------------------------------

PREFIXES = [(1, 2), (1, 2, 3, 4), (5, 6, 7), (1, 2, 3), ()]


class KvMachine(RuleBasedStateMachine):
    """Random request lifecycles against a small pool.

    Each live request holds ``unique_blocks[:ceil(num_allocated / bs)]``; the
    machine checks the manager's refcounts against that ownership.
    """

    def __init__(self):
        super().__init__()
        self.state = None
        self.reqs = {}
        self.dests = {}
        self.decode = []
        self.next_key = 1

    @rule(n=st.integers(2, 8), caching=st.booleans())
    @precondition(lambda self: self.state is None)
    def init(self, n, caching):
        self.bs = 2
        self.caching = caching
        self.state = new_kv_manager(n, self.bs, publish_events=True)

    def _new_seq(self, prefix, tail, max_out):
        key = self.next_key
        self.next_key += 1
        return new_sequence(key, PREFIXES[prefix] + tuple(tail), max_out, self.bs, self.caching)

    @rule(prefix=st.integers(0, len(PREFIXES) - 1), tail=st.lists(st.integers(0, 3), max_size=3),
          max_out=st.integers(1, 5))
    @precondition(lambda self: self.state is not None and len(self.reqs) < 6)
    def submit(self, prefix, tail, max_out):
        seq = self._new_seq(prefix, tail, max_out)
        self.reqs[seq.request_key] = seq

    def _pick(self, data_idx, pool):
        keys = sorted(pool)
        return keys[data_idx % len(keys)]

    @rule(i=st.integers(0, 100), chunk=st.integers(1, 5))
    @precondition(lambda self: self.state is not None and self.reqs)
    def allocate(self, i, chunk):
        key = self._pick(i, self.reqs)
        seq = self.reqs[key]
        cost = get_prefill_cost(self.state, seq)
        assert 0 <= cost.active_cached_tokens <= cost.cached_tokens <= seq.num_input_tokens
        target = min(seq.num_allocated_tokens + chunk, len(seq))
        sig = prepare_allocation(seq, target)
        if sig is None:
            self.reqs[key] = commit_allocation(seq, max(target, seq.num_allocated_tokens))
            return
        self.state, r = process(self.state, sig)
        if r.count == len(sig.blocks):
            committed = target
        else:
            prev = min(-(-seq.num_allocated_tokens // self.bs), len(seq.unique_blocks))
            committed = (prev + r.count) * self.bs
        self.reqs[key] = commit_allocation(seq, min(committed, target))

    @rule(i=st.integers(0, 100))
    @precondition(lambda self: self.state is not None and any(
        s.num_allocated_tokens >= len(s) and s.generated_tokens < s.max_output_tokens
        for s in self.reqs.values()))
    def decode_step(self, i):
        ready = {k: s for k, s in self.reqs.items()
                 if s.num_allocated_tokens >= len(s) and s.generated_tokens < s.max_output_tokens}
        key = self._pick(i, ready)
        seq, sigs = generate(ready[key])
        done = seq.generated_tokens >= seq.max_output_tokens
        immediate = [x for x in sigs if not isinstance(x, Deref)] if done else list(sigs)
        cleanup = [x for x in sigs if isinstance(x, Deref)] if done else []
        st_ = self.state
        for x in immediate:
            st_, r = process(st_, x)
            if r.count == 0:
                self.state = st_  # an applied Promote stays applied
                self.reqs[key] = pop(seq)
                return
        if done:
            st_, _ = run(st_, cleanup)
            del self.reqs[key]
        else:
            self.reqs[key] = commit_allocation(seq, len(seq)) if immediate else seq
        self.state = st_

    @rule(i=st.integers(0, 100))
    @precondition(lambda self: self.state is not None and self.reqs)
    def preempt(self, i):
        key = self._pick(i, self.reqs)
        seq, free = reset_with_signal(self.reqs[key])
        self.state, _ = run(self.state, free)
        self.reqs[key] = seq

    @rule(prefix=st.integers(0, len(PREFIXES) - 1), tail=st.lists(st.integers(0, 3), max_size=2))
    @precondition(lambda self: self.state is not None and len(self.dests) < 3)
    def reserve(self, prefix, tail):
        seq = self._new_seq(prefix, tail, 2)
        self.state, r = reserve_destination(self.state, seq)
        if r.reservation is not None:
            self.dests[r.reservation.reservation_id] = seq

    @rule(i=st.integers(0, 100), activate=st.booleans())
    @precondition(lambda self: self.state is not None and self.dests)
    def finish_reservation(self, i, activate):
        rid = self._pick(i, self.dests)
        seq = self.dests.pop(rid)
        if activate:
            self.state, _ = activate_destination(self.state, rid)
            self.reqs[seq.request_key] = commit_allocation(seq, seq.num_input_tokens)
        else:
            self.state = cancel_destination(self.state, rid)

    @rule(k=st.integers(0, 3))
    @precondition(lambda self: self.state is not None and not self.decode)
    def reserve_decode(self, k):
        self.state, r = reserve_decode_blocks(self.state, k)
        if r.reservation is not None:
            self.decode.append(r.reservation)

    @rule()
    @precondition(lambda self: self.state is not None and self.decode)
    def release_decode(self):
        self.state = release_decode_reservation(self.state, self.decode.pop())

    @rule(seq_hash=st.integers(0, 3), partial=st.booleans())
    @precondition(lambda self: self.state is not None)
    def rejected_deref(self, seq_hash, partial):
        before = self.state
        block = PartialBlock(0, seq_hash) if partial else FullBlock(seq_hash)
        with pytest.raises(InternalInvariantBroken):
            process(before, Deref((block,)))
        with pytest.raises(InternalInvariantBroken):
            process(before, Promote(PartialBlock(0, seq_hash), seq_hash, None, None, plh(seq_hash)))
        with pytest.raises(CommandRejected):
            cancel_destination(before, 10_000 + seq_hash)
        assert self.state is before
        check_invariants(before)

    @invariant()
    def pools_are_consistent(self):
        if self.state is None:
            return
        s = self.state
        check_invariants(s)
        assert s.reset + num_inactive_blocks(s) + num_active_blocks(s) == s.num_blocks
        # ownership: every live request holds its allocated prefix once
        expect: dict = {}
        partials = set()
        for seq in self.reqs.values():
            n = min(-(-seq.num_allocated_tokens // self.bs), len(seq.unique_blocks))
            for b in seq.unique_blocks[:n]:
                if isinstance(b, FullBlock):
                    expect[b.seq_hash] = expect.get(b.seq_hash, 0) + 1
                else:
                    partials.add(b)
        assert {h: len(v) for h, v in s.active_full.items()} == expect
        assert set(s.active_partial.keys()) == partials
        held = {p for v in s.active_full.values() for p in v}
        held |= {p for r in s.destinations.values() for _h, p in r.prefix}
        mutable = len(partials) + sum(r.unpublished for r in s.destinations.values())
        mutable += sum(s.decode_reservations.values())
        assert num_active_blocks(s) == len(held) + mutable


TestKvMachine = KvMachine.TestCase
TestKvMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def _leftist_ok(node) -> int:
    """The size of a well-formed leftist heap (KV-16's eviction index), or an AssertionError: each
    node's rank is one more than its right child's, the left rank is never smaller than the right,
    and no child holds a smaller tick than its parent."""
    if node is None:
        return 0
    rank, tick, _key, left, right = node
    rl, rr = (left[0] if left else 0), (right[0] if right else 0)
    assert rank == rr + 1 and rl >= rr, node
    assert all(child is None or child[1] >= tick for child in (left, right))
    return 1 + _leftist_ok(left) + _leftist_ok(right)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=40), st.lists(st.integers(0, 50), max_size=40))
def test_eviction_heap_stays_leftist_and_pops_in_tick_order(built, pushed):
    """KV-16's index is a persistent leftist min-heap: built in one go or pushed one by one, it
    stays leftist (so a pop walks a logarithmic spine) and pops ticks in ascending order.  A
    wrong rank would keep the order and lose only the balance, which no behaviour test sees."""
    from model.vllm_kv import _heap_build, _heap_merge, _heap_push

    heap = _heap_build((t, ("k", i)) for i, t in enumerate(built))
    for i, t in enumerate(pushed):
        heap = _heap_push(heap, t, ("p", i))
        _leftist_ok(heap)
    assert _leftist_ok(heap) == len(built) + len(pushed)
    popped = []
    while heap is not None:
        popped.append(heap[1])
        heap = _heap_merge(heap[3], heap[4])
        _leftist_ok(heap)
    assert popped == sorted(built + pushed)


@pytest.mark.parametrize("block_size, text", [
    (12, "block_size must be a power of 2, got 12"),
    (3, "block_size must be a power of 2, got 3"),
    (2048, "block_size must be between 1 and 1024, got 2048"),
    (1536, "block_size must be between 1 and 1024, got 1536"),  # the range is asserted first
    (0, "block_size must be between 1 and 1024, got 0"),
])
def test_kv1_block_size_is_a_power_of_two_up_to_1024(block_size, text):
    """KV-1: the block manager's builder asserts 1 <= bs <= 1024, then a power of two (upstream
    panics; texts recorded from the compiled build for 12 and 2048); 1, 2 and 1024 are fine."""
    from model.errors import InvalidInput

    with pytest.raises(InvalidInput) as info:
        new_kv_manager(8, block_size)
    assert info.value.field == "block_size" and info.value.reason == text and info.value.rule == "KV-1"
    for ok in (1, 2, 1024):
        assert new_kv_manager(8, ok).block_size == ok


def test_kv1_a_pool_past_the_eviction_index_reservation_is_a_capacity_overflow():
    """KV-1: the eviction index reserves one 16-byte entry per block, so 2^59 blocks panic with
    "capacity overflow" in the compiled build; the model refuses them with that text (the check
    comes after the block size's)."""
    from model.errors import InvalidInput

    with pytest.raises(InvalidInput) as info:
        new_kv_manager(2**59, 16)
    assert (info.value.field, info.value.reason) == ("num_gpu_blocks", "capacity overflow")
    with pytest.raises(InvalidInput, match="power of 2"):
        new_kv_manager(2**59, 12)
    assert new_kv_manager(2**59 - 1, 16).num_blocks == 2**59 - 1
