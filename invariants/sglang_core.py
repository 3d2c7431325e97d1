"""Invariants of the SGLang core (spec/sglang-core.md §7, spec/kv-sglang.md).

Each predicate returns ``None`` when it holds and a short message otherwise.
Two reproduced upstream quirks break plain slot conservation; the slot
invariant is written in its quirk-aware form and names them:

* SGQ-3 (leak): retraction and cancel free only ``kv_indices[cached_tokens:]``,
  so a request's own duplicate slots below ``cached_tokens`` (pages the tree
  already held when the request cached them) are never freed;
* SGQ-4 (double free): a request retracted in the pass that admitted it with a
  prefix hit frees the tree's prefix slots while the tree keeps them; the pool
  list then holds a slot the tree still owns, and a later eviction frees it
  again (a duplicate in the free list).
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Tuple

from model.radix_cache import ROOT, CacheTxn
from model.sglang_core import HeldSglangPrefill, SglangCore

from .handoff import ledger_roles


def _live_requests(core: SglangCore):
    """Every request that holds KV or a lock: the three queues and the held sources."""
    out = list(core.waiting) + list(core.prebuilt_ready) + list(core.running)
    for payload in core.ledger.source_holds.held_payloads():
        if isinstance(payload, HeldSglangPrefill):
            out.append(payload.request)
    return out


def _reservations(core: SglangCore):
    return [held.kv for held in core.ledger.destination_holds.payloads()]


def _tree_slots(cache) -> Tuple[List[int], Dict[int, int]]:
    values: List[int] = []
    for node_id, node in cache.nodes.items():
        if node_id != cache.root:
            values.extend(node.value)
    return values, {}


def _own_slots(txn: CacheTxn, req) -> List[int]:
    """The slots a request holds that are not the tree's slot for their position."""
    kv = req.kv_indices
    path = txn.path_indices(req.last_node) if req.last_node is not None else ()
    out = []
    for i, s in enumerate(kv):
        if i >= len(path) or path[i] != s:
            out.append(s)
    return out


def slot_conservation(core: SglangCore) -> Optional[str]:
    """SG-34 (quirk-aware; SGQ-3, SGQ-4): with F the pool's free list, T the tree's slots, P the
    requests' own slots (scheduler-owned and held sources: slots that are not the tree's slot for
    their position) and U the destination reservations' unpublished slots,
    ``|F| + |T| + |P| + |U| + leaked = pool size + double_freed`` (the ghost counters of SGQ-3 and
    SGQ-4); every slot id is in range; and while no double free happened, F, T, P and U are
    pairwise disjoint and free of duplicates (each slot is in exactly one place or leaked)."""
    cache = core.kv.cache
    total = cache.pool.total
    free = list(cache.pool.free_list)
    tree, _ = _tree_slots(cache)
    txn = CacheTxn(cache)
    own: List[int] = []
    for req in _live_requests(core):
        own.extend(_own_slots(txn, req))
    unpublished: List[int] = []
    for res in _reservations(core):
        unpublished.extend(res.unpublished_indices)
    lhs = len(free) + len(tree) + len(own) + len(unpublished) + core.leaked_slots
    rhs = total + core.double_freed_slots
    if lhs != rhs:
        return (f"|free| {len(free)} + |tree| {len(tree)} + |own| {len(own)} + |reserved| {len(unpublished)}"
                f" + leaked {core.leaked_slots} != pool {total} + double-freed {core.double_freed_slots}")
    for name, slots in (("free", free), ("tree", tree), ("own", own), ("reserved", unpublished)):
        bad = [s for s in slots if not 0 <= s < total]
        if bad:
            return f"{name} slots out of range: {bad[:5]}"
    if core.double_freed_slots == 0:
        counts = Counter(free)
        counts.update(tree)
        counts.update(own)
        counts.update(unpublished)
        dup = [s for s, c in counts.items() if c > 1]
        if dup:
            return f"slots held twice without a double free: {sorted(dup)[:5]}"
    return None


def lock_counts(core: SglangCore) -> Optional[str]:
    """SG-35 (RADIX-10/11): every node's lock count equals the number of holders whose locked node
    is the node or one of its descendants (live requests, held sources, destination reservations);
    no count is negative; protected and evictable sizes match the locked and unlocked nodes."""
    cache = core.kv.cache
    nodes = cache.nodes
    expected: Counter = Counter()
    holders = [r.last_node for r in _live_requests(core) if r.last_node is not None]
    holders.extend(res.last_node for res in _reservations(core))
    for node_id in holders:
        if node_id not in nodes:
            return f"a holder locks missing node {node_id}"
        cur = node_id
        while cur is not None and cur != cache.root:
            expected[cur] += 1
            cur = nodes[cur].parent
    protected = evictable = 0
    for node_id, node in nodes.items():
        if node_id == cache.root:
            continue
        if node.lock_ref < 0:
            return f"node {node_id} has lock count {node.lock_ref}"
        if node.lock_ref != expected.get(node_id, 0):
            return f"node {node_id} lock count {node.lock_ref}, holders {expected.get(node_id, 0)}"
        if node.lock_ref > 0:
            protected += len(node.key)
        else:
            evictable += len(node.key)
    if (protected, evictable) != (cache.protected_size, cache.evictable_size):
        return (f"protected/evictable {cache.protected_size}/{cache.evictable_size}, "
                f"nodes say {protected}/{evictable}")
    return None


def queues_consistent(core: SglangCore) -> Optional[str]:
    """SG-2 / SG-4 (upstream I19): every scheduler-owned id is in exactly one queue once; every
    request satisfies upstream's field assertions (quirk SGQ-10: an activated empty-prompt
    destination holds the root as its locked node with nothing materialized); waiting requests
    are either untouched, retracted (no KV) or a partial chunk; prebuilt and running requests are
    fully materialized; held sources are not scheduler-owned."""
    bs = core.config.block_size
    seen = set()
    for name, queue in (("waiting", core.waiting), ("prebuilt", core.prebuilt_ready), ("running", core.running)):
        for r in queue:
            if r.uuid in seen:
                return f"{r.uuid!r} appears twice across the queues"
            seen.add(r.uuid)
            problem = r.field_problems(bs)
            if problem is not None and not (r.last_node == ROOT and r.materialized_tokens == 0 and not r.prompt):
                return f"{name} {r.uuid!r}: {problem}"
            if name == "waiting":
                if r.materialized_tokens >= r.current_sequence_len and r.materialized_tokens > 0:
                    return f"waiting {r.uuid!r} is fully materialized"
            elif r.materialized_tokens != r.current_sequence_len:
                return f"{name} {r.uuid!r} materialized {r.materialized_tokens} of {r.current_sequence_len}"
    return None


def roles_consistent(core: SglangCore) -> Optional[str]:
    """LEDGER-1 with the scheduler (upstream I5, I7): pending sources and active destinations are
    scheduler-owned; held sources and pending or reserved destinations are not."""
    return ledger_roles(core.ledger, {r.uuid for r in core.requests()})


def ratio_in_range(core: SglangCore) -> Optional[str]:
    """SG-9: ``min_new_token_ratio <= new_token_ratio <= init_new_token_ratio`` (for a
    non-negative conservativeness; a negative one inverts the bounds, upstream S15)."""
    cfg = core.config
    lo, hi = sorted((cfg.min_new_token_ratio, cfg.init_new_token_ratio))
    if not lo <= core.new_token_ratio <= hi:
        return f"new_token_ratio {core.new_token_ratio} outside [{lo}, {hi}]"
    return None


from . import Invariant  # noqa: E402

INVARIANTS = (
    Invariant("sglang_slot_conservation", "SG-34", SglangCore, slot_conservation, slot_conservation.__doc__,
              quirk="SGQ-3 (retraction/cancel leak duplicate slots), SGQ-4 (same-pass retraction double free)"),
    Invariant("sglang_lock_counts", "SG-35", SglangCore, lock_counts, lock_counts.__doc__),
    Invariant("sglang_queues_consistent", "SG-4", SglangCore, queues_consistent, queues_consistent.__doc__,
              quirk="SGQ-10 (activated empty-prompt destination)"),
    Invariant("sglang_roles_consistent", "LEDGER-1", SglangCore, roles_consistent, roles_consistent.__doc__),
    Invariant("sglang_new_token_ratio_in_range", "SG-9", SglangCore, ratio_in_range, ratio_in_range.__doc__),
)
