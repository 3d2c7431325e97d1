"""Radix cache and token pool (spec/kv-sglang.md, POOL-*, RADIX-*).

The first block ports every test of upstream lib/mocker/src/cache/radix_cache.rs
at a822423412a0 under the same name; expected values come from those tests.
The rest pins rules and quirks with values derived by hand in comments.
"""

from __future__ import annotations

import pytest

from model.errors import InternalInvariantBroken, InvalidInput
from model.radix_cache import (
    ROOT,
    allocate_slots,
    dec_lock_ref,
    evict,
    free_slots,
    get_node,
    inc_lock_ref,
    insert,
    match_prefix,
    new_radix_cache,
    new_token_pool,
    path_indices,
    pool_allocate,
    pool_free,
    prefix_match_len,
)


# ---------------------------------------------------------------------------
# Ports of upstream tests (radix_cache.rs)
# ---------------------------------------------------------------------------


def test_token_pool_allocate_and_free():
    """Upstream radix_cache.rs:417-431.  Rules: POOL-1, POOL-2, POOL-3."""
    pool = new_token_pool(10)
    assert pool.available == 10
    pool, a = pool_allocate(pool, 3)
    assert len(a) == 3
    assert pool.available == 7
    pool, b = pool_allocate(pool, 7)
    assert pool.available == 0
    pool2, none = pool_allocate(pool, 1)
    assert none is None and pool2 == pool
    pool = pool_free(pool, a)
    assert pool.available == 3
    pool = pool_free(pool, b)
    assert pool.available == 10


def test_cache_slot_wrappers_keep_the_pool_order():
    """POOL-2 and POOL-3 through the cache: a fresh pool hands out its last free-list entries, and
    freeing appends in the given order with no check (a slot freed twice is listed twice)."""
    cache = new_radix_cache(6, 1)
    cache, got = allocate_slots(cache, 2)
    # free list [5, 4, 3, 2, 1, 0]; the last two entries, in list order
    assert got == (1, 0)
    assert cache.pool.free_list == (5, 4, 3, 2)
    cache, none = free_slots(cache, (0, 1, 0))
    assert none is None
    assert cache.pool.free_list == (5, 4, 3, 2, 0, 1, 0) and cache.pool.available == 7


def test_match_prefix():
    """Upstream radix_cache.rs:433-455.  Rules: RADIX-5, RADIX-6, RADIX-8."""
    cache = new_radix_cache(100, 1)
    cache, (length, node) = match_prefix(cache, [1, 2, 3])
    assert length == 0
    assert node == cache.root

    cache, _ = insert(cache, [1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    cache, m = match_prefix(cache, [1, 2, 3, 4, 5])
    assert m.length == 5

    cache, _ = insert(cache, [1, 2, 3, 4, 5, 6, 7], [10, 20, 30, 40, 50, 60, 70])
    cache, (length, node) = match_prefix(cache, [1, 2, 3, 4, 5, 9, 9])
    assert length == 5
    n = get_node(cache, node)
    assert n.key == (1, 2, 3, 4, 5)
    assert n.value == (10, 20, 30, 40, 50)
    suffix_id = n.children[(6,)]
    assert get_node(cache, suffix_id).value == (60, 70)


def test_insert():
    """Upstream radix_cache.rs:457-483.  Rule: RADIX-8."""
    cache = new_radix_cache(100, 1)
    cache, _ = insert(cache, [1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    cache, _ = insert(cache, [1, 2, 3, 6, 7], [10, 20, 30, 60, 70])
    cache, m = match_prefix(cache, [1, 2, 3, 4, 5])
    assert m.length == 5
    cache, m = match_prefix(cache, [1, 2, 3, 6, 7])
    assert m.length == 5
    cache, m = match_prefix(cache, [1, 2, 3, 9])
    assert m.length == 3

    cache = new_radix_cache(100, 1)
    cache, _ = insert(cache, [1, 2, 3], [10, 20, 30])
    cache, _ = insert(cache, [1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    cache, m = match_prefix(cache, [1, 2, 3, 4, 5])
    assert m.length == 5

    # duplicate insert is idempotent (upstream only checks it does not panic)
    cache, _ = insert(cache, [1, 2, 3], [10, 20, 30])

    cache = new_radix_cache(100, 1)
    cache, _ = insert(cache, [1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    cache, m = match_prefix(cache, [1, 2, 3, 4, 5, 6, 7, 8])
    assert m.length == 5
    cache, _ = insert(cache, [1, 2, 3, 4, 5, 6, 7, 8], [10, 20, 30, 40, 50, 60, 70, 80])
    cache, m = match_prefix(cache, [1, 2, 3, 4, 5, 6, 7, 8])
    assert m.length == 8


def test_page_size():
    """Upstream radix_cache.rs:485-512.  Rules: RADIX-3, RADIX-6, RADIX-8."""
    cache = new_radix_cache(100, 4)
    assert cache.total_tokens == 100
    cache, _ = insert(cache, [1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 6])
    cache, m = match_prefix(cache, [1, 2, 3, 4])
    assert m.length == 4
    cache, (_, node) = match_prefix(cache, [1, 2, 3, 4])
    assert get_node(cache, node).value == (0, 1, 2, 3)

    cache, _ = insert(cache, [1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 10, 11, 12, 13])
    cache, m = match_prefix(cache, [1, 2, 3, 4, 5, 6, 7, 8])
    assert m.length == 8

    cache = new_radix_cache(100, 4)
    cache, _ = insert(cache, [1, 2, 3, 4], [0, 1, 2, 3])
    cache, _ = insert(cache, [1, 2, 3, 5], [4, 5, 6, 7])
    assert match_prefix(cache, [1, 2, 3, 4])[1].length == 4
    assert match_prefix(cache, [1, 2, 3, 5])[1].length == 4
    assert match_prefix(cache, [1, 2, 3, 6])[1].length == 0

    cache = new_radix_cache(100, 4)
    cache, _ = insert(cache, [1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 10, 11, 12, 13])
    cache, _ = match_prefix(cache, [1, 2, 3, 4, 9, 9, 9, 9])
    cache, (_, node) = match_prefix(cache, [1, 2, 3, 4])
    assert get_node(cache, node).value == (0, 1, 2, 3)


def test_lock_unlock_shared_prefix():
    """Upstream radix_cache.rs:514-531.  Rules: RADIX-10, RADIX-11."""
    cache = new_radix_cache(100, 1)
    cache, _ = insert(cache, [1, 2, 3, 4, 5], [0, 1, 2, 3, 4])
    cache, _ = insert(cache, [1, 2, 3, 6, 7], [0, 1, 2, 5, 6])
    cache, (_, node_a) = match_prefix(cache, [1, 2, 3, 4, 5])
    cache, (_, node_b) = match_prefix(cache, [1, 2, 3, 6, 7])

    cache, _ = inc_lock_ref(cache, node_a)
    cache, _ = inc_lock_ref(cache, node_b)
    assert cache.protected_size == 7  # 2 + 2 + 3

    cache, _ = dec_lock_ref(cache, node_a)
    assert node_a in cache.evictable_leaves
    cache, _ = dec_lock_ref(cache, node_b)
    assert cache.protected_size == 0


def test_evict():
    """Upstream radix_cache.rs:533-581.  Rule: RADIX-12 (LRU by logical tick)."""
    cache = new_radix_cache(100, 1)
    cache, _ = insert(cache, [1, 2, 3], [0, 1, 2])
    cache, (_, n1) = match_prefix(cache, [1, 2, 3])
    cache, _ = inc_lock_ref(cache, n1)
    cache, _ = dec_lock_ref(cache, n1)
    # upstream sleeps 1 ms here; the logical clock orders the calls anyway
    cache, _ = insert(cache, [4, 5, 6], [3, 4, 5])
    cache, (_, n2) = match_prefix(cache, [4, 5, 6])
    cache, _ = inc_lock_ref(cache, n2)
    cache, _ = dec_lock_ref(cache, n2)

    cache, (count, indices) = evict(cache, 3)
    assert count == 3
    assert sorted(indices) == [0, 1, 2]
    assert match_prefix(cache, [1, 2, 3])[1].length == 0
    assert match_prefix(cache, [4, 5, 6])[1].length == 3

    cache = new_radix_cache(100, 1)
    cache, _ = insert(cache, [1, 2, 3], [0, 1, 2])
    cache, _ = insert(cache, [4, 5, 6], [3, 4, 5])
    cache, (_, locked) = match_prefix(cache, [1, 2, 3])
    cache, _ = inc_lock_ref(cache, locked)
    cache, (_, unlocked) = match_prefix(cache, [4, 5, 6])
    cache, _ = inc_lock_ref(cache, unlocked)
    cache, _ = dec_lock_ref(cache, unlocked)
    cache, (count, indices) = evict(cache, 6)
    assert count == 3
    assert sorted(indices) == [3, 4, 5]
    assert match_prefix(cache, [1, 2, 3])[1].length == 3


def test_evictable_size_includes_unlocked_internal_prefix():
    """Upstream radix_cache.rs:583-595.  Rules: RADIX-12, RADIX-14."""
    cache = new_radix_cache(16, 4)
    cache, first = allocate_slots(cache, 8)
    cache, _ = insert(cache, [1] * 8, first)
    cache, extra = allocate_slots(cache, 4)
    branch = first[:4] + extra
    cache, _ = insert(cache, [1, 1, 1, 1, 2, 2, 2, 2], branch)

    assert cache.evictable_size == 12
    cache, result = evict(cache, 12)
    assert result.evicted == 12
    assert cache.available_tokens == 16


def test_query_methods():
    """Upstream radix_cache.rs:597-606.  Rule: POOL-1."""
    cache = new_radix_cache(100, 1)
    assert cache.available_tokens == 100
    assert cache.total_tokens == 100
    cache4 = new_radix_cache(100, 4)
    assert cache4.available_tokens == 100
    assert cache4.total_tokens == 100


# ---------------------------------------------------------------------------
# Rule and quirk tests (values derived by hand)
# ---------------------------------------------------------------------------


def test_pool_order_is_lifo_from_the_end():
    """POOL-1/2/3: fresh free list is [4,3,2,1,0]; allocate takes the tail in list order."""
    pool = new_token_pool(5)
    assert pool.free_list == (4, 3, 2, 1, 0)
    pool, got = pool_allocate(pool, 3)
    assert got == (2, 1, 0)
    assert pool.free_list == (4, 3)
    pool = pool_free(pool, [1, 0])  # appended in the given order
    assert pool.free_list == (4, 3, 1, 0)
    pool, got = pool_allocate(pool, 1)
    assert got == (0,)
    pool, got = pool_allocate(pool, 0)
    assert got == () and pool.free_list == (4, 3, 1)


def test_pool_accepts_duplicates():
    """POOL-3, POOL-4: free does not check membership; the list can hold a slot twice and
    ``available`` counts it twice."""
    pool = new_token_pool(2)
    pool = pool_free(pool, [1])
    assert pool.free_list == (1, 0, 1)
    assert pool.available == 3


def test_pool_is_persistent():
    """Allocation and free never change the argument value (stale buffer tail is invisible)."""
    pool0 = new_token_pool(6)
    pool1, _ = pool_allocate(pool0, 4)
    pool2 = pool_free(pool1, [9])
    assert pool0.free_list == (5, 4, 3, 2, 1, 0)
    assert pool1.free_list == (5, 4)
    assert pool2.free_list == (5, 4, 9)
    assert pool_free(new_token_pool(2), [9]) != pool2


def test_prefix_match_len_is_read_only():
    """RADIX-7: no tick, no split; result rounded down to a page."""
    cache = new_radix_cache(100, 2)
    cache, _ = insert(cache, [1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5])
    before = cache
    assert prefix_match_len(cache, [1, 2, 3, 4, 9, 9]) == 4
    assert prefix_match_len(cache, [1, 2, 3]) == 2
    assert prefix_match_len(cache, [1]) == 0
    assert cache == before and cache.num_nodes == 2


def test_split_preserves_suffix_identity_and_copies_state():
    """RADIX-6: the original id keeps the suffix; the intermediate copies lock and time."""
    cache = new_radix_cache(100, 1)
    cache, _ = insert(cache, [1, 2, 3, 4], [10, 11, 12, 13])  # tick 2 insert, 3 child
    cache, (_, leaf) = match_prefix(cache, [1, 2, 3, 4])       # tick 4
    cache, _ = inc_lock_ref(cache, leaf)
    stamp = get_node(cache, leaf).last_access
    assert stamp == 4
    cache, (length, inter) = match_prefix(cache, [1, 2, 9])    # tick 5, splits at 2
    assert length == 2
    assert inter != leaf
    i, s = get_node(cache, inter), get_node(cache, leaf)
    assert (i.key, i.value, s.key, s.value) == ((1, 2), (10, 11), (3, 4), (12, 13))
    assert s.parent == inter and i.children[(3,)] == leaf
    # the split node is not refreshed by the match that split it
    assert i.last_access == stamp and s.last_access == stamp
    assert i.lock_ref == s.lock_ref == 1
    assert cache.protected_size == 4 and cache.evictable_size == 0
    assert get_node(cache, ROOT).last_access == 5
    # the held id still unlocks the whole path
    cache, done = dec_lock_ref(cache, leaf)
    assert done and cache.protected_size == 0 and cache.evictable_size == 4
    assert cache.evictable_leaves == {leaf}


def test_logical_clock_tick_sites():
    """RADIX-4: creation (the root is stamped 1, RADIX-1), each match, each non-empty insert,
    each created child (its own later tick, RADIX-9)."""
    cache = new_radix_cache(10, 2)
    assert cache.tick == 1
    cache, _ = insert(cache, [1], [0])          # aligned length 0: no tick
    assert cache.tick == 1
    cache, _ = insert(cache, [1, 2, 3], [0, 1, 2])  # insert tick 2, child tick 3
    assert cache.tick == 3
    cache, (_, n) = match_prefix(cache, [7, 7])    # one tick even without a hit
    assert cache.tick == 4
    cache, _ = insert(cache, [1, 2], [5, 6])      # full hit: insert tick only
    assert cache.tick == 5
    child = get_node(cache, get_node(cache, ROOT).children[(1, 2)])
    assert child.last_access == 5
    _ = prefix_match_len(cache, [1, 2])
    assert cache.tick == 5


def test_insert_first_writer_wins():
    """RADIX-8: an existing range keeps its slots; later values are ignored (read back with
    RADIX-13 ``path_indices``)."""
    cache = new_radix_cache(100, 2)
    cache, _ = insert(cache, [1, 2, 3, 4], [0, 1, 2, 3])
    cache, _ = insert(cache, [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])
    cache, (length, node) = match_prefix(cache, [1, 2, 3, 4, 5, 6])
    assert length == 6
    assert path_indices(cache, node) == (0, 1, 2, 3, 11, 12)


def test_insert_partial_page_split_and_branch():
    """RADIX-8: a partial match splits at a page boundary and hangs the rest below."""
    cache = new_radix_cache(100, 2)
    cache, _ = insert(cache, [1, 2, 3, 4], [0, 1, 2, 3])
    cache, _ = insert(cache, [1, 2, 5, 6, 7], [4, 5, 6, 7, 8])  # truncated to 4 tokens
    root = get_node(cache, ROOT)
    inter = get_node(cache, root.children[(1, 2)])
    assert inter.key == (1, 2) and inter.value == (0, 1)
    assert sorted(inter.children) == [(3, 4), (5, 6)]
    assert get_node(cache, inter.children[(5, 6)]).value == (6, 7)
    assert cache.evictable_size == 6
    # the intermediate is internal, so only the two leaves are evictable
    assert cache.evictable_leaves == {inter.children[(3, 4)], inter.children[(5, 6)]}


def test_insert_value_too_short_is_rejected():
    """RADIX-8 guard: upstream asserts len(value) >= aligned length."""
    cache = new_radix_cache(10, 2)
    with pytest.raises(InternalInvariantBroken) as err:
        insert(cache, [1, 2, 3, 4], [0, 1, 2])
    assert err.value.rule == "RADIX-8"


def test_dec_lock_ref_stops_at_unlocked_node():
    """RADIX-11, quirk S14: a second unlock stops at the first node already at 0."""
    cache = new_radix_cache(100, 1)
    cache, _ = insert(cache, [1, 2, 3, 4], [0, 1, 2, 3])
    cache, _ = insert(cache, [1, 2, 5], [0, 1, 4])       # splits: [1,2] -> {[3,4], [5]}
    cache, (_, deep) = match_prefix(cache, [1, 2, 3, 4])
    cache, (_, other) = match_prefix(cache, [1, 2, 5])
    inter = get_node(cache, deep).parent
    cache, _ = inc_lock_ref(cache, deep)
    cache, _ = inc_lock_ref(cache, other)
    assert get_node(cache, inter).lock_ref == 2
    cache, done = dec_lock_ref(cache, deep)
    assert done
    cache, done = dec_lock_ref(cache, deep)     # `deep` is already at 0: stop at once
    assert not done
    assert get_node(cache, inter).lock_ref == 1  # ancestors untouched by the early stop
    assert cache.protected_size == 3


def test_lock_root_is_noop():
    """RADIX-10/11: the root is never counted; locking it changes nothing."""
    cache = new_radix_cache(10, 1)
    after, _ = inc_lock_ref(cache, ROOT)
    assert after == cache
    after, done = dec_lock_ref(cache, ROOT)
    assert done and after == cache


def test_evict_cascades_to_parent_and_overshoots():
    """RADIX-12: whole leaves go; a parent freed of children becomes a candidate."""
    cache = new_radix_cache(10, 1)
    cache, _ = insert(cache, [1, 2, 3, 4], [0, 1, 2, 3])
    cache, _ = insert(cache, [1, 2, 5], [0, 1, 4])
    # tree: [1,2](t) -> [3,4], [5]; [5] is the newest leaf
    cache, result = evict(cache, 1)
    assert result == (2, (2, 3))      # oldest leaf [3,4] goes whole: overshoot
    cache, result = evict(cache, 2)
    assert result == (3, (4, 0, 1))   # [5], then its parent, now an unlocked leaf
    assert cache.num_nodes == 1 and cache.evictable_size == 0
    assert cache.pool.free_list[-5:] == (2, 3, 4, 0, 1)


def test_evict_keeps_locked_descendant_path():
    """RADIX-12/14: a locked leaf pins its ancestors; evicting stops when no leaf is free."""
    cache = new_radix_cache(10, 1)
    cache, _ = insert(cache, [1, 2, 3], [0, 1, 2])
    cache, (_, node) = match_prefix(cache, [1, 2, 3])
    cache, _ = inc_lock_ref(cache, node)
    cache, result = evict(cache, 5)
    assert result == (0, ())
    assert cache.protected_size == 3


def test_evict_zero_is_noop():
    cache = new_radix_cache(10, 1)
    cache, _ = insert(cache, [1], [0])
    after, result = evict(cache, 0)
    assert result == (0, ()) and after == cache


def test_unknown_node_id_is_rejected():
    """RADIX-15: ids are never reused; an evicted id is gone for good."""
    cache = new_radix_cache(10, 1)
    cache, _ = insert(cache, [1], [0])
    cache, (_, node) = match_prefix(cache, [1])
    cache, _ = evict(cache, 1)
    for op in (inc_lock_ref, dec_lock_ref, get_node, path_indices):
        with pytest.raises(InternalInvariantBroken) as err:
            op(cache, node)
        assert err.value.rule == "RADIX-15"
    cache, _ = insert(cache, [2], [0])
    assert node not in cache.nodes


def test_constructor_guards():
    """RADIX-1, POOL-1: the page size must be at least 1 and the pool size non-negative."""
    with pytest.raises(InvalidInput):
        new_radix_cache(10, 0)
    with pytest.raises(InvalidInput):
        new_token_pool(-1)
