"""The vLLM KV block manager: kvbm-logical pools as a pure state machine.

Normative text: spec/kv-vllm.md, rules KV-1..KV-26 (eviction order KV-13..KV-17).

Every operation is a pure function ``op(state, ...) -> (new_state, result)``;
KV events are part of the result.  A call that upstream would reject with a
panic raises a :mod:`model.errors` subclass and leaves the caller's state
untouched (the state is immutable and a new one is only built on success).

Physical model (KV-1): ``N`` slots, each in exactly one of

* the **reset** pool (free, never used or released unregistered),
* the **inactive** pool (registered, no holder, matchable, evictable),
* the **active** pool (held): a *mutable* slot (a partial block, or a slot
  reserved for a destination / decode reservation) or a *registered* block
  with at least one holder.

so that ``N = reset + inactive + active`` at all times.
"""

from __future__ import annotations

from typing import Iterable, Optional, Union

import attrs
from pyrsistent import PMap, pmap, pvector

from model.errors import CommandRejected, InternalInvariantBroken, InvalidInput, check_reservation
from model.frozen import EMPTY as FROZEN_EMPTY
from model.frozen import FrozenDict, adopt, draft
from model.hashing import Plh
from model.kv_events import KvCacheEvent, KvRemoved, KvStored, StoredBlock
from model.sequence import (
    ActiveSequence,
    Deref,
    FullBlock,
    PartialBlock,
    Promote,
    Signal,
    Use,
    prepare_allocation,
)

NodeKey = tuple  # (position, fragment)


def _frozen(value) -> FrozenDict:
    """Maps of the KV state are FrozenDicts: reads at dict speed, copied in C per operation."""
    return value if type(value) is FrozenDict else FrozenDict(value)

# ---------------------------------------------------------------------------
# Persistent leftist min-heap of (tick, node key) entries (eviction order).
# A heap node is the tuple (rank, tick, key, left, right); None is empty.
# ---------------------------------------------------------------------------


def _heap_merge(a, b):
    """Leftist-heap merge: walk down the right spines keeping the smaller root, then rebuild
    bottom-up, swapping children so the left rank is never smaller (the recursive definition,
    unrolled)."""
    spine = []
    while a is not None and b is not None:
        if b[1] < a[1]:
            a, b = b, a
        spine.append(a)
        a = a[4]
    merged = b if a is None else a
    for node in reversed(spine):
        left = node[3]
        if (left[0] if left is not None else 0) < merged[0]:
            left, merged = merged, left
        merged = ((merged[0] if merged is not None else 0) + 1, node[1], node[2], left, merged)
    return merged


def _heap_push(heap, tick: int, key):
    return _heap_merge(heap, (1, tick, key, None, None))


def _heap_build(items: Iterable[tuple[int, object]]):
    level = [(1, t, k, None, None) for t, k in items]
    if not level:
        return None
    while len(level) > 1:
        nxt = [_heap_merge(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


# ---------------------------------------------------------------------------
# Lineage inactive index (KV-13..KV-17)
# ---------------------------------------------------------------------------


@attrs.frozen
class LineageNode:
    """A node of the lineage forest: Real (``plh`` set, ``tick`` set) or Ghost (both None).

    ``parent`` is the parent's node key (None for a root or an unlinked
    placeholder); ``n_children`` counts the nodes linked under it.
    """

    plh: Optional[Plh]
    parent: Optional[NodeKey]
    n_children: int
    tick: Optional[int]


@attrs.frozen
class LineageIndex:
    """KV-13: the inactive index.  ``leaves`` maps tick -> node key for every Real leaf.

    ``heap`` is a lazily cleaned min-heap over ``(tick, key)``: an entry is
    live iff ``leaves`` maps its tick to its key.
    """

    nodes: FrozenDict = attrs.field(default=FROZEN_EMPTY, converter=_frozen)
    leaves: FrozenDict = attrs.field(default=FROZEN_EMPTY, converter=_frozen)
    heap: object = None
    heap_len: int = 0
    next_tick: int = 0
    count: int = 0

    def has(self, plh: Plh) -> bool:
        node = self.nodes.get(plh.lineage_key())
        return node is not None and node.plh == plh

    def leaf_order(self) -> list[Plh]:
        """Real leaves in eviction order (smallest tick first).  For tests and reports."""
        return [self.nodes[self.leaves[t]].plh for t in sorted(self.leaves.keys())]


class _LineageTxn:
    """Mutable working copy of a :class:`LineageIndex` for one operation."""

    __slots__ = ("nodes", "leaves", "heap", "heap_len", "next_tick", "count")

    def __init__(self, idx: LineageIndex) -> None:
        self.nodes = draft(idx.nodes)
        self.leaves = draft(idx.leaves)
        self.heap = idx.heap
        self.heap_len = idx.heap_len
        self.next_tick = idx.next_tick
        self.count = idx.count

    def finish(self) -> LineageIndex:
        leaves = adopt(self.leaves)
        heap, heap_len = self.heap, self.heap_len
        if heap_len > 2 * len(leaves) + 64:
            # drop dead entries (KV-17 bookkeeping only; no semantic effect)
            heap = _heap_build(sorted((t, k) for t, k in leaves.items()))
            heap_len = len(leaves)
        return LineageIndex(adopt(self.nodes), leaves, heap, heap_len, self.next_tick, self.count)

    def _add_leaf(self, key, tick: int) -> None:
        self.leaves[tick] = key
        self.heap = _heap_push(self.heap, tick, key)
        self.heap_len += 1

    def insert(self, plh: Plh) -> None:
        """KV-14: a registered block becomes inactive."""
        nodes = self.nodes
        key = plh.lineage_key()
        tick = self.next_tick
        ghost = nodes.get(key)
        if ghost is not None:
            if ghost.plh is not None:
                what = "duplicate insertion" if ghost.plh == plh else "hash collision"
                raise InternalInvariantBroken(f"lineage index: {what} at {key}", rule="KV-14")
            link, n_children = ghost.parent, ghost.n_children
        else:
            link, n_children = None, 0
        self.next_tick = tick + 1
        self.count += 1
        pkey = plh.parent_key()
        if pkey is not None and link is None:
            parent = nodes.get(pkey)
            if parent is None:
                nodes[pkey] = LineageNode(None, None, 1, None)  # a Ghost placeholder
            else:
                if parent.n_children == 0 and parent.plh is not None:
                    del self.leaves[parent.tick]  # a Real leaf becomes interior
                nodes[pkey] = LineageNode(parent.plh, parent.parent, parent.n_children + 1, parent.tick)
            link = pkey
        nodes[key] = LineageNode(plh, link, n_children, tick)
        if n_children == 0:
            self._add_leaf(key, tick)

    def remove_key(self, key) -> Plh:
        """KV-15: the Real node at ``key`` leaves the index (evicted or matched)."""
        nodes = self.nodes
        node = nodes[key]
        plh = node.plh
        if node.n_children == 0 and node.tick in self.leaves:
            del self.leaves[node.tick]
        self.count -= 1
        if node.n_children > 0:
            nodes[key] = LineageNode(None, node.parent, node.n_children, None)  # stays as a Ghost
            return plh
        del nodes[key]
        pkey = node.parent
        while pkey is not None:  # walk up: unlink, dropping Ghosts left without children
            parent = nodes[pkey]
            n_children = parent.n_children - 1
            if n_children > 0:
                nodes[pkey] = LineageNode(parent.plh, parent.parent, n_children, parent.tick)
                break
            if parent.plh is not None:
                nodes[pkey] = LineageNode(parent.plh, parent.parent, n_children, parent.tick)
                self._add_leaf(pkey, parent.tick)  # re-leafed with its original tick
                break
            del nodes[pkey]
            pkey = parent.parent
        return plh

    def remove_plh(self, plh: Plh) -> bool:
        """KV-15: remove the block ``plh`` if it is a Real node with exactly this PLH."""
        key = plh.lineage_key()
        if key not in self.nodes:
            return False
        node = self.nodes[key]
        if node.plh != plh:
            return False
        self.remove_key(key)
        return True

    def evict_one(self) -> Optional[Plh]:
        """KV-16: remove and return the Real leaf with the smallest tick.

        Its consequences need no code of their own: in practice the least recently
        released chain's deepest block goes first (KV-18), and with prefix caching off
        every block is a leaf, so eviction is first-released-first-evicted (KV-19).
        """
        leaves = self.leaves
        heap = self.heap
        while heap is not None:
            tick, key = heap[1], heap[2]
            heap = _heap_merge(heap[3], heap[4])
            self.heap_len -= 1
            if tick in leaves and leaves[tick] == key:
                self.heap = heap
                return self.remove_key(key)
        self.heap = heap
        return None


# ---------------------------------------------------------------------------
# Manager state
# ---------------------------------------------------------------------------


@attrs.frozen
class PrefillCost:
    """KV-11: what the admission policy reads about a sequence's cached prefix."""

    new_blocks: int
    new_tokens: int
    cached_tokens: int
    active_cached_tokens: int


@attrs.frozen
class DestinationReservation:
    """KV-23: KV held for a disaggregated decode destination until activation or cancel.

    ``prefix`` holds one handle per cached leading full block
    ``(seq_hash, plh)``; ``unpublished`` counts the mutable slots reserved
    for the rest of ``layout``.
    """

    reservation_id: int
    prefix: tuple[tuple[int, Plh], ...]
    unpublished: int
    layout: Optional[Use]

    def transferable_prompt_tokens(self, block_size: int) -> int:
        """KV-23: ``unpublished * block_size`` (a trailing partial counts as a full block)."""
        return self.unpublished * block_size


@attrs.frozen
class DecodeReservation:
    """KV-26: slots reserved for the speculative (MTP) decode path."""

    reservation_id: int


@attrs.frozen
class VllmKvState:
    """KV-1..KV-3: the whole block manager.

    * ``reset``: free slots; ``mutable``: slots held as mutable blocks.
    * ``registry``: registered blocks not yet evicted, ``plh -> holders``
      (live handles; 0 means the block is in the inactive index).
    * ``shadow``: the manager's own record of what it registered,
      ``plh -> seq_hash`` (upstream ``registered_blocks``; read by the
      prefill cost and by Removed events).
    * ``active_full``: ``seq_hash -> pvector of plh`` handles; the length is
      the request-level reference count.
    * ``active_partial``: partial block id -> None.
    * ``destinations`` / ``decode_reservations``: outstanding reservations.
    """

    num_blocks: int
    block_size: int
    dp_rank: int
    publish_events: bool
    reset: int
    mutable: int
    registry: FrozenDict = attrs.field(converter=_frozen)
    shadow: FrozenDict = attrs.field(converter=_frozen)
    active_full: FrozenDict = attrs.field(converter=_frozen)
    active_partial: FrozenDict = attrs.field(converter=_frozen)
    lineage: LineageIndex
    destinations: PMap
    decode_reservations: PMap
    next_event_id: int = 0
    next_reservation_id: int = 0




def new_kv_manager(
    num_blocks: int, block_size: int, *, dp_rank: int = 0, publish_events: bool = False
) -> VllmKvState:
    """KV-1: an empty manager with ``num_blocks`` reset slots.

    Rule: KV-1.  ``publish_events`` is true when a KV event sink exists and
    prefix caching is on (KV-20); with it false no events are produced and
    event ids do not advance.
    """
    # the block manager's builder asserts these, in this order, also in release builds
    # (kvbm-logical manager/builder.rs:185-195): upstream panics, the model refuses the input
    if not 1 <= block_size <= 1024:
        raise InvalidInput("block_size", block_size, f"block_size must be between 1 and 1024, got {block_size}",
                           rule="KV-1")
    if block_size & (block_size - 1):
        raise InvalidInput("block_size", block_size, f"block_size must be a power of 2, got {block_size}",
                           rule="KV-1")
    if num_blocks < 1:
        raise InvalidInput("num_gpu_blocks", num_blocks, "must be >= 1", rule="KV-1")
    # the eviction index reserves one 16-byte entry per block (pools/inactive/backends/lineage/
    # eviction.rs:214 via manager/builder.rs:434): 2^59 blocks panic, 2^58 abort upstream
    check_reservation("num_gpu_blocks", num_blocks, num_blocks, 16, "KV-1")
    return VllmKvState(
        num_blocks=num_blocks,
        block_size=block_size,
        dp_rank=dp_rank,
        publish_events=publish_events,
        reset=num_blocks,
        mutable=0,
        registry=pmap(),
        shadow=pmap(),
        active_full=pmap(),
        active_partial=pmap(),
        lineage=LineageIndex(),
        destinations=pmap(),
        decode_reservations=pmap(),
    )


# -- metrics ----------------------------------------------------------------


def num_inactive_blocks(state: VllmKvState) -> int:
    """KV-2: blocks in the inactive pool."""
    return state.lineage.count


def num_active_blocks(state: VllmKvState) -> int:
    """KV-2: distinct held slots, ``N - reset - inactive``."""
    return state.num_blocks - state.reset - state.lineage.count


def num_active_block_refs(state: VllmKvState) -> int:
    """KV-2: held request-level handles: partial blocks plus full-block references."""
    return len(state.active_partial) + sum(len(v) for v in state.active_full.values())


def active_perc(state: VllmKvState) -> float:
    """KV-2: ``num_active_blocks / N`` (the cache usage metric)."""
    return num_active_blocks(state) / state.num_blocks


def refcount(state: VllmKvState, seq_hash: int) -> int:
    """KV-3: request-level references to the full block ``seq_hash``."""
    v = state.active_full.get(seq_hash)
    return len(v) if v is not None else 0


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@attrs.frozen
class Processed:
    """Result of :func:`process`: ``count`` blocks handled, and the events published."""

    count: int
    events: tuple[KvCacheEvent, ...] = ()


@attrs.frozen
class Reserved:
    """Result of :func:`reserve_destination` / :func:`reserve_decode_blocks`."""

    reservation: Union[DestinationReservation, DecodeReservation, None]
    events: tuple[KvCacheEvent, ...] = ()


@attrs.frozen
class Activated:
    """Result of :func:`activate_destination`: per full block of the uncached layout,
    ``"Stored"`` or ``"Reused"`` (KV-24), and the events published."""

    commits: tuple[str, ...]
    events: tuple[KvCacheEvent, ...] = ()


# ---------------------------------------------------------------------------
# Transaction: a mutable working copy of the state for one operation
# ---------------------------------------------------------------------------


class _Txn:
    __slots__ = (
        "s", "reset", "mutable", "registry", "shadow", "active_full", "active_partial",
        "lineage", "events", "next_event_id",
    )

    def __init__(self, s: VllmKvState) -> None:
        self.s = s
        self.reset = s.reset
        self.mutable = s.mutable
        self.registry = draft(s.registry)
        self.shadow = draft(s.shadow)
        self.active_full = draft(s.active_full)
        self.active_partial = draft(s.active_partial)
        self.lineage = _LineageTxn(s.lineage)
        self.events: list[KvCacheEvent] = []
        self.next_event_id = s.next_event_id

    def finish(self, destinations=None, decode_reservations=None, next_reservation_id=None) -> VllmKvState:
        s = self.s
        return VllmKvState(
            s.num_blocks,
            s.block_size,
            s.dp_rank,
            s.publish_events,
            self.reset,
            self.mutable,
            adopt(self.registry),
            adopt(self.shadow),
            adopt(self.active_full),
            adopt(self.active_partial),
            self.lineage.finish(),
            s.destinations if destinations is None else destinations,
            s.decode_reservations if decode_reservations is None else decode_reservations,
            self.next_event_id,
            s.next_reservation_id if next_reservation_id is None else next_reservation_id,
        )

    # -- events (KV-20..KV-22) ---------------------------------------------

    def publish(self, data) -> None:
        if not self.s.publish_events:
            return
        self.events.append(KvCacheEvent(self.next_event_id, self.s.dp_rank, data))
        self.next_event_id += 1

    def publish_stored(self, seq_hashes, local_hashes, parent_hash, token_ids) -> None:
        """KV-21: one Stored event; ``tokens_hash`` is the i-th local hash or 0."""
        if not seq_hashes or not self.s.publish_events:
            return
        blocks = tuple(
            StoredBlock(h, local_hashes[i] if i < len(local_hashes) else 0)
            for i, h in enumerate(seq_hashes)
        )
        self.publish(KvStored(parent_hash, blocks, None if token_ids is None else tuple(token_ids)))

    def handle_evictions(self, evicted: list[Plh]) -> None:
        """KV-22: forget evicted blocks and publish one Removed for those the manager knew."""
        removed = []
        for plh in evicted:
            if plh in self.shadow:
                removed.append(self.shadow[plh])
                del self.shadow[plh]
        if removed:
            self.publish(KvRemoved(tuple(removed)))

    # -- handles on registered blocks (KV-4, KV-5) ------------------------

    def acquire(self, plh: Plh) -> bool:
        """KV-5: take a handle on the registered block ``plh`` (active, or resurrected)."""
        reg = self.registry
        if plh in reg:
            holders = reg[plh]
            if holders > 0:
                reg[plh] = holders + 1
                return True
            if not self.lineage.remove_plh(plh):
                raise InternalInvariantBroken(f"inactive block {plh!r} missing from the index", rule="KV-4")
            reg[plh] = 1
            return True
        return False

    def release(self, plh: Plh) -> None:
        """KV-4: drop a handle; the last one sends the block to the inactive index."""
        holders = self.registry[plh] - 1
        self.registry[plh] = holders
        if holders == 0:
            self.lineage.insert(plh)

    def register(self, plh: Plh) -> None:
        """KV-7: a staged mutable slot becomes the registered primary of ``plh``."""
        if plh in self.registry:
            raise InternalInvariantBroken(f"block {plh!r} registered twice", rule="KV-7")
        self.registry[plh] = 1

    # -- allocation (KV-12) -------------------------------------------------

    def allocate(self, count: int) -> Optional[list[Plh]]:
        """KV-12: take ``count`` slots, reset first then evictions; all or nothing."""
        if count == 0:
            return []
        if self.reset + self.lineage.count < count:
            return None
        from_reset = min(count, self.reset)
        self.reset -= from_reset
        evicted = []
        for _ in range(count - from_reset):
            plh = self.lineage.evict_one()
            if plh is None:  # pragma: no cover - excluded by the count check
                raise InternalInvariantBroken("inactive index shorter than its count", rule="KV-12")
            del self.registry[plh]
            evicted.append(plh)
        self.mutable += count
        return evicted

    def drop_mutable(self, n: int = 1) -> None:
        """A mutable slot is released unregistered: back to the reset pool."""
        self.mutable -= n
        self.reset += n

    # -- full-block commit shared by Promote and activation (KV-10, KV-24) ---

    def acquire_existing_full(self, seq_hash: int, plh: Plh) -> Optional[Plh]:
        handles = self.active_full[seq_hash] if seq_hash in self.active_full else None
        if handles is not None:
            first = handles[0]
            self.registry[first] = self.registry[first] + 1
            return first
        if self.acquire(plh):
            return plh
        return None

    def push_handle(self, seq_hash: int, plh: Plh) -> None:
        af = self.active_full
        af[seq_hash] = (af[seq_hash] if seq_hash in af else pvector()).append(plh)

    def commit_active_full(self, seq_hash: int, plh: Plh, seq_hash_for_shadow: int) -> str:
        """Commit one mutable slot (already counted in ``mutable``) as full block ``seq_hash``."""
        existing = self.acquire_existing_full(seq_hash, plh)
        if existing is not None:
            self.drop_mutable()
            self.push_handle(seq_hash, existing)
            return "Reused"
        self.mutable -= 1
        self.register(plh)
        self.push_handle(seq_hash, plh)
        self.shadow[plh] = seq_hash_for_shadow
        return "Stored"


def _full_count(blocks) -> int:
    return sum(1 for b in blocks if isinstance(b, FullBlock))


def _check_use(sig: Use) -> int:
    n_full = _full_count(sig.blocks)
    if len(sig.plhs) != n_full:
        raise InternalInvariantBroken("Use: plhs must match the FullBlock count", rule="KV-6")
    if sig.hashes and len(sig.hashes) != n_full:
        raise InternalInvariantBroken("Use: local hashes must be empty or match the FullBlock count", rule="KV-6")
    if sig.token_ids is not None and len(sig.token_ids) != n_full:
        raise InternalInvariantBroken("Use: token_ids must be absent or match the FullBlock count", rule="KV-6")
    if isinstance(sig.parent, PartialBlock):
        raise InternalInvariantBroken("Use: parent block cannot be partial", rule="KV-6")
    return n_full


def _process_use(t: _Txn, sig: Use, reservation_left: Optional[int] = None) -> tuple[int, Optional[int]]:
    """KV-6..KV-8 on a transaction.  Returns (blocks handled, reservation slots left)."""
    _check_use(sig)
    stored: list[int] = []
    stored_local: list[int] = []
    stored_tokens: Optional[list] = [] if sig.token_ids is not None else None
    evicted: list[Plh] = []
    parent_block = sig.parent
    plh_idx = 0
    done = 0
    for block in sig.blocks:
        if isinstance(block, FullBlock):
            full_idx = plh_idx
            plh = sig.plhs[plh_idx]
            plh_idx += 1
            af = t.active_full
            if block.seq_hash in af:  # ActiveHit
                handles = af[block.seq_hash]
                first = handles[0]
                t.registry[first] = t.registry[first] + 1
                af[block.seq_hash] = handles.append(first)
                parent_block = block
            elif t.acquire(plh):  # InactiveHit
                t.push_handle(block.seq_hash, plh)
                parent_block = block
            else:  # NewStore
                if reservation_left is not None:
                    if reservation_left == 0:
                        break
                    reservation_left -= 1
                else:
                    got = t.allocate(1)
                    if got is None:
                        break
                    evicted.extend(got)
                t.mutable -= 1
                t.register(plh)
                t.push_handle(block.seq_hash, plh)
                t.shadow[plh] = block.seq_hash
                stored.append(block.seq_hash)
                if full_idx < len(sig.hashes):
                    stored_local.append(sig.hashes[full_idx])
                if stored_tokens is not None:
                    stored_tokens.append(tuple(sig.token_ids[full_idx]))
        else:
            if block not in t.active_partial:
                if reservation_left is not None:
                    if reservation_left == 0:
                        break
                    reservation_left -= 1
                else:
                    got = t.allocate(1)
                    if got is None:
                        break
                    evicted.extend(got)
                t.active_partial[block] = None
        done += 1
    parent_hash = parent_block.seq_hash if parent_block is not None else None
    t.publish_stored(stored, stored_local, parent_hash, stored_tokens)
    t.handle_evictions(evicted)
    return done, reservation_left


def _process_deref(t: _Txn, sig: Deref) -> None:
    """KV-9."""
    for block in sig.blocks:
        if isinstance(block, PartialBlock):
            if block not in t.active_partial:
                raise InternalInvariantBroken("Deref: partial block not in active pool", rule="KV-9")
            del t.active_partial[block]
            t.drop_mutable()
        else:
            af = t.active_full
            if block.seq_hash not in af:
                raise InternalInvariantBroken("Deref: full block not in active pool", rule="KV-9")
            handles = af[block.seq_hash]
            plh = handles[-1]
            if len(handles) == 1:
                del af[block.seq_hash]
            else:
                af[block.seq_hash] = handles.delete(len(handles) - 1)
            t.release(plh)


def _process_promote(t: _Txn, sig: Promote) -> None:
    """KV-10."""
    if sig.partial not in t.active_partial:
        raise InternalInvariantBroken("Promote: partial block not found", rule="KV-10")
    del t.active_partial[sig.partial]
    commit = t.commit_active_full(sig.seq_hash, sig.plh, sig.seq_hash)
    if commit == "Stored":
        t.publish_stored(
            [sig.seq_hash],
            [sig.local_hash] if sig.local_hash is not None else [],
            sig.parent_hash,
            None if sig.token_ids is None else [tuple(sig.token_ids)],
        )


def process(state: VllmKvState, signal: Signal) -> tuple[VllmKvState, Processed]:
    """KV-6/KV-9/KV-10: apply one block signal.

    Rule: KV-6 (Use: ``count`` = blocks handled before the first allocation
    failure), KV-9 (Deref: ``count`` = 1), KV-10 (Promote: ``count`` = 1).
    """
    t = _Txn(state)
    if isinstance(signal, Use):
        count, _ = _process_use(t, signal)
    elif isinstance(signal, Deref):
        _process_deref(t, signal)
        count = 1
    elif isinstance(signal, Promote):
        _process_promote(t, signal)
        count = 1
    else:
        raise InternalInvariantBroken(f"unknown block signal {signal!r}", rule="KV-6")
    return t.finish(), Processed(count, tuple(t.events))


class KvSession:
    """KV-6/KV-9/KV-10/KV-11 on one working copy: a batch of signal applications.

    A core that applies many signals in one operation (a whole pass) opens one
    session, applies them in order, and calls :meth:`finish` once; the result is
    the same state and the same events, in the same order, as calling
    :func:`process` once per signal.  The session is scratch inside one pure
    operation and must not outlive it.
    """

    __slots__ = ("_t", "block_size", "num_blocks")

    def __init__(self, state: VllmKvState) -> None:
        self._t = _Txn(state)
        self.block_size = state.block_size
        self.num_blocks = state.num_blocks

    # read by get_prefill_cost (KV-11)
    @property
    def active_full(self):
        return self._t.active_full

    @property
    def shadow(self):
        return self._t.shadow

    def process(self, signal: Signal) -> int:
        """Apply one signal; returns what :func:`process` would report as ``count``."""
        t = self._t
        if isinstance(signal, Use):
            count, _ = _process_use(t, signal)
            return count
        if isinstance(signal, Deref):
            _process_deref(t, signal)
            return 1
        if isinstance(signal, Promote):
            _process_promote(t, signal)
            return 1
        raise InternalInvariantBroken(f"unknown block signal {signal!r}", rule="KV-6")

    def process_each(self, signals) -> None:
        """:meth:`process` on each signal in order, results dropped (a completion's Derefs)."""
        t = self._t
        for signal in signals:
            if type(signal) is Deref:
                _process_deref(t, signal)
            else:
                self.process(signal)

    def num_active_blocks(self) -> int:
        """KV-2 on the working copy."""
        t = self._t
        return self.num_blocks - t.reset - t.lineage.count

    def prefill_cost(self, seq: ActiveSequence) -> PrefillCost:
        return get_prefill_cost(self, seq)

    def finish(self) -> tuple[VllmKvState, tuple[KvCacheEvent, ...]]:
        return self._t.finish(), tuple(self._t.events)


# ---------------------------------------------------------------------------
# Prefill cost (KV-11)
# ---------------------------------------------------------------------------


def get_prefill_cost(state: VllmKvState, seq: ActiveSequence) -> PrefillCost:
    """KV-11: the cached prefix of ``seq`` as the admission policy sees it.

    Rule: KV-11.  Walk the unique blocks: a full block held by some request
    counts as cached and *active*; otherwise one this manager registered and
    has not evicted counts as cached; the walk stops at the first miss or at
    the partial block.  With prefix caching off nothing is cached.
    """
    blocks = seq.unique_blocks
    overlap = active = 0
    if seq.enable_prefix_caching:
        plhs = seq.plhs
        af = state.active_full
        shadow = state.shadow
        for i, b in enumerate(blocks):
            if not isinstance(b, FullBlock):
                break
            if b.seq_hash in af:
                overlap += 1
                active += 1
                continue
            if i >= len(plhs):
                break
            if plhs[i] in shadow:
                overlap += 1
            else:
                break
    p = seq.num_input_tokens
    bs = state.block_size
    cached = min(overlap * bs, p)
    return PrefillCost(
        new_blocks=len(blocks) - overlap,
        new_tokens=p - cached,
        cached_tokens=cached,
        active_cached_tokens=min(active * bs, p),
    )


# ---------------------------------------------------------------------------
# Destination reservations (KV-23..KV-25)
# ---------------------------------------------------------------------------


def reserve_destination(state: VllmKvState, seq: ActiveSequence) -> tuple[VllmKvState, Reserved]:
    """KV-23: reserve KV for a decode destination's prompt.

    Rule: KV-23.  The layout is ``prepare_allocation(seq, P)``.  Leading full
    blocks that are cached are acquired (active: another handle; inactive:
    resurrected), stopping at the first miss or partial block; then the rest
    is allocated atomically as unpublished mutable slots.  On failure the
    acquired prefix handles are released again, first block first, and the
    result carries no reservation -- the state still changes (resurrected
    blocks re-enter the inactive index with new ticks).
    """
    layout = prepare_allocation(seq, seq.num_input_tokens)
    rid = state.next_reservation_id
    if layout is None:
        res = DestinationReservation(rid, (), 0, None)
        return (
            attrs.evolve(state, destinations=state.destinations.set(rid, res), next_reservation_id=rid + 1),
            Reserved(res, ()),
        )
    t = _Txn(state)
    prefix = []
    for i, block in enumerate(layout.blocks):
        if not isinstance(block, FullBlock):
            break
        got = t.acquire_existing_full(block.seq_hash, layout.plhs[i])
        if got is None:
            break
        prefix.append((block.seq_hash, got))
    need = len(layout.blocks) - len(prefix)
    evicted = t.allocate(need)
    if evicted is None:
        for _seq_hash, plh in prefix:
            t.release(plh)
        return t.finish(), Reserved(None, tuple(t.events))
    t.handle_evictions(evicted)
    res = DestinationReservation(rid, tuple(prefix), need, layout)
    new_state = t.finish(destinations=state.destinations.set(rid, res), next_reservation_id=rid + 1)
    return new_state, Reserved(res, tuple(t.events))


def _lookup_destination(state: VllmKvState, reservation) -> DestinationReservation:
    rid = reservation.reservation_id if isinstance(reservation, DestinationReservation) else reservation
    res = state.destinations.get(rid)
    if res is None:
        raise CommandRejected(f"no outstanding destination reservation {rid}", rule="KV-23")
    return res


def activate_destination(state: VllmKvState, reservation) -> tuple[VllmKvState, Activated]:
    """KV-24: publish a reserved destination's KV as the request's blocks.

    Rule: KV-24.  Prefix handles become request references; each unpublished
    full block is committed ("Reused" when a block with its hash appeared in
    the meantime -- the reserved slot returns to reset -- else "Stored");
    runs of consecutive Stored blocks are published as one Stored event each;
    the trailing partial block becomes the request's partial block.
    """
    res = _lookup_destination(state, reservation)
    layout = res.layout
    if layout is None:
        return attrs.evolve(state, destinations=state.destinations.remove(res.reservation_id)), Activated((), ())
    blocks = layout.blocks
    n_full = _full_count(blocks)
    prefix_len = len(res.prefix)
    if len(layout.plhs) != n_full:
        raise InternalInvariantBroken("destination PLH count must match full block count", rule="KV-24")
    if layout.hashes and len(layout.hashes) != n_full:
        raise InternalInvariantBroken("destination local hash count must be empty or match", rule="KV-24")
    if layout.token_ids is not None and len(layout.token_ids) != n_full:
        raise InternalInvariantBroken("destination token metadata count must match", rule="KV-24")
    if prefix_len > len(blocks) or res.unpublished != len(blocks) - prefix_len:
        raise InternalInvariantBroken("destination reservation does not cover its layout", rule="KV-24")
    for block, (seq_hash, _plh) in zip(blocks, res.prefix):
        if not isinstance(block, FullBlock) or block.seq_hash != seq_hash:
            raise InternalInvariantBroken("destination cached prefix must match the layout", rule="KV-24")
    if isinstance(layout.parent, PartialBlock):
        raise InternalInvariantBroken("parent block cannot be partial", rule="KV-24")

    t = _Txn(state)
    commits = []
    run: list[int] = []
    run_local: list[int] = []
    run_tokens: Optional[list] = [] if layout.token_ids is not None else None
    run_parent: Optional[int] = None
    meta_parent = layout.parent.seq_hash if layout.parent is not None else None
    plh_idx = 0

    def flush():
        nonlocal run, run_local, run_tokens
        t.publish_stored(run, run_local, run_parent, run_tokens)
        run, run_local = [], []
        run_tokens = [] if layout.token_ids is not None else None

    for idx, block in enumerate(blocks):
        if isinstance(block, FullBlock):
            full_idx = plh_idx
            plh = layout.plhs[plh_idx]
            plh_idx += 1
            if idx < prefix_len:
                t.push_handle(block.seq_hash, res.prefix[idx][1])
                meta_parent = block.seq_hash
                continue
            commit = t.commit_active_full(block.seq_hash, plh, block.seq_hash)
            commits.append(commit)
            if commit == "Reused":
                if run:
                    flush()
                    run_parent = None
                meta_parent = block.seq_hash
                continue
            if not run:
                run_parent = meta_parent
            run.append(block.seq_hash)
            if full_idx < len(layout.hashes):
                run_local.append(layout.hashes[full_idx])
            if run_tokens is not None:
                run_tokens.append(tuple(layout.token_ids[full_idx]))
            meta_parent = block.seq_hash
        else:
            if block in t.active_partial:
                raise InternalInvariantBroken("destination partial block already active", rule="KV-24")
            t.active_partial[block] = None  # the reserved mutable slot becomes the partial block
    flush()
    new_state = t.finish(destinations=state.destinations.remove(res.reservation_id))
    return new_state, Activated(tuple(commits), tuple(t.events))


def cancel_destination(state: VllmKvState, reservation) -> VllmKvState:
    """KV-25: drop a reservation: prefix handles first (first block first), then the slots.

    Rule: KV-25.  No events.
    """
    res = _lookup_destination(state, reservation)
    t = _Txn(state)
    for _seq_hash, plh in res.prefix:
        t.release(plh)
    t.drop_mutable(res.unpublished)
    return t.finish(destinations=state.destinations.remove(res.reservation_id))


# ---------------------------------------------------------------------------
# Decode reservations for the speculative path (KV-26)
# ---------------------------------------------------------------------------


def reserve_decode_blocks(state: VllmKvState, count: int) -> tuple[VllmKvState, Reserved]:
    """KV-26: atomically reserve ``count`` slots (evicting if needed), or nothing.

    Rule: KV-26.  A failed reservation changes nothing.
    """
    if count < 0:
        raise InternalInvariantBroken("reserve_decode_blocks: negative count", rule="KV-26")
    t = _Txn(state)
    evicted = t.allocate(count)
    if evicted is None:
        return state, Reserved(None, ())
    t.handle_evictions(evicted)
    rid = state.next_reservation_id
    new_state = t.finish(
        decode_reservations=state.decode_reservations.set(rid, count), next_reservation_id=rid + 1
    )
    return new_state, Reserved(DecodeReservation(rid), tuple(t.events))


def decode_reservation_left(state: VllmKvState, reservation: DecodeReservation) -> int:
    """KV-26: unused slots of a decode reservation."""
    left = state.decode_reservations.get(reservation.reservation_id)
    if left is None:
        raise CommandRejected(f"no outstanding decode reservation {reservation.reservation_id}", rule="KV-26")
    return left


def process_decode_signal(
    state: VllmKvState, signal: Signal, reservation: DecodeReservation
) -> tuple[VllmKvState, Processed]:
    """KV-26: like :func:`process`, but a Use takes new slots from the reservation only.

    Rule: KV-26.  A Use that the reservation cannot fully cover is a caller
    bug (upstream asserts).
    """
    left = decode_reservation_left(state, reservation)
    if not isinstance(signal, Use):
        return process(state, signal)
    t = _Txn(state)
    count, left2 = _process_use(t, signal, left)
    if count != len(signal.blocks):
        raise InternalInvariantBroken("reserved decode allocation must be infallible", rule="KV-26")
    new_state = t.finish(
        decode_reservations=state.decode_reservations.set(reservation.reservation_id, left2)
    )
    return new_state, Processed(count, tuple(t.events))


def release_decode_reservation(state: VllmKvState, reservation: DecodeReservation) -> VllmKvState:
    """KV-26: return the unused slots of a decode reservation to the reset pool."""
    left = decode_reservation_left(state, reservation)
    t = _Txn(state)
    t.drop_mutable(left)
    return t.finish(decode_reservations=state.decode_reservations.remove(reservation.reservation_id))


# ---------------------------------------------------------------------------
# Invariants (used by the tests; cheap enough for debugging runs)
# ---------------------------------------------------------------------------


def check_invariants(state: VllmKvState) -> None:
    """KV-2/KV-3/KV-13: structural invariants.  Raises InternalInvariantBroken."""

    def fail(msg: str) -> None:
        raise InternalInvariantBroken(msg, rule="KV-2")

    held = sum(1 for h in state.registry.values() if h > 0)
    inactive = sum(1 for h in state.registry.values() if h == 0)
    if any(h < 0 for h in state.registry.values()):
        fail("negative holder count")
    if state.reset < 0 or state.mutable < 0:
        fail("negative pool size")
    if inactive != state.lineage.count:
        fail("inactive registry entries differ from the index count")
    if state.reset + state.lineage.count + state.mutable + held != state.num_blocks:
        fail("reset + inactive + active != N")
    handles: dict = {}
    for seq_hash, hs in state.active_full.items():
        if len(hs) == 0:
            fail("empty handle list")
        for p in hs:
            handles[p] = handles.get(p, 0) + 1
    for res in state.destinations.values():
        for _s, p in res.prefix:
            handles[p] = handles.get(p, 0) + 1
    for p, h in state.registry.items():
        if handles.get(p, 0) != h:
            fail(f"holder count of {p!r} is {h}, handles {handles.get(p, 0)}")
        if h == 0 and not state.lineage.has(p):
            fail(f"inactive block {p!r} not in the index")
    mut = len(state.active_partial) + sum(r.unpublished for r in state.destinations.values())
    mut += sum(state.decode_reservations.values())
    if mut != state.mutable:
        fail("mutable slot count mismatch")
    real = sum(1 for n in state.lineage.nodes.values() if n.plh is not None)
    if real != state.lineage.count:
        fail("lineage count mismatch")
    kids_of: dict = {}
    for n in state.lineage.nodes.values():
        if n.parent is not None:
            if n.parent not in state.lineage.nodes:
                fail("dangling parent link")
            kids_of[n.parent] = kids_of.get(n.parent, 0) + 1
    for key, n in state.lineage.nodes.items():
        if n.plh is None and n.n_children == 0:
            fail("childless ghost")
        if kids_of.get(key, 0) != n.n_children:
            fail("child count mismatch")
        is_leaf = n.plh is not None and n.n_children == 0
        if is_leaf != (n.tick is not None and state.lineage.leaves.get(n.tick) == key):
            fail("leaf set mismatch")
