"""SGLang KV manager (spec/kv-sglang.md, SGKV-*).

Block 1 ports every test of upstream lib/mocker/src/kv_manager/sglang_backend.rs
at a822423412a0 under the same name (expected values from those tests).
Block 2 pins rules and quirks with hand-derived values.  Block 3 is a
Hypothesis state machine over random request, pin, eviction and destination
flows on small pools.
"""

from __future__ import annotations

from collections import Counter

import attrs
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from model.errors import InternalInvariantBroken, ModelError
from model.hashing import chain_hash, sequence_hashes, tokens_hash
from model.kv_events import KvRemoved, KvStored
from model import radix_cache as rc
from model.sglang_kv import (
    activate_destination,
    allocate_after_prefix,
    allocate_for_request,
    cache_finished_req,
    cache_unfinished_req,
    cancel_destination,
    evict,
    free_indices,
    free_request,
    local_block_hashes,
    new_kv_manager,
    release_decode_reservation,
    reserve_decode_tokens,
    reserve_destination,
    set_publish_events,
)


def stored(events):
    return [e.data for e in events if isinstance(e.data, KvStored)]


def removed(events):
    return [e.data for e in events if isinstance(e.data, KvRemoved)]


def raw_allocate(mgr, n):
    """Upstream tests' ``cache_mut().token_pool.allocate(n)``."""
    cache, slots = rc.allocate_slots(mgr.cache, n)
    return attrs.evolve(mgr, cache=cache), slots


class RouterOracle:
    """Stand-in for upstream's RouterIndexerHarness: the set of advertised hashes.

    ``overlap`` counts the leading query hashes the router would still find.
    """

    def __init__(self):
        self.live = set()

    def apply(self, events):
        for e in events:
            if isinstance(e.data, KvStored):
                self.live.update(b.block_hash for b in e.data.blocks)
            else:
                self.live.difference_update(e.data.block_hashes)

    def overlap(self, hashes):
        n = 0
        for h in hashes:
            if h not in self.live:
                break
            n += 1
        return n


# ---------------------------------------------------------------------------
# Block 1: ports of upstream tests (sglang_backend.rs)
# ---------------------------------------------------------------------------


def test_allocate_cache_miss():
    """Upstream sglang_backend.rs:631-639.  Rule: SGKV-6."""
    mgr = new_kv_manager(100, 1)
    mgr, r = allocate_for_request(mgr, [1, 2, 3, 4, 5])
    assert r.value.prefix_len == 0
    assert len(r.value.kv_indices) == 5
    assert mgr.available_tokens == 95


def test_allocate_cache_hit():
    """Upstream sglang_backend.rs:641-655.  Rules: SGKV-6, SGKV-8."""
    mgr = new_kv_manager(100, 1)
    mgr, r1 = allocate_for_request(mgr, [1, 2, 3, 4, 5])
    assert len(r1.value.kv_indices) == 5
    mgr, _ = cache_finished_req(mgr, [1, 2, 3, 4, 5], r1.value.kv_indices, r1.value.last_node, 0)
    mgr, r2 = allocate_for_request(mgr, [1, 2, 3, 4, 5, 6, 7])
    assert r2.value.prefix_len == 5
    assert len(r2.value.kv_indices) == 7
    assert mgr.available_tokens == 93


def test_destination_transfer_footprint_uses_missing_physical_pages():
    """Upstream sglang_backend.rs:657-698.  Rules: SGKV-15, SGKV-17."""
    mgr = new_kv_manager(64, 4)
    prompt = list(range(10))

    mgr, cold = reserve_destination(mgr, prompt)
    assert cold.value.transferable_prompt_tokens == 12
    mgr, _ = cancel_destination(mgr, cold.value)

    prefix_tokens = prompt[:4]
    mgr, prefix = allocate_for_request(mgr, prefix_tokens)
    p = prefix.value
    mgr, _ = cache_finished_req(mgr, prefix_tokens, p.kv_indices, p.last_node, p.prefix_len)
    mgr, partial = reserve_destination(mgr, prompt)
    assert partial.value.transferable_prompt_tokens == 8
    mgr, _ = cancel_destination(mgr, partial.value)

    aligned_tokens = list(range(20, 28))
    mgr, aligned = allocate_for_request(mgr, aligned_tokens)
    a = aligned.value
    mgr, _ = cache_finished_req(mgr, aligned_tokens, a.kv_indices, a.last_node, a.prefix_len)
    mgr, full_hit = reserve_destination(mgr, aligned_tokens)
    assert full_hit.value.transferable_prompt_tokens == 0


def test_free_request_without_caching():
    """Upstream sglang_backend.rs:700-709.  Rule: SGKV-11."""
    mgr = new_kv_manager(100, 1)
    mgr, r = allocate_for_request(mgr, [1, 2, 3])
    mgr, _ = free_request(mgr, r.value.last_node)
    assert mgr.protected_size == 0


def test_event_publishing():
    """Upstream sglang_backend.rs:711-726.  Rules: SGKV-3, SGKV-6."""
    mgr = new_kv_manager(100, 1, publish_events=True)
    events = []
    mgr, r = allocate_for_request(mgr, [1, 2, 3])
    events += r.events
    assert len(events) == 1
    mgr, res = cache_finished_req(mgr, [1, 2, 3], r.value.kv_indices, r.value.last_node, 0)
    events += res.events
    mgr, r2 = allocate_for_request(mgr, [1, 2, 3])
    events += r2.events
    assert r2.value.prefix_len == 3
    assert len(events) == 1


def test_event_publishing_uses_router_block_hashes():
    """Upstream sglang_backend.rs:728-752.  Rule: SGKV-2."""
    mgr = new_kv_manager(100, 4, publish_events=True)
    events = []
    mgr, r = allocate_for_request(mgr, [1, 2, 3, 4, 5, 6])
    events += r.events
    mgr, res = cache_finished_req(mgr, [1, 2, 3, 4, 5, 6], r.value.kv_indices, r.value.last_node, 0)
    events += res.events
    assert len(events) == 1
    store = events[0].data
    assert isinstance(store, KvStored)
    assert len(store.blocks) == 1
    expected_local = [tokens_hash([1, 2, 3, 4])]
    expected_sequence = sequence_hashes(expected_local)
    assert store.blocks[0].tokens_hash == expected_local[0]
    assert store.blocks[0].block_hash == expected_sequence[0]


def test_cache_materialization_processes_only_newly_completed_blocks():
    """Upstream sglang_backend.rs:754-793.  Rules: SGKV-3, SGKV-5, SGKV-10."""
    mgr = new_kv_manager(100, 2)
    out_of_domain_token = 2**32
    tokens = [out_of_domain_token, 2, 3, 4, 5, 6]

    mgr, alloc = allocate_for_request(mgr, tokens[:2])
    a = alloc.value
    mgr, first = cache_unfinished_req(mgr, tokens[:2], a.kv_indices, a.last_node, 0)
    first_last_node = first.value

    mgr, more = raw_allocate(mgr, 4)
    kv_indices = a.kv_indices + more
    mgr = set_publish_events(mgr, True)

    mgr, res = cache_unfinished_req(mgr, tokens[:4], kv_indices[:4], first_last_node, 2)
    last_after_first_cache = res.value
    assert len(res.events) == 1
    assert isinstance(res.events[0].data, KvStored)
    assert len(res.events[0].data.blocks) == 1

    mgr, fin = cache_finished_req(mgr, tokens, kv_indices, last_after_first_cache, 4)
    assert len(fin.events) == 1
    assert isinstance(fin.events[0].data, KvStored)
    assert len(fin.events[0].data.blocks) == 1
    assert [e.event_id for e in res.events + fin.events] == [0, 1]


def test_local_hashes_reject_out_of_domain_tokens():
    """Upstream sglang_backend.rs:795-802 (should_panic).  Rule: SGKV-2."""
    with pytest.raises(InternalInvariantBroken) as err:
        local_block_hashes([2**32], 1)
    assert "local_hashes_for_range: token 4294967296 exceeds router u32 token domain" in str(err.value)
    assert err.value.rule == "SGKV-2"


def test_duplicate_logical_blocks_publish_once_and_remove_once():
    """Upstream sglang_backend.rs:804-830.  Rules: SGKV-3, SGKV-4, SGKV-12."""
    mgr = new_kv_manager(100, 1, publish_events=True)
    events = []
    mgr, req1 = allocate_for_request(mgr, [1, 2, 3])
    events += req1.events
    mgr, req2 = allocate_for_request(mgr, [1, 2, 3])
    events += req2.events
    assert len(events) == 1
    assert isinstance(events[0].data, KvStored)
    assert len(events[0].data.blocks) == 3

    mgr, f1 = free_indices(mgr, req1.value.kv_indices)
    events += f1.events
    assert len(events) == 1

    mgr, f2 = free_indices(mgr, req2.value.kv_indices)
    events += f2.events
    assert len(events) == 2
    assert isinstance(events[1].data, KvRemoved)
    assert len(events[1].data.block_hashes) == 3


def test_duplicate_completion_releases_unretained_indices_and_removes_on_eviction():
    """Upstream sglang_backend.rs:832-909.  Rules: SGKV-8, SGKV-9, SGKV-13.

    The router indexer harness is replaced by :class:`RouterOracle`.
    """
    router = RouterOracle()
    mgr = new_kv_manager(100, 1, publish_events=True)
    tokens = [1, 2, 3]

    mgr, req1 = allocate_for_request(mgr, tokens)
    mgr, req2 = allocate_for_request(mgr, tokens)
    assert mgr.available_tokens == 94

    allocation_events = req1.events + req2.events
    assert len(stored(allocation_events)) == 1
    query_hashes = [b.block_hash for s in stored(allocation_events) for b in s.blocks]
    assert len(query_hashes) == len(tokens)
    router.apply(allocation_events)

    r1 = req1.value
    mgr, c1 = cache_finished_req(mgr, tokens, r1.kv_indices, r1.last_node, 0)
    assert len(stored(c1.events)) == 0
    assert len(removed(c1.events)) == 0
    assert mgr.available_tokens == 94

    r2 = req2.value
    mgr, c2 = cache_finished_req(mgr, tokens, r2.kv_indices, r2.last_node, 0)
    assert len(stored(c2.events)) == 0
    assert len(removed(c2.events)) == 0
    assert mgr.available_tokens == 97
    router.apply(c1.events + c2.events)
    assert router.overlap(query_hashes) == 3

    mgr, ev = evict(mgr, len(tokens))
    assert len(removed(ev.events)) == 1
    assert sum(len(r.block_hashes) for r in removed(ev.events)) == len(tokens)
    router.apply(ev.events)
    assert router.overlap(query_hashes) == 0


def test_allocate_oom():
    """Upstream sglang_backend.rs:911-919.  Rule: SGKV-6."""
    mgr = new_kv_manager(3, 1)
    mgr, r = allocate_for_request(mgr, [1, 2, 3])
    assert r.value is not None
    mgr, result = allocate_for_request(mgr, [4, 5, 6])
    assert result.value is None


def test_chunked_prefill_parent_hash():
    """Upstream sglang_backend.rs:921-975.  Rules: SGKV-3, SGKV-6, SGKV-10."""
    mgr = new_kv_manager(32, 1, publish_events=True)
    tokens = [11, 22, 33, 44, 55, 66]
    chunk1_len, chunk2_len = 3, 6
    events = []

    mgr, alloc1 = allocate_for_request(mgr, tokens[:chunk1_len])
    events += alloc1.events
    a1 = alloc1.value
    mgr, nl = cache_unfinished_req(mgr, tokens[:chunk1_len], a1.kv_indices, a1.last_node, 0)
    events += nl.events
    mgr, alloc2 = allocate_for_request(mgr, tokens[:chunk2_len])
    events += alloc2.events
    mgr, fr = free_request(mgr, nl.value)
    events += fr.events

    assert len(events) == 2
    store1, store2 = events[0].data, events[1].data
    assert isinstance(store1, KvStored) and isinstance(store2, KvStored)
    assert store1.parent_hash is None
    assert store2.parent_hash == store1.blocks[-1].block_hash
    assert len(store2.blocks) == chunk2_len - chunk1_len
    assert alloc2.value.prefix_len == chunk1_len


# ---------------------------------------------------------------------------
# Block 2: rules and quirks (hand-derived values)
# ---------------------------------------------------------------------------


def test_allocation_failure_keeps_match_side_effects():
    """SGKV-6: on OOM the split and timestamps stay; nothing is locked or published."""
    mgr = new_kv_manager(6, 1, publish_events=True)
    mgr, r = allocate_for_request(mgr, [1, 2, 3, 4])
    mgr, _ = cache_finished_req(mgr, [1, 2, 3, 4], r.value.kv_indices, r.value.last_node, 0)
    nodes_before = mgr.cache.num_nodes  # root + [1,2,3,4]
    tick_before = mgr.cache.tick
    # [1,2,9,9,9,9,9]: hit 2, needs 5 fresh slots but only 2 are free
    mgr, res = allocate_for_request(mgr, [1, 2, 9, 9, 9, 9, 9])
    assert res.value is None and res.events == ()
    assert mgr.cache.num_nodes == nodes_before + 1  # split [1,2] | [3,4]
    assert mgr.cache.tick == tick_before + 1
    assert mgr.protected_size == 0


def test_stored_event_chains_and_ids():
    """SGKV-2/3/5: chained hashes, parent of the first new block, shared id counter."""
    mgr = new_kv_manager(16, 2, publish_events=True)
    mgr, r = allocate_for_request(mgr, [1, 2, 3, 4, 5])
    (ev,) = r.events
    a, b = tokens_hash([1, 2]), tokens_hash([3, 4])
    assert ev.event_id == 0 and ev.dp_rank == 0
    assert ev.data.parent_hash is None
    assert [(x.block_hash, x.tokens_hash) for x in ev.data.blocks] == [(a, a), (chain_hash(a, b), b)]
    # the representative slot is each page's last slot
    kv = r.value.kv_indices
    assert dict(mgr.idx_to_block_hash) == {kv[1]: a, kv[3]: chain_hash(a, b)}
    mgr, f = free_indices(mgr, kv)
    (ev2,) = f.events
    assert ev2.event_id == 1
    assert ev2.data.block_hashes == (a, chain_hash(a, b))
    assert mgr.next_event_id == 2 and len(mgr.idx_to_block_hash) == 0


def test_missing_parent_hashes_as_root_block():
    """SGKV-2, quirk S12: a failed parent lookup hashes a non-root page like a root page."""
    mgr = new_kv_manager(16, 2)
    mgr, r = allocate_for_request(mgr, [1, 2])
    mgr, n = cache_unfinished_req(mgr, [1, 2], r.value.kv_indices, r.value.last_node, 0)
    mgr = set_publish_events(mgr, True)
    mgr, more = raw_allocate(mgr, 2)
    mgr, res = cache_unfinished_req(mgr, [1, 2, 3, 4], r.value.kv_indices + more, n.value, 2)
    (ev,) = res.events
    assert ev.data.parent_hash is None
    assert ev.data.blocks[0].block_hash == tokens_hash([3, 4])


def test_skipped_page_leaves_hole_and_reannounces():
    """SGKV-3, quirk S12: an already-advertised middle slot is skipped, and a later
    block whose hash is already live (refcount 2) is still listed after the first new one.

    bs=1.  Request A advertises [1,2,3] as H1, H12, H123 on slots a0,a1,a2.  A
    second sequence [9,2,3] on slots [x, a1, y]: page 0 is new (th9); page 1's
    slot a1 already has H12, so it is skipped; page 2 looks up its parent via
    a1 -> H12 and hashes to H123 again (refcount 2), yet it is listed.
    """
    mgr = new_kv_manager(16, 1, publish_events=True)
    mgr, ra = allocate_for_request(mgr, [1, 2, 3])
    a0, a1, a2 = ra.value.kv_indices
    h1 = tokens_hash([1])
    h12 = chain_hash(h1, tokens_hash([2]))
    h123 = chain_hash(h12, tokens_hash([3]))
    mgr, (x, y) = raw_allocate(mgr, 2)
    mgr, res = cache_unfinished_req(mgr, [9, 2, 3], [x, a1, y], 0, 0)
    (ev,) = res.events
    assert ev.data.parent_hash is None
    assert [b.block_hash for b in ev.data.blocks] == [tokens_hash([9]), h123]
    assert mgr.block_hash_refcounts[h123] == 2
    assert mgr.idx_to_block_hash[y] == h123


def test_publishing_off_touches_no_hash_state():
    """SGKV-5: without publishers there are no events, ids or hash maps."""
    mgr = new_kv_manager(16, 1)
    mgr, r = allocate_for_request(mgr, [1, 2, 3])
    mgr, f = free_indices(mgr, r.value.kv_indices)
    assert r.events == () and f.events == ()
    assert mgr.next_event_id == 0 and len(mgr.idx_to_block_hash) == 0


def test_cache_unfinished_moves_lock_deeper():
    """SGKV-10: lock the new deepest node before unlocking the old one."""
    mgr = new_kv_manager(16, 2)
    mgr, r = allocate_for_request(mgr, [1, 2, 3, 4, 5])
    a = r.value
    assert a.last_node == rc.ROOT
    mgr, n = cache_unfinished_req(mgr, [1, 2, 3, 4], a.kv_indices[:4], a.last_node, 0)
    assert mgr.protected_size == 4 and mgr.evictable_size == 0
    node = rc.get_node(mgr.cache, n.value)
    assert node.key == (1, 2, 3, 4) and node.lock_ref == 1
    # the 5th slot is still request-owned, outside the tree
    assert mgr.available_tokens == 11


def test_unfinished_insert_splits_longer_node_for_exact_last_node():
    """SGKV-10: the re-match splits an existing longer edge so last_node ends at len(tokens)."""
    mgr = new_kv_manager(32, 2)
    mgr, r = allocate_for_request(mgr, [1, 2, 3, 4, 5, 6])
    mgr, _ = cache_finished_req(mgr, [1, 2, 3, 4, 5, 6], r.value.kv_indices, r.value.last_node, 0)
    mgr, r2 = allocate_for_request(mgr, [1, 2, 3, 4, 5, 6])  # full hit on one node
    mgr, n = cache_unfinished_req(mgr, [1, 2, 3, 4], r2.value.kv_indices[:4], r2.value.last_node, 0)
    assert rc.get_node(mgr.cache, n.value).key == (1, 2, 3, 4)
    assert rc.path_indices(mgr.cache, n.value) == r.value.kv_indices[:4]


def test_release_unretained_compares_last_slot_per_page():
    """SGKV-9, quirk S5: a duplicate page loses to the tree and is freed at completion."""
    mgr = new_kv_manager(16, 2, publish_events=True)
    mgr, r1 = allocate_for_request(mgr, [1, 2, 3, 4])
    mgr, r2 = allocate_for_request(mgr, [1, 2, 3, 4])
    a, b = r1.value, r2.value
    mgr, _ = cache_finished_req(mgr, [1, 2, 3, 4], a.kv_indices, a.last_node, 0)
    assert mgr.available_tokens == 8
    mgr, res = cache_finished_req(mgr, [1, 2, 3, 4], b.kv_indices, b.last_node, 0)
    assert mgr.available_tokens == 12
    assert mgr.cache.pool.free_list[-4:] == b.kv_indices  # freed in page order
    # both refcounts drop from 2 to 1: no Removed
    assert res.events == ()


def test_reserve_destination_without_room_unlocks_and_does_not_evict():
    """SGKV-15: fresh > available + evictable -> None, prefix lock released, no eviction."""
    mgr = new_kv_manager(8, 2, publish_events=True)
    mgr, r = allocate_for_request(mgr, [1, 2, 3, 4])
    mgr, _ = cache_finished_req(mgr, [1, 2, 3, 4], r.value.kv_indices, r.value.last_node, 0)
    mgr, hold = allocate_for_request(mgr, [7, 7, 7, 7])  # 0 free now, 4 evictable
    # prompt [1,2,3,4,5..10]: prefix 4 (locked, so not evictable), needs 6 fresh > 0 + 0
    mgr2, res = reserve_destination(mgr, list(range(1, 11)))
    assert res.value is None and res.events == ()
    assert mgr2.protected_size == 0 and mgr2.evictable_size == 4
    assert mgr2.cache.tick == mgr.cache.tick + 1  # the match still happened


def test_reserve_destination_evicts_then_allocates():
    """SGKV-15: evict the shortfall (whole leaves, Removed events), then allocate; the call
    publishes the eviction's Removed event and nothing else (SGKV-19)."""
    mgr = new_kv_manager(8, 2, publish_events=True)
    mgr, r = allocate_for_request(mgr, [1, 2, 3, 4])
    mgr, _ = cache_finished_req(mgr, [1, 2, 3, 4], r.value.kv_indices, r.value.last_node, 0)
    mgr, _ = allocate_for_request(mgr, [7, 7])
    # 2 free, 4 evictable; a 3-token prompt needs 4 fresh slots
    mgr, res = reserve_destination(mgr, [5, 6, 5])
    res_v = res.value
    assert res_v.transferable_prompt_tokens == 4 and res_v.allocated_tokens == 4
    (ev,) = res.events
    assert isinstance(ev.data, KvRemoved) and len(ev.data.block_hashes) == 2
    assert mgr.available_tokens == 2  # evicted 4, then took 4 of the 6 free
    assert mgr.cache.num_nodes == 1


def test_activation_releases_padding_then_caches_prompt():
    """SGKV-16: padding beyond len(prompt) - prefix goes back first, without events; the only
    event of the call is the Stored event of the cached prompt (SGKV-19)."""
    mgr = new_kv_manager(64, 4, publish_events=True)
    prompt = list(range(10))
    mgr, res = reserve_destination(mgr, prompt)
    assert mgr.available_tokens == 52
    mgr, act = activate_destination(mgr, res.value, prompt)
    assert mgr.available_tokens == 54  # 12 reserved, 10 kept
    assert act.value.kv_indices == res.value.unpublished_indices[:10]
    assert mgr.cache.pool.free_list[-2:] == res.value.unpublished_indices[10:]
    (ev,) = act.events
    assert isinstance(ev.data, KvStored) and len(ev.data.blocks) == 2
    node = rc.get_node(mgr.cache, act.value.last_node)
    assert node.key == tuple(range(8)) and node.lock_ref == 1


def test_activation_collision_leaks_duplicate_slots():
    """SGKV-16, quirk HL-S10: colliding activations keep non-canonical slots that a
    later cancel (which frees only kv[cached:]) never returns; the inflated hash
    refcounts then also suppress the Removed event when the canonical copy goes.

    bs=2, pool 16, prompt [1,2,3,4]: d1 gets slots (3,2,1,0), d2 gets (7,6,5,4).
    """
    mgr = new_kv_manager(16, 2, publish_events=True)
    prompt = [1, 2, 3, 4]
    mgr, d1 = reserve_destination(mgr, prompt)
    mgr, d2 = reserve_destination(mgr, prompt)
    assert d1.value.unpublished_indices == (3, 2, 1, 0)
    assert d2.value.unpublished_indices == (7, 6, 5, 4)
    mgr, a1 = activate_destination(mgr, d1.value, prompt)
    assert len(a1.events) == 1
    mgr, a2 = activate_destination(mgr, d2.value, prompt)
    assert a2.events == ()  # both blocks now have refcount 2
    assert a2.value.last_node == a1.value.last_node
    assert rc.path_indices(mgr.cache, a2.value.last_node) == (3, 2, 1, 0)
    # the core now sets cached_tokens = 4; cancelling frees kv[4:] (nothing) and unlocks
    mgr, _ = free_indices(mgr, a2.value.kv_indices[4:])
    mgr, _ = free_request(mgr, a2.value.last_node)
    mgr, _ = free_indices(mgr, a1.value.kv_indices[4:])
    mgr, _ = free_request(mgr, a1.value.last_node)
    mgr, ev = evict(mgr, 4)
    assert ev.value.evicted == 4
    assert ev.events == ()  # refcounts 2 -> 1: the router is never told
    assert mgr.available_tokens == 12  # slots 7,6,5,4 leaked
    assert not {7, 6, 5, 4} & set(mgr.cache.pool.free_list)


def test_cancel_with_uncached_prefix_double_frees_tree_slots():
    """SGKV-12, quirk S6b: freeing kv[0:] of a fresh prefix hit puts tree-owned slots
    in the pool; a later eviction frees them again, so the free list holds duplicates."""
    mgr = new_kv_manager(8, 2)
    mgr, r = allocate_for_request(mgr, [1, 2])
    mgr, _ = cache_finished_req(mgr, [1, 2], r.value.kv_indices, r.value.last_node, 0)
    mgr, hit = allocate_for_request(mgr, [1, 2, 3])
    h = hit.value
    assert h.prefix_len == 2
    mgr, _ = free_indices(mgr, h.kv_indices[0:])  # cached_tokens is still 0
    mgr, _ = free_request(mgr, h.last_node)
    mgr, _ = evict(mgr, 2)
    counts = Counter(mgr.cache.pool.free_list)
    assert mgr.available_tokens == 10 > mgr.total_tokens
    assert {s for s, c in counts.items() if c == 2} == set(r.value.kv_indices)


def test_decode_reservation_fifo_and_release_without_events():
    """SGKV-14: slots are handed out front first; leftovers return in order, no events."""
    mgr = new_kv_manager(8, 1, publish_events=True)
    mgr, res = reserve_decode_tokens(mgr, 3)
    reservation = res.value
    assert reservation.indices == (2, 1, 0)
    first, reservation = reservation.take()
    assert first == 2
    mgr, rel = release_decode_reservation(mgr, reservation)
    assert rel.events == ()
    assert mgr.cache.pool.free_list == (7, 6, 5, 4, 3, 1, 0)
    mgr2, none = reserve_decode_tokens(mgr, 8)
    assert none.value is None and mgr2 == mgr
    with pytest.raises(InternalInvariantBroken):
        reservation.take()[1].take()[1].take()


def test_reservation_is_used_once():
    """SGKV-18: a consumed reservation is rejected and the state is unchanged."""
    mgr = new_kv_manager(16, 2)
    mgr, res = reserve_destination(mgr, [1, 2, 3])
    mgr, _ = cancel_destination(mgr, res.value)
    for call in (lambda m: cancel_destination(m, res.value),
                 lambda m: activate_destination(m, res.value, [1, 2, 3])):
        with pytest.raises(InternalInvariantBroken) as err:
            call(mgr)
        assert err.value.rule == "SGKV-18"


def test_activation_with_longer_prompt_is_rejected():
    """SGKV-16 guard: more missing tokens than reserved slots (upstream split_off panic)."""
    mgr = new_kv_manager(16, 2)
    mgr, res = reserve_destination(mgr, [1, 2, 3])
    with pytest.raises(InternalInvariantBroken) as err:
        activate_destination(mgr, res.value, [1, 2, 3, 4, 5])
    assert err.value.rule == "SGKV-16"


def test_allocate_after_prefix_reuses_prefix_and_locks_again():
    """SGKV-7: no matching; prefix slots kept, new ones appended, lock taken again."""
    mgr = new_kv_manager(16, 2, publish_events=True)
    mgr, r = allocate_for_request(mgr, [1, 2, 3])
    a = r.value
    mgr, n = cache_unfinished_req(mgr, [1, 2], a.kv_indices[:2], a.last_node, 0)
    mgr, cont = allocate_after_prefix(mgr, [1, 2, 3, 4, 5], 3, a.kv_indices, n.value)
    c = cont.value
    assert c.prefix_len == 3 and c.kv_indices[:3] == a.kv_indices and len(c.kv_indices) == 5
    assert rc.get_node(mgr.cache, n.value).lock_ref == 2
    # page [3,4] is new: parent is the page [1,2] advertised at allocation time
    (ev,) = cont.events
    assert ev.data.parent_hash == tokens_hash([1, 2])
    mgr, done = free_request(mgr, n.value)
    assert done.value is True
    with pytest.raises(InternalInvariantBroken):
        allocate_after_prefix(mgr, [1, 2, 3, 4, 5], 6, a.kv_indices, n.value)


def test_allocate_after_prefix_allocates_before_the_prefix_guard():
    """SGKV-7: upstream allocates first (sglang_backend.rs:150) and slices the prefix after
    (:152), so a pool too short for the new tokens answers None even when prefix_len is longer
    than the prefix indices, and an unknown node is never looked at."""
    mgr = new_kv_manager(2, 1)
    mgr, full = allocate_for_request(mgr, [1, 2])
    assert full.value is not None  # both slots taken
    mgr, res = allocate_after_prefix(mgr, [1, 2, 3, 4], 3, [0, 1], 999)
    assert res.value is None
    # with the one new slot free, the too-long prefix is refused
    mgr2 = new_kv_manager(2, 1)
    with pytest.raises(InternalInvariantBroken) as err:
        allocate_after_prefix(mgr2, [1, 2, 3, 4], 3, [0, 1], rc.ROOT)
    assert err.value.rule == "SGKV-7"


# ---------------------------------------------------------------------------
# Block 3: state machine
# ---------------------------------------------------------------------------

#: prompts share prefixes of one base sequence, plus a short random tail
BASE = (1, 2, 3, 1, 2, 3, 1, 2, 3, 1)
TOKENS = st.builds(
    lambda n, tail: list(BASE[:n]) + tail,
    st.integers(0, len(BASE)),
    st.lists(st.integers(1, 3), max_size=3),
)


@attrs.define
class Req:
    tokens: tuple
    kv: tuple
    node: int
    cached: int
    #: leading slots that were tree-owned at admission
    prefix: int


def fingerprint(mgr):
    c = mgr.cache
    return (
        c.pool.free_list, dict(c.nodes), dict(c.leaves), c.tick, c.next_node_id,
        c.evictable_size, c.protected_size, dict(mgr.idx_to_block_hash),
        dict(mgr.block_hash_refcounts), mgr.next_event_id, mgr.next_reservation_id,
        set(mgr.live_reservations),
    )


def has(attr):
    return precondition(lambda self: bool(getattr(self, attr)))


class SglangKvMachine(RuleBasedStateMachine):
    """Random lifecycles on a small pool.

    A shadow manager with publishing off runs the same operations: its cache
    must stay identical (events never feed back into the tree or pool).
    Cancels of a request whose prefix is not yet cached (quirk S6b, double
    free) are excluded here and covered by a unit test; the slot leak of
    quirk HL-S10 / S6a is tracked in ``leaked``.
    """

    @initialize(page_size=st.sampled_from([1, 2, 4]), pages=st.integers(3, 10))
    def setup(self, page_size, pages):
        total = pages * page_size
        self.mgr = new_kv_manager(total, page_size, publish_events=True)
        self.shadow = new_kv_manager(total, page_size)
        self.raw: list[int] = []
        self.leaked: Counter = Counter()
        self.live_reqs: dict[int, Req] = {}
        self.live_dests: dict[int, tuple] = {}
        self.live_pins: dict[int, int] = {}
        self.next_key = 0
        self.next_event_id = 0

    # -- helpers --------------------------------------------------------------

    def check_events(self, events):
        for e in events:
            assert e.event_id == self.next_event_id
            self.next_event_id += 1

    def apply(self, op, *args):
        self.mgr, res = op(self.mgr, *args)
        self.shadow, shadow_res = op(self.shadow, *args)
        assert shadow_res.events == ()
        self.check_events(res.events)
        assert res.value == shadow_res.value
        return res.value

    def apply_cache(self, fn):
        cache, out = fn(self.mgr.cache)
        self.mgr = attrs.evolve(self.mgr, cache=cache)
        cache2, out2 = fn(self.shadow.cache)
        self.shadow = attrs.evolve(self.shadow, cache=cache2)
        assert out == out2
        return out

    def key(self):
        self.next_key += 1
        return self.next_key

    def tree_slots(self):
        out = Counter()
        for node in self.mgr.cache.nodes.values():
            out.update(node.value)
        return out

    def pick(self, data, table):
        return data.draw(st.sampled_from(sorted(table)))

    # -- request rules -----------------------------------------------------------

    @rule(tokens=TOKENS)
    def admit(self, tokens):
        alloc = self.apply(allocate_for_request, tokens)
        if alloc is not None:
            self.live_reqs[self.key()] = Req(
                tuple(tokens), alloc.kv_indices, alloc.last_node, 0, alloc.prefix_len
            )

    @rule(tokens=TOKENS)
    def admit_twice(self, tokens):
        """Quirk S5: the same prompt admitted twice before either is cached."""
        self.admit(tokens)
        self.admit(tokens)

    @rule(tokens=TOKENS)
    def round_trip(self, tokens):
        """Admit and complete at once: populates the tree with a finished sequence."""
        before = set(self.live_reqs)
        self.admit(tokens)
        for k in set(self.live_reqs) - before:
            self.finish_key(k)

    @has("live_reqs")
    @rule(data=st.data(), extra=st.lists(st.integers(1, 3), min_size=1, max_size=5))
    def extend(self, data, extra):
        req = self.live_reqs[self.pick(data, self.live_reqs)]
        tokens = req.tokens + tuple(extra)
        alloc = self.apply(allocate_after_prefix, tokens, len(req.kv), req.kv, req.node)
        if alloc is None:
            return
        assert alloc.last_node == req.node
        assert self.apply(free_request, req.node) is True
        req.tokens, req.kv = tokens, alloc.kv_indices

    @has("live_reqs")
    @rule(data=st.data())
    def cache_partial(self, data):
        req = self.live_reqs[self.pick(data, self.live_reqs)]
        ps = self.mgr.page_size
        aligned = len(req.tokens) // ps * ps
        if aligned == 0 or aligned <= req.cached:
            return
        node = self.apply(
            cache_unfinished_req, req.tokens[:aligned], req.kv[:aligned], req.node, req.cached
        )
        req.node, req.cached = node, aligned

    @has("live_reqs")
    @rule(data=st.data(), n=st.integers(1, 3), used=st.integers(0, 3), tok=st.integers(1, 3))
    def decode(self, data, n, used, tok):
        req = self.live_reqs[self.pick(data, self.live_reqs)]
        reservation = self.apply(reserve_decode_tokens, n)
        if reservation is None:
            return
        for _ in range(min(used, n)):
            slot, reservation = reservation.take()
            req.kv += (slot,)
            req.tokens += (tok,)
        self.apply(release_decode_reservation, reservation)

    @has("live_reqs")
    @rule(data=st.data())
    def finish(self, data):
        self.finish_key(self.pick(data, self.live_reqs))

    def finish_key(self, k):
        """Upstream cleanup_completed_request: free the tail page, cache the rest."""
        req = self.live_reqs.pop(k)
        ps = self.mgr.page_size
        keep = len(req.tokens) // ps * ps
        if len(req.kv) > keep:
            self.apply(free_indices, req.kv[keep:])
        if keep > 0:
            self.apply(cache_finished_req, req.tokens[:keep], req.kv[:keep], req.node, req.cached)
        else:
            assert self.apply(free_request, req.node) is True

    @has("live_reqs")
    @rule(data=st.data())
    def cancel(self, data):
        k = self.pick(data, self.live_reqs)
        req = self.live_reqs[k]
        if req.cached < req.prefix:  # would be the S6b double free
            return
        del self.live_reqs[k]
        tree = self.tree_slots()
        # HL-S10 / S6a: own slots below cached_tokens that lost to the tree are lost
        self.leaked.update(s for s in req.kv[:req.cached] if s not in tree)
        self.apply(free_indices, req.kv[req.cached:])
        assert self.apply(free_request, req.node) is True

    # -- destination rules --------------------------------------------------------

    @rule(tokens=TOKENS)
    def reserve(self, tokens):
        self.mgr, res = reserve_destination(self.mgr, tokens)
        self.shadow, res2 = reserve_destination(self.shadow, tokens)
        self.check_events(res.events)
        assert res.value == res2.value  # same reservation ids too: both count from 0
        if res.value is not None:
            self.live_dests[self.key()] = (res.value, res2.value, tuple(tokens))

    @has("live_dests")
    @rule(data=st.data())
    def activate(self, data):
        res, res2, tokens = self.live_dests.pop(self.pick(data, self.live_dests))
        self.mgr, a = activate_destination(self.mgr, res, tokens)
        self.shadow, a2 = activate_destination(self.shadow, res2, tokens)
        self.check_events(a.events)
        assert a.value == a2.value
        ps = self.mgr.page_size
        self.live_reqs[self.key()] = Req(
            tokens, a.value.kv_indices, a.value.last_node, len(tokens) // ps * ps, res.prefix_len
        )

    @has("live_dests")
    @rule(data=st.data())
    def cancel_dest(self, data):
        res, res2, _ = self.live_dests.pop(self.pick(data, self.live_dests))
        self.mgr, r = cancel_destination(self.mgr, res)
        self.shadow, _ = cancel_destination(self.shadow, res2)
        assert r.events == ()

    # -- raw tree / pool rules ---------------------------------------------------------

    @rule(tokens=TOKENS)
    def pin(self, tokens):
        m = self.apply_cache(lambda c: rc.match_prefix(c, tokens))
        self.apply_cache(lambda c: rc.inc_lock_ref(c, m.node))
        self.live_pins[self.key()] = m.node

    @has("live_pins")
    @rule(data=st.data())
    def unpin(self, data):
        node = self.live_pins.pop(self.pick(data, self.live_pins))
        assert self.apply_cache(lambda c: rc.dec_lock_ref(c, node)) is True

    @rule(tokens=TOKENS)
    def touch(self, tokens):
        self.apply_cache(lambda c: rc.match_prefix(c, tokens))

    @rule(n=st.integers(1, 12))
    def evict_some(self, n):
        had_leaves = bool(self.mgr.cache.leaves)
        out = self.apply(evict, n)
        assert (out.evicted > 0) == had_leaves
        assert out.evicted >= n or not self.mgr.cache.leaves

    @rule(n=st.integers(0, 4))
    def raw_alloc(self, n):
        slots = self.apply_cache(lambda c: rc.allocate_slots(c, n))
        if slots is not None:
            self.raw.extend(slots)

    @has("raw")
    @rule(n=st.integers(1, 4))
    def raw_free(self, n):
        give, self.raw = self.raw[:n], self.raw[n:]
        self.apply(free_indices, give)

    # -- rejections ----------------------------------------------------------------------

    @rule(which=st.integers(0, 4), tokens=TOKENS)
    def rejected(self, which, tokens):
        before = fingerprint(self.mgr)
        mgr = self.mgr
        stale = mgr.cache.next_node_id + 7
        calls = [
            lambda: free_request(mgr, stale),
            lambda: cache_unfinished_req(mgr, tokens + [1] * 4, [0], rc.ROOT, 0),
            # nothing left to allocate, so the prefix slice is reached (SGKV-7)
            lambda: allocate_after_prefix(mgr, tokens[:3], 3, [0, 1], rc.ROOT),
            lambda: local_block_hashes([2**32], 1),
            lambda: evict(mgr, -1),
        ]
        with pytest.raises(ModelError):
            calls[which]()
        assert fingerprint(self.mgr) == before

    @has("live_dests")
    @rule(data=st.data())
    def rejected_reservation_reuse(self, data):
        res, res2, tokens = self.live_dests.pop(self.pick(data, self.live_dests))
        self.mgr, _ = cancel_destination(self.mgr, res)
        self.shadow, _ = cancel_destination(self.shadow, res2)
        before = fingerprint(self.mgr)
        with pytest.raises(InternalInvariantBroken):
            activate_destination(self.mgr, res, tokens)
        with pytest.raises(InternalInvariantBroken):
            cancel_destination(self.mgr, res)
        assert fingerprint(self.mgr) == before

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def shadow_cache_identical(self):
        assert self.shadow.cache == self.mgr.cache

    @invariant()
    def slot_conservation(self):
        """free + tree + request-owned + reservations + raw + leaked(HL-S10) = pool."""
        mgr = self.mgr
        tree = self.tree_slots()
        assert all(c == 1 for c in tree.values()), "a slot appears twice in the tree"
        total = Counter(mgr.cache.pool.free_list) + tree + Counter(self.raw) + self.leaked
        for req in self.live_reqs.values():
            total.update(s for s in req.kv if s not in tree)
        for res, _, _ in self.live_dests.values():
            total.update(res.unpublished_indices)
            assert all(s in tree for s in res.prefix_indices)
        assert total == Counter(range(mgr.total_tokens))

    @invariant()
    def lock_accounting(self):
        """lock_ref(n) = holds on n + sum of children's lock_ref; all >= 0."""
        cache = self.mgr.cache
        holds = Counter(r.node for r in self.live_reqs.values())
        holds.update(self.live_pins.values())
        holds.update(res.last_node for res, _, _ in self.live_dests.values())
        for nid, node in cache.nodes.items():
            assert node.lock_ref >= 0
            if nid == cache.root:
                continue
            below = sum(cache.nodes[c].lock_ref for c in node.children.values())
            assert node.lock_ref == holds[nid] + below

    @invariant()
    def size_accounting(self):
        """evictable + protected = cached tokens; leaves = unlocked non-root leaves."""
        cache = self.mgr.cache
        ps = cache.page_size
        evictable = protected = 0
        leaves = set()
        for nid, node in cache.nodes.items():
            if nid == cache.root:
                assert node.key == () and node.parent is None
                continue
            assert len(node.key) % ps == 0 and len(node.key) > 0
            assert len(node.value) == len(node.key)
            parent = cache.nodes[node.parent]
            assert parent.children[node.key[:ps]] == nid
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
                if not node.children:
                    leaves.add(nid)
        assert cache.evictable_size == evictable
        assert cache.protected_size == protected
        assert cache.evictable_leaves == leaves

    @invariant()
    def hash_bookkeeping(self):
        mgr = self.mgr
        assert dict(mgr.block_hash_refcounts) == dict(Counter(mgr.idx_to_block_hash.values()))
        assert not set(mgr.idx_to_block_hash) & set(mgr.cache.pool.free_list)
        assert len(mgr.live_reservations) == len(self.live_dests)


TestSglangKvMachine = SglangKvMachine.TestCase
TestSglangKvMachine.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
