"""SGLang radix cache and token-slot pool (spec/kv-sglang.md, rules POOL-*, RADIX-*).

The cache is a page-granular radix tree over token ids whose edges carry the
pool slot ids holding each token's KV.  It owns the token pool.  Every public
function here is pure: it takes a frozen state value and returns a new one
(plus a result); the argument is never changed.

Internally, one operation runs against a :class:`CacheTxn`, a short-lived
mutable builder over pyrsistent evolvers.  A transaction never escapes the
function that opened it: the caller either freezes it into a new
:class:`RadixCache` or drops it (for example when a guard raises), so a
rejected operation leaves no trace.  ``model.sglang_kv`` composes several tree
primitives inside one transaction the same way.
"""

from __future__ import annotations

import heapq
from typing import Iterable, NamedTuple, Sequence

from attrs import evolve, field, frozen
from pyrsistent import PMap, PVector, pmap, pvector

from model.errors import InternalInvariantBroken, InvalidInput

#: node id of the root in every cache (RADIX-1)
ROOT = 0

_ABSENT = object()
_EMPTY = pmap()


# ---------------------------------------------------------------------------
# Token pool (POOL-1 .. POOL-4)
# ---------------------------------------------------------------------------


@frozen(eq=False)
class TokenPool:
    """The free list of KV token slots (POOL-1).

    The logical free list is ``buf[:size]``.  ``buf`` may carry stale entries
    past ``size``; they are never read and do not take part in equality.  This
    keeps allocation from the end O(n) in the number of slots taken instead of
    O(pool) (no truncating copy of a persistent vector).
    """

    total: int
    buf: PVector
    size: int

    @property
    def available(self) -> int:
        """POOL-1: number of entries in the free list (duplicates counted)."""
        return self.size

    @property
    def free_list(self) -> tuple[int, ...]:
        """The free list in order; the next allocation takes from its end."""
        return tuple(self.buf[i] for i in range(self.size))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenPool):
            return NotImplemented
        return (
            self.total == other.total
            and self.size == other.size
            and all(self.buf[i] == other.buf[i] for i in range(self.size))
        )

    def __hash__(self) -> int:
        return hash((self.total, self.free_list))

    def __repr__(self) -> str:
        return f"TokenPool(total={self.total}, available={self.size})"


#: POOL-1: the largest pool the model builds.  Its free list is materialized (as upstream's is), at
#: about 40 bytes a slot here against 8 there; beyond this a replay would exhaust the memory of
#: the machine instead of failing cleanly (upstream aborts too, at about 2^33 slots on 24 GiB).
MAX_POOL_SLOTS = 1 << 28


def new_token_pool(total: int) -> TokenPool:
    """POOL-1: a pool of ``total`` slots with free list ``[total-1, ..., 1, 0]``."""
    if total < 0:
        raise InvalidInput("total_tokens", total, "must be >= 0", rule="POOL-1")
    if total > MAX_POOL_SLOTS:
        raise InvalidInput("total_tokens", total,
                           f"an SGLang pool of {total} token slots is more than the model builds "
                           f"({MAX_POOL_SLOTS}; num_gpu_blocks * block_size, wrapped to 64 bits)", rule="POOL-1")
    return TokenPool(total=total, buf=pvector(range(total - 1, -1, -1)), size=total)


def pool_allocate(pool: TokenPool, n: int) -> tuple[TokenPool, tuple[int, ...] | None]:
    """POOL-2: take the last ``n`` free-list entries (in list order), or ``None``."""
    txn = _PoolTxn(pool)
    out = txn.allocate(n)
    return txn.freeze(), out


def pool_free(pool: TokenPool, indices: Iterable[int]) -> TokenPool:
    """POOL-3: append ``indices`` to the free list in the given order (no checks)."""
    txn = _PoolTxn(pool)
    txn.free(indices)
    return txn.freeze()


class _PoolTxn:
    """Mutable builder over a :class:`TokenPool` (see module docstring)."""

    __slots__ = ("total", "_buf", "size")

    def __init__(self, pool: TokenPool) -> None:
        self.total = pool.total
        self._buf = pool.buf.evolver()
        self.size = pool.size

    def allocate(self, n: int) -> tuple[int, ...] | None:
        if n < 0:
            raise InternalInvariantBroken(f"cannot allocate {n} token slots", rule="POOL-2")
        if self.size < n:
            return None
        start = self.size - n
        buf = self._buf
        out = tuple(buf[i] for i in range(start, self.size))
        self.size = start
        return out

    def free(self, indices: Iterable[int]) -> None:
        buf = self._buf
        size = self.size
        cap = len(buf)
        for idx in indices:
            if size < cap:
                buf.set(size, idx)
            else:
                buf.append(idx)
                cap += 1
            size += 1
        self.size = size

    def freeze(self) -> TokenPool:
        return TokenPool(total=self.total, buf=self._buf.persistent(), size=self.size)


# ---------------------------------------------------------------------------
# Radix tree (RADIX-1 .. RADIX-15)
# ---------------------------------------------------------------------------


@frozen
class Node:
    """One tree node (RADIX-1).  The root has an empty key and ``parent=None``."""

    #: token ids on the edge into this node (a multiple of the page size long)
    key: tuple[int, ...]
    #: pool slot ids, one per token of ``key``
    value: tuple[int, ...]
    parent: int | None
    #: child key (the child's first page of tokens) -> child node id
    children: PMap = field(factory=pmap)
    #: number of locks held on this node or any descendant (RADIX-10/11)
    lock_ref: int = 0
    #: logical timestamp of the last access (RADIX-4)
    last_access: int = 0


@frozen
class RadixCache:
    """The radix cache state (RADIX-1), including its token pool."""

    page_size: int
    nodes: PMap  # node id -> Node
    pool: TokenPool
    #: last logical timestamp handed out (RADIX-4); a counter, not a clock
    tick: int
    #: next fresh node id; ids are never reused (RADIX-15)
    next_node_id: int
    #: unlocked non-root leaves, as a map id -> True (RADIX-14)
    leaves: PMap
    #: tokens in unlocked non-root nodes (internal nodes included)
    evictable_size: int = 0
    #: tokens in locked nodes
    protected_size: int = 0
    root: int = ROOT

    @property
    def evictable_leaves(self) -> frozenset[int]:
        """The set of evictable leaves (unlocked non-root leaves)."""
        return frozenset(self.leaves.keys())

    @property
    def available_tokens(self) -> int:
        return self.pool.available

    @property
    def total_tokens(self) -> int:
        return self.pool.total

    @property
    def num_nodes(self) -> int:
        """Number of nodes, root included (upstream ``num_nodes``)."""
        return len(self.nodes)


class PrefixMatch(NamedTuple):
    """Result of :func:`match_prefix`: matched token count and deepest node."""

    length: int
    node: int


class EvictResult(NamedTuple):
    """Result of :func:`evict`: tokens evicted and the freed slots, in order."""

    evicted: int
    indices: tuple[int, ...]


def new_radix_cache(total_tokens: int, page_size: int) -> RadixCache:
    """RADIX-1: an empty tree (root only, stamped at tick 1) over a fresh pool."""
    if page_size < 1:
        raise InvalidInput("page_size", page_size, "must be >= 1", rule="RADIX-1")
    pool = new_token_pool(total_tokens)
    root = Node(key=(), value=(), parent=None, last_access=1)
    return RadixCache(
        page_size=page_size,
        nodes=pmap({ROOT: root}),
        pool=pool,
        tick=1,
        next_node_id=ROOT + 1,
        leaves=pmap(),
    )


class CacheTxn:
    """Mutable builder over a :class:`RadixCache` for one pure operation.

    Methods implement the RADIX rules; callers must :meth:`freeze` the result
    or drop the transaction.  Not part of the model's state.
    """

    __slots__ = (
        "page_size", "root", "_base", "_local", "_leaves", "pool", "tick", "next_node_id",
        "evictable_size", "protected_size",
    )

    def __init__(self, cache: RadixCache) -> None:
        self.page_size = cache.page_size
        self.root = cache.root
        # nodes read or written in this transaction (None = deleted); written
        # back into the persistent map once, at freeze time
        self._base = cache.nodes
        self._local: dict[int, Node | None] = {}
        self._leaves = cache.leaves.evolver()
        self.pool = _PoolTxn(cache.pool)
        self.tick = cache.tick
        self.next_node_id = cache.next_node_id
        self.evictable_size = cache.evictable_size
        self.protected_size = cache.protected_size

    def freeze(self) -> RadixCache:
        nodes = self._base
        if self._local:
            ev = nodes.evolver()
            for node_id, node in self._local.items():
                if node is None:
                    if node_id in ev:
                        ev.remove(node_id)
                elif node_id not in nodes or nodes[node_id] is not node:
                    ev.set(node_id, node)
            nodes = ev.persistent()
        return RadixCache(
            page_size=self.page_size,
            nodes=nodes,
            pool=self.pool.freeze(),
            tick=self.tick,
            next_node_id=self.next_node_id,
            leaves=self._leaves.persistent(),
            evictable_size=self.evictable_size,
            protected_size=self.protected_size,
            root=self.root,
        )

    # -- helpers -----------------------------------------------------------

    def node(self, node_id: int) -> Node:
        """RADIX-15: the node with this id; a stale or unknown id is a caller bug."""
        local = self._local
        node = local.get(node_id, _ABSENT)
        if node is _ABSENT:
            node = self._base.get(node_id)
            local[node_id] = node
        if node is None:
            raise InternalInvariantBroken(f"radix node {node_id!r} does not exist", rule="RADIX-15")
        return node

    def _now(self) -> int:
        """RADIX-4: hand out the next logical timestamp."""
        self.tick += 1
        return self.tick

    def _touch(self, node_id: int, node: Node, now: int) -> None:
        self._local[node_id] = Node(
            node.key, node.value, node.parent, node.children, node.lock_ref, now
        )

    def key_match(self, node_key: tuple[int, ...], key: tuple[int, ...], off: int) -> int:
        """RADIX-3: page-granular common prefix of ``node_key`` and ``key[off:]``."""
        n = min(len(node_key), len(key) - off)
        if node_key[:n] == key[off:off + n]:
            common = n
        else:
            common = 0
            while node_key[common] == key[off + common]:
                common += 1
        return common - common % self.page_size

    def is_leaf(self, node_id: int) -> bool:
        return not self.node(node_id).children

    @property
    def available(self) -> int:
        return self.pool.size

    # -- RADIX-5 / RADIX-7 ----------------------------------------------------

    def match_prefix(self, key: tuple[int, ...]) -> PrefixMatch:
        """RADIX-5: mutating prefix match (one tick; may split; refreshes the path)."""
        now = self._now()
        root = self.root
        self._touch(root, self.node(root), now)
        ps = self.page_size
        current = root
        matched = 0
        total = len(key)
        while matched < total:
            child_id = self.node(current).children.get(key[matched:matched + ps])
            if child_id is None:
                break
            child = self.node(child_id)
            common = self.key_match(child.key, key, matched)
            if common < len(child.key):
                if common > 0:
                    current = self.split(child_id, common)
                matched += common
                break
            matched += common
            current = child_id
            self._touch(child_id, child, now)
        return PrefixMatch(matched, current)

    def prefix_match_len(self, key: tuple[int, ...]) -> int:
        """RADIX-7: read-only prefix match length, rounded down to a page."""
        ps = self.page_size
        current = self.root
        matched = 0
        total = len(key)
        while matched < total:
            child_id = self.node(current).children.get(key[matched:matched + ps])
            if child_id is None:
                break
            child = self.node(child_id)
            common = self.key_match(child.key, key, matched)
            matched += common
            if common < len(child.key):
                break
            current = child_id
        return matched - matched % ps

    # -- RADIX-8 / RADIX-6 / RADIX-9 --------------------------------------------

    def insert(self, key: tuple[int, ...], value: Sequence[int]) -> None:
        """RADIX-8: insert the page-aligned part of ``key``; existing values win.  Truncating to
        whole pages (and splitting only at page multiples, RADIX-3) keeps RADIX-2."""
        ps = self.page_size
        aligned = len(key) - len(key) % ps
        if aligned == 0:
            return
        if len(value) < aligned:
            raise InternalInvariantBroken(
                f"not enough token indices: need {aligned}, got {len(value)}", rule="RADIX-8"
            )
        key = key[:aligned]
        value = tuple(value[:aligned])
        now = self._now()
        root = self.root
        self._touch(root, self.node(root), now)
        current = root
        off = 0
        while off < aligned:
            child_id = self.node(current).children.get(key[off:off + ps])
            if child_id is None:
                self.create_child(current, key[off:], value[off:])
                return
            child = self.node(child_id)
            common = self.key_match(child.key, key, off)
            if common == len(child.key):
                off += common
                current = child_id
                self._touch(child_id, child, now)
            else:
                if common > 0:
                    inter = self.split(child_id, common)
                    off += common
                    if off < aligned:
                        self.create_child(inter, key[off:], value[off:])
                return

    def split(self, child_id: int, pos: int) -> int:
        """RADIX-6: cut ``child`` at ``pos``; a new intermediate takes the prefix.

        The original id keeps the suffix.  The intermediate copies the child's
        lock count and timestamp; sizes and the evictable-leaf set are unchanged.
        Callers pass a page multiple, so both halves keep RADIX-2.
        """
        ps = self.page_size
        child = self.node(child_id)
        inter_id = self.next_node_id
        self.next_node_id += 1
        suffix_key = child.key[pos:]
        self._local[inter_id] = Node(
            key=child.key[:pos],
            value=child.value[:pos],
            parent=child.parent,
            children=pmap({suffix_key[:ps]: child_id}),
            lock_ref=child.lock_ref,
            last_access=child.last_access,
        )
        self._local[child_id] = Node(
            suffix_key, child.value[pos:], inter_id, child.children, child.lock_ref,
            child.last_access,
        )
        if child.parent is not None:
            p = self.node(child.parent)
            self._local[child.parent] = Node(
                p.key, p.value, p.parent, p.children.set(child.key[:ps], inter_id), p.lock_ref,
                p.last_access,
            )
        return inter_id

    def create_child(self, parent_id: int, key: tuple[int, ...], value: tuple[int, ...]) -> int:
        """RADIX-9: a new unlocked leaf with its own fresh timestamp."""
        now = self._now()
        node_id = self.next_node_id
        self.next_node_id += 1
        self._local[node_id] = Node(key, value, parent_id, _EMPTY, 0, now)
        if parent_id in self._leaves:
            self._leaves.remove(parent_id)
        p = self.node(parent_id)
        self._local[parent_id] = Node(
            p.key, p.value, p.parent, p.children.set(key[:self.page_size], node_id), p.lock_ref,
            p.last_access,
        )
        self._leaves.set(node_id, True)
        self.evictable_size += len(key)
        return node_id

    # -- RADIX-10 / RADIX-11 ------------------------------------------------------

    def inc_lock_ref(self, node_id: int) -> None:
        """RADIX-10: +1 on every node from ``node_id`` up to (excluding) the root."""
        current: int | None = node_id
        root = self.root
        while current is not None and current != root:
            node = self.node(current)
            lock_ref = node.lock_ref + 1
            self._local[current] = Node(
                node.key, node.value, node.parent, node.children, lock_ref, node.last_access
            )
            if lock_ref == 1:
                if current in self._leaves:
                    self._leaves.remove(current)
                tokens = len(node.key)
                self._sub_evictable(tokens)
                self.protected_size += tokens
            current = node.parent

    def dec_lock_ref(self, node_id: int) -> bool:
        """RADIX-11: -1 on the same walk; stops at a node already at 0 (quirk S14).

        Returns ``False`` when the walk stopped early (upstream logs a warning).
        """
        current: int | None = node_id
        root = self.root
        while current is not None and current != root:
            node = self.node(current)
            if node.lock_ref == 0:
                return False
            lock_ref = node.lock_ref - 1
            self._local[current] = Node(
                node.key, node.value, node.parent, node.children, lock_ref, node.last_access
            )
            if lock_ref == 0:
                tokens = len(node.key)
                if self.protected_size < tokens:
                    raise InternalInvariantBroken("protected_size underflow", rule="RADIX-14")
                self.protected_size -= tokens
                self.evictable_size += tokens
                if not node.children:
                    self._leaves.set(current, True)
            current = node.parent
        return True

    def _sub_evictable(self, tokens: int) -> None:
        if self.evictable_size < tokens:
            raise InternalInvariantBroken("evictable_size underflow", rule="RADIX-14")
        self.evictable_size -= tokens

    # -- RADIX-12 ---------------------------------------------------------------

    def evict(self, num_tokens: int) -> EvictResult:
        """RADIX-12: evict whole unlocked leaves, oldest first, until ``num_tokens``."""
        if num_tokens < 0:
            raise InternalInvariantBroken(f"cannot evict {num_tokens} tokens", rule="RADIX-12")
        evicted = 0
        freed: list[int] = []
        heap: list[tuple[int, int]] | None = None
        ps = self.page_size
        root = self.root
        while evicted < num_tokens:
            if heap is None:
                heap = [(self.node(i).last_access, i) for i in self._leaves_ids()]
                heapq.heapify(heap)
            if not heap:
                break
            _, victim_id = heapq.heappop(heap)
            victim = self.node(victim_id)
            self._leaves.remove(victim_id)
            tokens = len(victim.key)
            self._sub_evictable(tokens)
            evicted += tokens
            freed.extend(victim.value)
            self.pool.free(victim.value)
            parent_id = victim.parent
            if parent_id is not None:
                parent = self.node(parent_id)
                children = parent.children.remove(victim.key[:ps])
                parent = Node(
                    parent.key, parent.value, parent.parent, children, parent.lock_ref,
                    parent.last_access,
                )
                self._local[parent_id] = parent
                if parent_id != root and not children and parent.lock_ref == 0:
                    self._leaves.set(parent_id, True)
                    heapq.heappush(heap, (parent.last_access, parent_id))
            self._local[victim_id] = None
        return EvictResult(evicted, tuple(freed))

    def _leaves_ids(self) -> list[int]:
        # the evolver has no key iteration; freeze a snapshot (cheap when clean)
        return list(self._leaves.persistent().keys())

    # -- RADIX-13 ---------------------------------------------------------------

    def path_indices(self, node_id: int) -> tuple[int, ...]:
        """RADIX-13: slot ids along root -> ``node_id`` (root excluded), concatenated."""
        if node_id == self.root:
            return ()
        parts: list[tuple[int, ...]] = []
        current = node_id
        while True:
            node = self.node(current)
            if node.parent is None:
                break
            parts.append(node.value)
            current = node.parent
        out: list[int] = []
        for part in reversed(parts):
            out.extend(part)
        return tuple(out)


# ---------------------------------------------------------------------------
# Pure operations on RadixCache
# ---------------------------------------------------------------------------


def _key(tokens: Sequence[int]) -> tuple[int, ...]:
    return tokens if isinstance(tokens, tuple) else tuple(tokens)


def match_prefix(cache: RadixCache, key: Sequence[int]) -> tuple[RadixCache, PrefixMatch]:
    """Rule: RADIX-5.  Mutating match: ticks once, may split, refreshes timestamps."""
    txn = CacheTxn(cache)
    result = txn.match_prefix(_key(key))
    return txn.freeze(), result


def prefix_match_len(cache: RadixCache, key: Sequence[int]) -> int:
    """Rule: RADIX-7.  Read-only match length (no tick, no split)."""
    return CacheTxn(cache).prefix_match_len(_key(key))


def insert(cache: RadixCache, key: Sequence[int], value: Sequence[int]) -> tuple[RadixCache, None]:
    """Rule: RADIX-8.  Insert the page-aligned prefix of ``key`` with ``value``."""
    txn = CacheTxn(cache)
    txn.insert(_key(key), value)
    return txn.freeze(), None


def inc_lock_ref(cache: RadixCache, node_id: int) -> tuple[RadixCache, None]:
    """Rule: RADIX-10."""
    txn = CacheTxn(cache)
    txn.inc_lock_ref(node_id)
    return txn.freeze(), None


def dec_lock_ref(cache: RadixCache, node_id: int) -> tuple[RadixCache, bool]:
    """Rule: RADIX-11.  Result ``False`` = the walk stopped at an unlocked node (S14)."""
    txn = CacheTxn(cache)
    done = txn.dec_lock_ref(node_id)
    return txn.freeze(), done


def evict(cache: RadixCache, num_tokens: int) -> tuple[RadixCache, EvictResult]:
    """Rule: RADIX-12.  LRU eviction of unlocked leaves; frees their slots to the pool."""
    txn = CacheTxn(cache)
    result = txn.evict(num_tokens)
    return txn.freeze(), result


def path_indices(cache: RadixCache, node_id: int) -> tuple[int, ...]:
    """Rule: RADIX-13."""
    return CacheTxn(cache).path_indices(node_id)


def get_node(cache: RadixCache, node_id: int) -> Node:
    """Rule: RADIX-15.  The node, or ``InternalInvariantBroken`` for an unknown id."""
    return CacheTxn(cache).node(node_id)


def is_leaf(cache: RadixCache, node_id: int) -> bool:
    return not get_node(cache, node_id).children


def allocate_slots(cache: RadixCache, n: int) -> tuple[RadixCache, tuple[int, ...] | None]:
    """Rule: POOL-2 on the cache's own pool (upstream ``token_pool.allocate``)."""
    pool, out = pool_allocate(cache.pool, n)
    return evolve(cache, pool=pool), out


def free_slots(cache: RadixCache, indices: Iterable[int]) -> tuple[RadixCache, None]:
    """Rule: POOL-3 on the cache's own pool (upstream ``token_pool.free``)."""
    return evolve(cache, pool=pool_free(cache.pool, indices)), None
