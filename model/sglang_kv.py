"""SGLang KV manager: request-level lifecycle on the radix cache, with KV events.

Spec: spec/kv-sglang.md, rules SGKV-1 .. SGKV-19 (tree and pool rules are in
``model.radix_cache``).  Every public operation is pure::

    new_manager, result = op(manager, ...)

``result`` is a :class:`KvResult` holding the operation's value and the KV
events it published, in publication order.  Events are only produced (and the
block-hash bookkeeping only changes) while ``publish_events`` is on (SGKV-5).

An operation that raises (a guard failed, or upstream would have panicked)
returns nothing, so the caller's state is untouched.
"""

from __future__ import annotations

from typing import Generic, Iterable, Optional, Sequence, TypeVar

from attrs import evolve, field, frozen
from pyrsistent import PMap, PSet, pmap, pset

from model.errors import InternalInvariantBroken
from model.hashing import chain_hash, tokens_hash
from model.kv_events import KvCacheEvent, KvRemoved, KvStored, StoredBlock
from model.radix_cache import CacheTxn, EvictResult, RadixCache, new_radix_cache

T = TypeVar("T")

_U32_LIMIT = 1 << 32


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------


@frozen
class KvResult(Generic[T]):
    """What an operation returns besides the new state: a value and its events."""

    value: T
    events: tuple[KvCacheEvent, ...] = ()


@frozen
class AllocResult:
    """SGKV-6/7/16: a request's prefix hit, full slot list and locked node."""

    #: tokens served from the tree (page aligned for a fresh match)
    prefix_len: int
    #: one slot per token of the allocated sequence: prefix slots, then own slots
    kv_indices: tuple[int, ...]
    #: the node the request now holds a lock on (the root means "nothing locked")
    last_node: int


@frozen
class DecodeTokenReservation:
    """SGKV-14: slots reserved for one decode step, handed out front first."""

    indices: tuple[int, ...]

    def take(self) -> tuple[int, "DecodeTokenReservation"]:
        """Pop the front slot.  Upstream ``expect``s a slot to be there."""
        if not self.indices:
            raise InternalInvariantBroken(
                "reserved decode token allocation must be infallible", rule="SGKV-14"
            )
        return self.indices[0], DecodeTokenReservation(self.indices[1:])

    def __len__(self) -> int:
        return len(self.indices)


@frozen
class DestinationReservation:
    """SGKV-15: KV held for an incoming disaggregated prompt."""

    #: model-only identity used for the linear-use guard (SGKV-18)
    reservation_id: int
    prefix_len: int
    prefix_indices: tuple[int, ...]
    last_node: int
    #: fresh slots the transfer will fill (page padded)
    unpublished_indices: tuple[int, ...]
    #: page-rounded prompt length
    allocated_tokens: int

    @property
    def transferable_prompt_tokens(self) -> int:
        """Number of fresh (padded) slots: what the transfer is charged for."""
        return len(self.unpublished_indices)

    @property
    def indices(self) -> tuple[int, ...]:
        return self.prefix_indices + self.unpublished_indices


@frozen
class SglangKvManager:
    """SGKV-1: the manager state."""

    cache: RadixCache
    #: whether KV event publishers are attached (SGKV-5)
    publish_events: bool = False
    dp_rank: int = 0
    next_event_id: int = 0
    #: representative (last) slot of each advertised page -> its block hash
    idx_to_block_hash: PMap = field(factory=pmap)
    #: block hash -> number of slots currently advertising it
    block_hash_refcounts: PMap = field(factory=pmap)
    next_reservation_id: int = 0
    #: ids of destination reservations not yet activated or cancelled (SGKV-18)
    live_reservations: PSet = field(factory=pset)

    # read-only views used by the scheduler
    @property
    def page_size(self) -> int:
        return self.cache.page_size

    @property
    def available_tokens(self) -> int:
        return self.cache.pool.available

    @property
    def evictable_size(self) -> int:
        return self.cache.evictable_size

    @property
    def protected_size(self) -> int:
        return self.cache.protected_size

    @property
    def total_tokens(self) -> int:
        return self.cache.pool.total


def new_kv_manager(
    total_tokens: int, page_size: int, *, publish_events: bool = False, dp_rank: int = 0
) -> SglangKvManager:
    """SGKV-1: an empty manager over ``total_tokens`` slots with the given page size."""
    return SglangKvManager(
        cache=new_radix_cache(total_tokens, page_size),
        publish_events=publish_events,
        dp_rank=dp_rank,
    )


def set_publish_events(mgr: SglangKvManager, enabled: bool) -> SglangKvManager:
    """SGKV-5: attach (``True``) or detach event publishers; bookkeeping is kept."""
    return evolve(mgr, publish_events=enabled)


# ---------------------------------------------------------------------------
# Block hashing (SGKV-2)
# ---------------------------------------------------------------------------


def local_block_hashes(tokens: Sequence[int], page_size: int) -> tuple[int, ...]:
    """SGKV-2: the tokens hash of every complete page of ``tokens``.

    Every token must fit in ``u32``; upstream panics otherwise, naming the
    first offending token.
    """
    for tok in tokens:
        if not 0 <= tok < _U32_LIMIT:
            raise InternalInvariantBroken(
                f"local_hashes_for_range: token {tok} exceeds router u32 token domain",
                rule="SGKV-2",
            )
    n = len(tokens) // page_size
    return tuple(tokens_hash(tokens[i * page_size:(i + 1) * page_size]) for i in range(n))


# ---------------------------------------------------------------------------
# Transaction
# ---------------------------------------------------------------------------


class _Txn:
    """Mutable builder for one manager operation (never escapes it)."""

    __slots__ = ("mgr", "tree", "_idx_hash", "_refcounts", "next_event_id", "events",
                 "next_reservation_id", "_live")

    def __init__(self, mgr: SglangKvManager) -> None:
        self.mgr = mgr
        self.tree = CacheTxn(mgr.cache)
        self._idx_hash = mgr.idx_to_block_hash.evolver()
        self._refcounts = mgr.block_hash_refcounts.evolver()
        self.next_event_id = mgr.next_event_id
        self.events: list[KvCacheEvent] = []
        self.next_reservation_id = mgr.next_reservation_id
        self._live = mgr.live_reservations

    def freeze(self) -> SglangKvManager:
        m = self.mgr
        return SglangKvManager(
            cache=self.tree.freeze(),
            publish_events=m.publish_events,
            dp_rank=m.dp_rank,
            next_event_id=self.next_event_id,
            idx_to_block_hash=self._idx_hash.persistent(),
            block_hash_refcounts=self._refcounts.persistent(),
            next_reservation_id=self.next_reservation_id,
            live_reservations=self._live,
        )

    def result(self, value: T) -> tuple[SglangKvManager, KvResult[T]]:
        return self.freeze(), KvResult(value, tuple(self.events))

    def _emit(self, data) -> None:
        self.events.append(KvCacheEvent(event_id=self.next_event_id, dp_rank=self.mgr.dp_rank, data=data))
        self.next_event_id += 1

    # -- SGKV-3 ----------------------------------------------------------------

    def publish_stored(self, tokens: tuple[int, ...], indices: Sequence[int], first_new: int) -> None:
        if not self.mgr.publish_events:
            return
        ps = self.tree.page_size
        complete = min(len(tokens), len(indices))
        complete -= complete % ps
        if complete == 0 or first_new >= complete:
            return
        start0 = first_new - first_new % ps
        local = local_block_hashes(tokens[start0:complete], ps)
        idx_hash = self._idx_hash
        refcounts = self._refcounts
        computed: list[tuple[Optional[int], StoredBlock, int]] = []
        for i, th in enumerate(local):
            start = start0 + i * ps
            rep = indices[start + ps - 1]
            if rep in idx_hash:
                continue
            parent = idx_hash[indices[start - 1]] if start > 0 and indices[start - 1] in idx_hash else None
            block_hash = th if parent is None else chain_hash(parent, th)
            idx_hash.set(rep, block_hash)
            count = (refcounts[block_hash] if block_hash in refcounts else 0) + 1
            refcounts.set(block_hash, count)
            computed.append((parent, StoredBlock(block_hash=block_hash, tokens_hash=th), count))
        first = next((k for k, (_, _, c) in enumerate(computed) if c == 1), None)
        if first is None:
            return
        self._emit(KvStored(parent_hash=computed[first][0], blocks=tuple(b for _, b, _ in computed[first:])))

    # -- SGKV-4 ----------------------------------------------------------------

    def publish_removed(self, indices: Iterable[int]) -> None:
        if not self.mgr.publish_events:
            return
        idx_hash = self._idx_hash
        refcounts = self._refcounts
        removed: list[int] = []
        for idx in indices:
            if idx not in idx_hash:
                continue
            block_hash = idx_hash[idx]
            idx_hash.remove(idx)
            if block_hash not in refcounts:
                continue
            count = refcounts[block_hash]
            if count > 1:
                refcounts.set(block_hash, count - 1)
                continue
            refcounts.remove(block_hash)
            removed.append(block_hash)
        if removed:
            self._emit(KvRemoved(block_hashes=tuple(removed)))

    # -- request operations ------------------------------------------------------

    def allocate_for_request(self, tokens: tuple[int, ...]) -> Optional[AllocResult]:
        tree = self.tree
        prefix_len, node = tree.match_prefix(tokens)
        prefix_idx = tree.path_indices(node)
        new = tree.pool.allocate(len(tokens) - prefix_len)
        if new is None:
            return None
        kv = prefix_idx + new
        tree.inc_lock_ref(node)
        self.publish_stored(tokens, kv, prefix_len)
        return AllocResult(prefix_len=prefix_len, kv_indices=kv, last_node=node)

    def allocate_after_prefix(
        self, tokens: tuple[int, ...], prefix_len: int, prefix_indices: Sequence[int], node: int
    ) -> Optional[AllocResult]:
        # Upstream allocates first (a short pool answers None), then slices the
        # prefix (a panic when prefix_len is too long), then locks the node.
        new = self.tree.pool.allocate(max(len(tokens) - prefix_len, 0))
        if new is None:
            return None
        if prefix_len < 0 or prefix_len > len(prefix_indices):
            raise InternalInvariantBroken(
                f"prefix_len {prefix_len} exceeds the {len(prefix_indices)} prefix indices",
                rule="SGKV-7",
            )
        self.tree.node(node)
        kv = tuple(prefix_indices[:prefix_len]) + new
        self.tree.inc_lock_ref(node)
        self.publish_stored(tokens, kv, prefix_len)
        return AllocResult(prefix_len=prefix_len, kv_indices=kv, last_node=node)

    def cache_finished_req(
        self, tokens: tuple[int, ...], kv: Sequence[int], node: int, first_new: int
    ) -> None:
        self.tree.node(node)
        self.publish_stored(tokens, kv, first_new)
        self.tree.insert(tokens, kv)
        self.release_unretained_finished_indices(tokens, kv)
        self.tree.dec_lock_ref(node)

    def release_unretained_finished_indices(self, tokens: tuple[int, ...], kv: Sequence[int]) -> None:
        ps = self.tree.page_size
        complete = min(len(tokens), len(kv))
        complete -= complete % ps
        if complete == 0:
            return
        matched, node = self.tree.match_prefix(tokens[:complete])
        if matched < complete:  # unreachable after the insert; release builds return
            return
        canonical = self.tree.path_indices(node)
        if len(canonical) < complete:  # unreachable, as above
            return
        unretained: list[int] = []
        for start in range(0, complete, ps):
            end = start + ps
            if canonical[end - 1] != kv[end - 1]:
                unretained.extend(kv[start:end])
        self.free_indices(unretained)

    def cache_unfinished_req(
        self, tokens: tuple[int, ...], kv: Sequence[int], node: int, first_new: int
    ) -> int:
        self.tree.node(node)
        self.publish_stored(tokens, kv, first_new)
        self.tree.insert(tokens, kv)
        _, new_node = self.tree.match_prefix(tokens)
        self.tree.inc_lock_ref(new_node)
        self.tree.dec_lock_ref(node)
        return new_node

    def free_indices(self, indices: Sequence[int]) -> None:
        if not indices:
            return
        self.tree.pool.free(indices)
        self.publish_removed(indices)

    def evict(self, num_tokens: int) -> EvictResult:
        result = self.tree.evict(num_tokens)
        if result.indices:
            self.publish_removed(result.indices)
        return result

    def release_unpublished(self, indices: Sequence[int]) -> None:
        if indices:
            self.tree.pool.free(indices)

    # -- destination reservations ---------------------------------------------------

    def reserve_destination(self, tokens: tuple[int, ...]) -> Optional[DestinationReservation]:
        tree = self.tree
        ps = tree.page_size
        prefix_len, node = tree.match_prefix(tokens)
        prefix_idx = tree.path_indices(node)[:prefix_len]
        tree.inc_lock_ref(node)
        allocated = 0 if not tokens else -(-len(tokens) // ps) * ps
        fresh = max(allocated - prefix_len, 0)
        if fresh > tree.available + tree.evictable_size:
            tree.dec_lock_ref(node)
            return None
        available = tree.available
        if fresh > available:
            self.evict(fresh - available)
        new = tree.pool.allocate(fresh)
        if new is None:
            tree.dec_lock_ref(node)
            return None
        rid = self.next_reservation_id
        self.next_reservation_id += 1
        self._live = self._live.add(rid)
        return DestinationReservation(
            reservation_id=rid,
            prefix_len=prefix_len,
            prefix_indices=prefix_idx,
            last_node=node,
            unpublished_indices=new,
            allocated_tokens=allocated,
        )

    def consume_reservation(self, res: DestinationReservation) -> None:
        if res.reservation_id not in self._live:
            raise InternalInvariantBroken(
                f"destination reservation {res.reservation_id} was already consumed or is unknown",
                rule="SGKV-18",
            )
        self._live = self._live.remove(res.reservation_id)

    def activate_destination(self, res: DestinationReservation, tokens: tuple[int, ...]) -> AllocResult:
        missing = max(len(tokens) - res.prefix_len, 0)
        if missing > len(res.unpublished_indices):
            raise InternalInvariantBroken(
                f"activation needs {missing} transferred slots but the reservation holds "
                f"{len(res.unpublished_indices)}",
                rule="SGKV-16",
            )
        self.consume_reservation(res)
        self.release_unpublished(res.unpublished_indices[missing:])
        kv = res.prefix_indices + res.unpublished_indices[:missing]
        new_node = self.cache_unfinished_req(tokens, kv, res.last_node, res.prefix_len)
        return AllocResult(prefix_len=res.prefix_len, kv_indices=kv, last_node=new_node)

    def cancel_destination(self, res: DestinationReservation) -> None:
        self.consume_reservation(res)
        self.tree.dec_lock_ref(res.last_node)
        self.release_unpublished(res.unpublished_indices)


def _tokens(tokens: Sequence[int]) -> tuple[int, ...]:
    return tokens if isinstance(tokens, tuple) else tuple(tokens)


# ---------------------------------------------------------------------------
# Public pure operations
# ---------------------------------------------------------------------------


def allocate_for_request(
    mgr: SglangKvManager, tokens: Sequence[int]
) -> tuple[SglangKvManager, KvResult[Optional[AllocResult]]]:
    """Rule: SGKV-6.  Match (mutating), allocate the rest, lock, publish Stored.

    ``value`` is ``None`` when the pool is short; the match side effects (splits,
    timestamps) are kept in the returned state and nothing is locked.
    """
    txn = _Txn(mgr)
    return txn.result(txn.allocate_for_request(_tokens(tokens)))


def allocate_after_prefix(
    mgr: SglangKvManager,
    tokens: Sequence[int],
    prefix_len: int,
    prefix_indices: Sequence[int],
    last_node: int,
) -> tuple[SglangKvManager, KvResult[Optional[AllocResult]]]:
    """Rule: SGKV-7.  Chunk continuation: no matching; allocate, lock again, publish."""
    txn = _Txn(mgr)
    return txn.result(txn.allocate_after_prefix(_tokens(tokens), prefix_len, prefix_indices, last_node))


def cache_finished_req(
    mgr: SglangKvManager,
    tokens: Sequence[int],
    kv_indices: Sequence[int],
    last_node: int,
    first_new_token: int,
) -> tuple[SglangKvManager, KvResult[None]]:
    """Rules: SGKV-8, SGKV-9.  Publish, insert, free unretained duplicate pages, unlock."""
    txn = _Txn(mgr)
    txn.cache_finished_req(_tokens(tokens), kv_indices, last_node, first_new_token)
    return txn.result(None)


def cache_unfinished_req(
    mgr: SglangKvManager,
    tokens: Sequence[int],
    kv_indices: Sequence[int],
    last_node: int,
    first_new_token: int,
) -> tuple[SglangKvManager, KvResult[int]]:
    """Rule: SGKV-10.  Publish, insert, re-match, move the lock; value = new last node.

    Duplicate slots that lose to existing tree entries are *not* released
    (quirk HL-S10).
    """
    txn = _Txn(mgr)
    return txn.result(txn.cache_unfinished_req(_tokens(tokens), kv_indices, last_node, first_new_token))


def free_request(mgr: SglangKvManager, last_node: int) -> tuple[SglangKvManager, KvResult[bool]]:
    """Rule: SGKV-11.  Unlock ``last_node``; value ``False`` = early stop (S14)."""
    txn = _Txn(mgr)
    return txn.result(txn.tree.dec_lock_ref(last_node))


def free_indices(mgr: SglangKvManager, indices: Sequence[int]) -> tuple[SglangKvManager, KvResult[None]]:
    """Rule: SGKV-12.  Return slots to the pool; publish Removed for advertised ones."""
    txn = _Txn(mgr)
    txn.free_indices(tuple(indices))
    return txn.result(None)


def evict(mgr: SglangKvManager, num_tokens: int) -> tuple[SglangKvManager, KvResult[EvictResult]]:
    """Rule: SGKV-13.  LRU eviction (RADIX-12) plus Removed for the freed slots."""
    txn = _Txn(mgr)
    return txn.result(txn.evict(num_tokens))


def allocate_decode_token(
    mgr: SglangKvManager, last_idx: Optional[int] = None
) -> tuple[SglangKvManager, KvResult[Optional[int]]]:
    """Rule: SGKV-14.  One slot from the pool (``None`` if empty); no event."""
    del last_idx  # upstream only traces it
    txn = _Txn(mgr)
    out = txn.tree.pool.allocate(1)
    return txn.result(None if out is None else out[0])


def reserve_decode_tokens(
    mgr: SglangKvManager, count: int
) -> tuple[SglangKvManager, KvResult[Optional[DecodeTokenReservation]]]:
    """Rule: SGKV-14.  Take ``count`` slots for a decode step, or ``None``; no event."""
    txn = _Txn(mgr)
    out = txn.tree.pool.allocate(count)
    return txn.result(None if out is None else DecodeTokenReservation(out))


def release_decode_reservation(
    mgr: SglangKvManager, reservation: DecodeTokenReservation
) -> tuple[SglangKvManager, KvResult[None]]:
    """Rule: SGKV-14.  Return the untaken slots in reservation order; no event."""
    txn = _Txn(mgr)
    txn.release_unpublished(reservation.indices)
    return txn.result(None)


def reserve_destination(
    mgr: SglangKvManager, tokens: Sequence[int]
) -> tuple[SglangKvManager, KvResult[Optional[DestinationReservation]]]:
    """Rule: SGKV-15.  Match + lock the prefix, then reserve page-rounded fresh slots.

    Events: the Removed event of any eviction it had to do (kept even when the
    allocation then fails).
    """
    txn = _Txn(mgr)
    return txn.result(txn.reserve_destination(_tokens(tokens)))


def activate_destination(
    mgr: SglangKvManager, reservation: DestinationReservation, tokens: Sequence[int]
) -> tuple[SglangKvManager, KvResult[AllocResult]]:
    """Rule: SGKV-16.  Release the padding, then ``cache_unfinished_req`` the prompt."""
    txn = _Txn(mgr)
    return txn.result(txn.activate_destination(reservation, _tokens(tokens)))


def cancel_destination(
    mgr: SglangKvManager, reservation: DestinationReservation
) -> tuple[SglangKvManager, KvResult[None]]:
    """Rule: SGKV-17.  Unlock the prefix and return the fresh slots; no event."""
    txn = _Txn(mgr)
    txn.cancel_destination(reservation)
    return txn.result(None)


def prefix_match_len(mgr: SglangKvManager, tokens: Sequence[int]) -> int:
    """Rule: RADIX-7 on the manager's cache (LPM scoring)."""
    return CacheTxn(mgr.cache).prefix_match_len(_tokens(tokens))
