"""Canonical state identity for model checking (spec/model-checking.md MC-1..MC-4).

:func:`canonical_key` maps a core to a hashable value that keeps exactly what
steers the core's future behaviour and drops what does not:

* **MC-2 counters.**  ``capacity_generation`` becomes, per pending entry, the
  relation of its last-attempt mark to the generation (``None`` / ``"now"`` /
  ``"old"`` / ``"ahead"``); the generation only grows and marks are only ever
  compared with it for equality, so an ``"old"`` mark is never due-blocking
  again.  Inactive-block ticks become ranks (only their order is read: the
  eviction heap takes the minimum, new ticks exceed every live one); the heap,
  ``heap_len`` and ``next_tick`` are dropped (the heap is a lazily cleaned copy
  of ``leaves``).  Reservation ids become ranks among the live ones (they are
  only looked up; fresh ids exceed every live one).  ``next_event_id``,
  ``preemptions_total``, ``VllmRequest.num_preemptions`` and
  ``destination_reservation_attempts`` are write-only counters (metrics,
  event ids, a test probe) and are dropped.
* **MC-3 time.**  Absolute time is not part of a state (no core field holds it).
* **MC-4 symmetry (optional).**  With a :class:`Symmetry`, ids of
  interchangeable requests are renamed by every permutation of their classes,
  hash-valued data (block hashes, lineage hashes and fragments, partial-block
  owners, prompts) is relabelled by first occurrence in a traversal whose order
  depends only on the renamed state, and the key with the smallest hash is kept.
  Hash values are only ever compared for equality (a collision is an
  ``InternalInvariantBroken`` in the KV manager), so a bijective relabelling
  preserves behaviour.

Every abstraction keeps the registered invariants (``invariants/``) functions
of the key: a mark is kept as its relation to the generation rather than
erased, and reservation ids as ranks in both the ledger and the KV manager, so
checking invariants on one representative of a key is checking them on all.

The SGLang core has its own key (``_sglang_key``: node ids and ticks as ranks,
token slots relabelled by first occurrence, reservation ids as ranks; see
spec/model-checking.md MC-2).  Other cores are keyed by the core value itself
with only the ledger's generation abstracted (exact, hence sound; a core type
may provide ``ops.canonical_state(core)`` instead).  Symmetry stays off for
every core but vLLM/TRT-LLM.
"""

from __future__ import annotations

import itertools
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

import attrs

from model import sequence as seqm
from model.ids import RequestId

# ---------------------------------------------------------------------------------------------
# Renaming (MC-4)
# ---------------------------------------------------------------------------------------------


def _identity(x):
    return x


class _Relabel:
    """First-occurrence labels for hash-valued data (MC-4)."""

    __slots__ = ("labels",)

    def __init__(self) -> None:
        self.labels: Dict[object, int] = {}

    def __call__(self, value):
        lab = self.labels.get(value)
        if lab is None:
            lab = len(self.labels)
            self.labels[value] = lab
        return lab

    def known(self, value) -> bool:
        return value in self.labels


@attrs.frozen
class Symmetry:
    """MC-4: interchangeable request classes and the renamings they induce.

    ``perms`` holds one renaming per element of the product of the classes'
    symmetric groups: ``(names, key_names, action_map)`` where ``names`` maps
    id strings (requests, reuse ids and handoffs) to their image, ``key_names``
    maps a request key (SEQ-2) to the image of its request id, and
    ``action_map[i]`` is the index of the image of action ``i``.
    """

    classes: Tuple[Tuple[str, ...], ...]
    perms: Tuple[Tuple[Dict[str, str], Dict[int, str], Tuple[int, ...]], ...]
    #: per action: the request prompt's sequence (``None`` for actions that issue no request); its
    #: hash values are labelled first while the action is unfired, so relabelling keeps every hash
    #: a future action can reference tied to that action (MC-4)
    futures: Tuple[Optional[seqm.ActiveSequence], ...] = ()

    @property
    def size(self) -> int:
        return len(self.perms)


def _key_of(request_id: str) -> int:
    from model.vllm_core import request_key

    return request_key(RequestId(request_id))


def symmetry_for(scenario) -> Optional[Symmetry]:
    """MC-4: the symmetry classes of a scenario: requests with the same role, output length,
    admission flag and prompt shape (identical tokens, or private tokens of equal length) that
    no explicit action names.  ``None`` when no class has two members or the core is not vLLM."""
    if scenario.engine_type not in ("vllm", "trtllm"):
        return None
    # a request id issued by two actions (or by a repeatable one) could meet its own earlier
    # generated blocks again, a link that relabelling would lose: no reduction then (MC-4)
    issuers: Dict[str, int] = {}
    for a in scenario.actions:
        if a.request is not None:
            if not a.once:
                return None
            issuers[a.request.uuid.value] = issuers.get(a.request.uuid.value, 0) + 1
    if any(n > 1 for n in issuers.values()):
        return None
    named = set()
    for a in scenario.actions:
        if a.explicit:
            if a.handoff is not None:
                named.add(a.handoff)
            if a.request is not None:
                named.add(a.request.uuid.value)
            if a.owner is not None:
                named.add(a.owner)
    token_owners: Dict[int, set] = {}
    for r in scenario.requests:
        for t in r.tokens:
            token_owners.setdefault(t, set()).add(r.id)
    groups: Dict[tuple, List[str]] = {}
    for r in scenario.requests:
        if r.id in named or (r.handoff is not None and r.handoff in named):
            continue
        private = all(token_owners[t] == {r.id} for t in r.tokens)
        shape = ("private", len(r.tokens)) if private else ("tokens", r.tokens)
        sig = (r.role, r.max_output_tokens, r.allow_destination_admission, shape)
        groups.setdefault(sig, []).append(r.id)
    classes = tuple(tuple(g) for g in groups.values() if len(g) > 1)
    if not classes:
        return None
    by_id = {r.id: r for r in scenario.requests}
    perms = []
    for choice in itertools.product(*(itertools.permutations(c) for c in classes)):
        names: Dict[str, str] = {}
        for cls, image in zip(classes, choice):
            for a, b in zip(cls, image):
                names[a] = b
                names[a + "'"] = b + "'"
                ha, hb = by_id[a].handoff, by_id[b].handoff
                if ha is not None:
                    names[ha] = hb
        key_names = {_key_of(a): names.get(a, a) for a in _all_request_ids(scenario)}
        index = {a.name: i for i, a in enumerate(scenario.actions)}
        amap = []
        for a in scenario.actions:
            amap.append(index[_rename_action_name(a.name, names)])
        perms.append((names, key_names, tuple(amap)))
    args = scenario.args
    futures = []
    for a in scenario.actions:
        if a.request is None:
            futures.append(None)
            continue
        futures.append(seqm.new_sequence(_key_of(a.request.uuid.value), a.request.tokens, a.request.max_output_tokens,
                                         block_size=args.block_size, enable_prefix_caching=args.enable_prefix_caching))
    return Symmetry(classes, tuple(perms), tuple(futures))


def _all_request_ids(scenario) -> List[str]:
    out = [r.id for r in scenario.requests]
    for a in scenario.actions:
        if a.request is not None and a.request.uuid.value not in out:
            out.append(a.request.uuid.value)
    return out


def _rename_action_name(name: str, names: Dict[str, str]) -> str:
    if "(" not in name:
        return name
    head, rest = name.split("(", 1)
    args = rest[:-1].split(",")
    return f"{head}({','.join(names.get(x, x) for x in args)})"


# ---------------------------------------------------------------------------------------------
# The vLLM / TRT-LLM key (MC-2)
# ---------------------------------------------------------------------------------------------


_CACHE_MAX = 200_000


def _mark(entry_mark, g):
    if entry_mark is None:
        return None
    if entry_mark == g:
        return "now"
    return "old" if entry_mark < g else "ahead"


class _VllmKeyer:
    """Builds the key of one vLLM core under one renaming (identity when ``names`` is None)."""

    def __init__(self, names: Optional[Dict[str, str]] = None, key_names: Optional[Dict[int, str]] = None):
        #: identity-keyed memo of sub-keys (plain keyer only: relabelling depends on traversal order)
        self.cache: Optional[dict] = {} if names is None else None
        if names is None:
            self.I = lambda x: x.value
            self.H = _identity
            self.K = _identity
            self.P = _identity
            self.relabel = None
        else:
            self.I = lambda x: names.get(x.value, x.value)
            self.relabel = _Relabel()
            self.H = self.relabel
            self.K = lambda k: key_names.get(k, ("key", self.relabel(("k", k))))
            self.P = lambda prompt: (len(prompt), self.relabel(("prompt", prompt)))

    # -- pieces --

    def block(self, b):
        if isinstance(b, seqm.FullBlock):
            return ("F", self.H(b.seq_hash))
        return ("P", self.K(b.owner), b.index)

    def plh(self, p):
        return (p[0], self.H(p[1]), self.H(("frag", p[2])))

    def sequence(self, s: seqm.ActiveSequence):
        H = self.H
        return (
            self.K(s.request_key),
            self.P(s.prompt),
            s.max_output_tokens,
            tuple(s.generated),
            s.num_allocated_tokens,
            tuple(self.block(b) for b in s.unique_blocks),
            tuple(H(h) for h in s.block_hashes),
            tuple(self.plh(p) for p in s.plhs),
        )

    def request(self, req):
        # VllmRequest.num_preemptions is write-only (MC-2)
        cache = self.cache
        if cache is not None:
            hit = cache.get(id(req))
            if hit is not None and hit[0] is req:
                return hit[1]
        k = (self.I(req.uuid), self.sequence(req.sequence), req.status.value, req.num_computed_tokens)
        if cache is not None:
            if len(cache) >= _CACHE_MAX:
                cache.clear()
            cache[id(req)] = (req, k)
        return k

    def derefs(self, derefs):
        return tuple(tuple(self.block(b) for b in d.blocks) for d in derefs)

    def reservation(self, res, rank):
        layout = res.layout
        lay = None
        if layout is not None:
            lay = (
                tuple(self.block(b) for b in layout.blocks),
                tuple(self.H(h) for h in layout.hashes),
                tuple(self.plh(p) for p in layout.plhs),
                None if layout.parent is None else self.block(layout.parent),
            )
        return (rank[res.reservation_id], tuple((self.H(h), self.plh(p)) for h, p in res.prefix), res.unpublished, lay)

    # -- the whole core --

    def seed(self, futures, fired: int, amap) -> None:
        """MC-4: label the hash values of every unfired action's prompt first, in the order of the
        actions' images under the renaming."""
        order = sorted((amap[j], j) for j, seq in enumerate(futures) if seq is not None and not fired >> j & 1)
        for _t, j in order:
            seq = futures[j]
            self.P(seq.prompt)
            for b in seq.unique_blocks:
                self.block(b)
            for p in seq.plhs:
                self.plh(p)
                self.H(("frag", p.lineage_key()[1]))

    def key(self, core):
        I = self.I
        led = core.ledger
        kv = core.kv
        rank = {rid: i for i, rid in enumerate(sorted(kv.destinations))}
        # requests in an order that depends only on the (renamed) state
        reqs = sorted(core.requests.values(), key=lambda r: I(r.uuid))
        requests = tuple(self.request(r) for r in reqs)
        g = led.capacity_generation
        src = led.source_holds
        src_pending = tuple(sorted((I(r), I(h)) for r, h in src.pending_by_request.items()))
        held = []
        for h in sorted(src.held_by_handoff, key=I):
            r, payload = src.held_by_handoff[h]
            held.append((I(h), I(r), self.request(payload.request), self.derefs(payload.deferred_deref)))
        pend = led.pending_destinations
        pending = []
        for h in sorted(pend.by_handoff, key=I):
            e = pend.by_handoff[h]
            pending.append((I(h), I(e.request_id), self.request(e.payload), _mark(e.last_attempt_generation, g)))
        dst = []
        for h in sorted(led.destination_holds.by_handoff, key=I):
            r, payload = led.destination_holds.by_handoff[h]
            dst.append((I(h), I(r), self.request(payload.request), self.reservation(payload.kv, rank)))
        active = tuple(sorted((I(h), I(r)) for h, r in led.active_destinations.by_handoff.items()))
        ledger = (
            src_pending,
            tuple(held),
            tuple(I(h) for h in pend.fifo),
            tuple(pending),
            tuple(dst),
            active,
        )
        return (
            tuple(I(u) for u in core.waiting),
            tuple(sorted(I(u) for u in core.waiting_members)),
            tuple(I(u) for u in core.running),
            tuple(sorted(I(u) for u in core.running_members)),
            requests,
            ledger,
            self.kv_cached(kv, rank),
        )

    def kv_cached(self, kv, rank):
        cache = self.cache
        if cache is None:
            return self.kv(kv, rank)
        hit = cache.get(id(kv))
        if hit is not None and hit[0] is kv:
            return hit[1]
        k = self.kv(kv, rank)
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        cache[id(kv)] = (kv, k)
        return k

    def kv(self, kv, rank):
        H = self.H
        lin = kv.lineage
        ticks = sorted(lin.leaves.keys() | {n.tick for n in lin.nodes.values() if n.tick is not None})
        trank = {t: i for i, t in enumerate(ticks)}

        def nkey(k):
            return None if k is None else (k[0], H(("frag", k[1])))

        relabel = self.relabel
        # real lineage nodes in tick order (id independent), then the rest
        real = sorted(((n.tick, k) for k, n in lin.nodes.items() if n.tick is not None))
        nodes = []
        for t, k in real:
            n = lin.nodes[k]
            nodes.append((nkey(k), None if n.plh is None else self.plh(n.plh), nkey(n.parent), n.n_children, trank[t]))
        ghosts = [(k, n) for k, n in lin.nodes.items() if n.tick is None]
        if relabel is not None:
            ghosts.sort(key=lambda kn: (kn[0][0], relabel.labels.get(("frag", kn[0][1]), 1 << 62), kn[0][1]))
        ghost_keys = [(nkey(k), None if n.plh is None else self.plh(n.plh), nkey(n.parent), n.n_children)
                      for k, n in ghosts]
        if relabel is None:
            nodes_key = frozenset(nodes) | frozenset(ghost_keys)
        else:
            nodes_key = (tuple(nodes), tuple(ghost_keys))
        leaves = tuple(sorted((trank[t], nkey(k)) for t, k in lin.leaves.items()))

        def order(values, f=lambda v: v):
            if relabel is None:
                return values
            return sorted(values, key=lambda v: (relabel.labels.get(f(v), 1 << 62), repr(f(v))))

        af = kv.active_full
        active_full = tuple((H(h), tuple(self.plh(p) for p in af[h])) for h in order(list(af)))
        registry = tuple((self.plh(p), kv.registry[p], kv.shadow.get(p) if relabel is None else
                          (None if p not in kv.shadow else H(kv.shadow[p])))
                         for p in order(list(kv.registry), lambda p: p[1]))
        shadow_only = tuple((self.plh(p), H(kv.shadow[p]))
                            for p in order([p for p in kv.shadow if p not in kv.registry], lambda p: p[1]))
        partial = tuple(sorted((self.block(b) for b in kv.active_partial), key=repr))
        dests = tuple(sorted(self.reservation(r, rank) for r in kv.destinations.values()))
        if relabel is None:
            active_full = frozenset(active_full)
            registry = frozenset(registry)
            shadow_only = frozenset(shadow_only)
            partial = frozenset(partial)
        return (
            kv.reset,
            kv.mutable,
            registry,
            shadow_only,
            active_full,
            partial,
            nodes_key,
            leaves,
            lin.count,
            dests,
            tuple(sorted(kv.decode_reservations.items())),
        )


# ---------------------------------------------------------------------------------------------
# SGLang key (MC-2 on the SGLang core)
# ---------------------------------------------------------------------------------------------


def _ranks(values) -> Dict[int, int]:
    """Dense order-preserving ranks of integer values."""
    return {v: i for i, v in enumerate(sorted(set(values)))}


class _SglangKeyer:
    """MC-2 for the SGLang core (one per key computation).

    * radix node ids become their rank among the live ids and ``last_access`` ticks their dense
      rank among the live nodes': eviction pops the minimum ``(last_access, id)`` pair, matching
      stamps the touched path with a tick above every live one, and fresh nodes get an id above
      every live one, so only these orders are ever read; ``tick`` and ``next_node_id`` go;
    * token-pool slot ids are relabelled by first occurrence (free list in order, then the tree
      in node order, then requests and reservations): slots are only compared for equality and
      their positions in the free list are kept, so a bijective renaming preserves behaviour;
    * reservation ids become ranks among the live ones (looked up only; fresh ids exceed all);
      ``next_reservation_id``, ``next_event_id`` and the write-only counters go.
    """

    __slots__ = ("node", "slot")

    def __init__(self, cache) -> None:
        self.node = _ranks(cache.nodes.keys())
        self.slot = _Relabel()

    def n(self, node_id):
        return None if node_id is None else self.node.get(node_id, ("gone", node_id))

    def slots(self, indices) -> tuple:
        s = self.slot
        return tuple(s(i) for i in indices)

    def first_slots(self, indices) -> tuple:
        """``slots(indices)`` while no slot is labelled yet (the free list, keyed first), in C loops:
        distinct slots in order of first occurrence get 0, 1, 2, ..."""
        labels = self.slot.labels
        if labels:
            return self.slots(indices)
        labels.update(zip(dict.fromkeys(indices), itertools.count()))
        return tuple(map(labels.__getitem__, indices))

    def tree(self, cache) -> tuple:
        ticks = _ranks(n.last_access for n in cache.nodes.values())
        out = []
        for i in sorted(cache.nodes.keys()):
            nd = cache.nodes[i]
            children = tuple(sorted((k, self.n(c)) for k, c in nd.children.items()))
            out.append((self.n(i), nd.key, self.slots(nd.value), self.n(nd.parent), children,
                        nd.lock_ref, ticks[nd.last_access]))
        return tuple(out)

    def request(self, r) -> tuple:
        return (r.uuid, r.prompt, r.max_output_tokens, len(r.output_ids), self.n(r.last_node),
                self.slots(r.kv_indices), r.materialized_tokens, r.cached_tokens, r.allocated_tokens)

    def payload(self, p, res_rank) -> tuple:
        req = getattr(p, "request", None)
        if req is None:  # a pending destination's queued request
            return self.request(p)
        kv = getattr(p, "kv", None)
        if kv is None:
            return ("held", self.request(req))
        return ("reserved", self.request(req), res_rank[kv.reservation_id], kv.prefix_len,
                self.slots(kv.prefix_indices), self.n(kv.last_node), self.slots(kv.unpublished_indices),
                kv.allocated_tokens)


def _sglang_key(core) -> Hashable:
    kv = core.kv
    cache = kv.cache
    k = _SglangKeyer(cache)
    free = k.first_slots(cache.pool.free_list)
    tree = k.tree(cache)
    queues = tuple(tuple(k.request(r) for r in q) for q in (core.waiting, core.prebuilt_ready, core.running))
    res_rank = _ranks(kv.live_reservations)
    led = core.ledger
    g = led.capacity_generation
    src = led.source_holds
    held = tuple((h, r, k.payload(p, res_rank)) for h, (r, p) in sorted(src.held_by_handoff.items()))
    pend = led.pending_destinations
    pending = tuple((h, e.request_id, k.payload(e.payload, res_rank), _mark(e.last_attempt_generation, g))
                    for h, e in sorted(pend.by_handoff.items()))
    dst = tuple((h, r, k.payload(p, res_rank)) for h, (r, p) in sorted(led.destination_holds.by_handoff.items()))
    ledger = (
        tuple(sorted(src.pending_by_request.items())),
        held,
        tuple(pend.fifo),
        pending,
        dst,
        tuple(sorted(led.active_destinations.by_handoff.items())),
    )
    hashes = tuple(sorted((k.slot(i), h) for i, h in kv.idx_to_block_hash.items()))
    return (
        core.new_token_ratio,
        free,
        tree,
        queues,
        ledger,
        hashes,
        tuple(sorted(kv.block_hash_refcounts.items())),
        tuple(sorted(res_rank.values())),
        cache.evictable_size,
        cache.protected_size,
    )


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def _generic_key(core) -> Hashable:
    """MC-2 for cores without a dedicated vLLM key: SGLang has its own (``_sglang_key``); others the core value with the generation abstracted."""
    ops = getattr(type(core), "ops", None)
    custom = getattr(ops, "canonical_state", None)
    if custom is not None:
        return custom(core)
    if type(core).__name__ == "SglangCore":
        return _sglang_key(core)
    ledger = getattr(core, "ledger", None)
    if ledger is None:
        return core
    g = ledger.capacity_generation
    pend = ledger.pending_destinations
    ev = pend.by_handoff.evolver()
    for h, e in pend.by_handoff.items():
        ev[h] = attrs.evolve(e, last_attempt_generation=_mark(e.last_attempt_generation, g))
    ledger = attrs.evolve(ledger, pending_destinations=attrs.evolve(pend, by_handoff=ev.persistent()),
                          capacity_generation=0)
    return attrs.evolve(core, ledger=ledger)


def is_vllm(core) -> bool:
    return type(core).__name__ == "VllmCore"


_PLAIN = _VllmKeyer()


def canonical_key(core, symmetry: Optional[Symmetry] = None) -> Hashable:
    """MC-1: the canonical key of a core (with ``symmetry``: of its orbit, MC-4)."""
    if not is_vllm(core):
        return _generic_key(core)
    if symmetry is None:
        return _PLAIN.key(core)
    best = None
    best_h = None
    for names, key_names, amap in symmetry.perms:
        keyer = _VllmKeyer(names, key_names)
        keyer.seed(symmetry.futures, 0, amap)
        k = keyer.key(core)
        h = hash(k)
        if best is None or h < best_h:
            best, best_h = k, h
    return best


def fresh_key(core) -> Hashable:
    """MC-13: ``canonical_key(core)`` computed from scratch, without the memo of sub-keys kept by
    object identity (a core changed in place would otherwise get its old sub-keys back)."""
    if not is_vllm(core):
        return _generic_key(core)
    return _VllmKeyer().key(core)


def node_key(core, fired: int, symmetry: Optional[Symmetry] = None, fresh: bool = False) -> Hashable:
    """MC-1: the key of an explored node: the core's key and the driver's set of fired once-actions
    (a bit mask over the alphabet).  Under symmetry both are permuted together.  ``fresh`` keys
    the core from scratch (MC-13; the symmetry keyers keep no memo anyway)."""
    if symmetry is None or not is_vllm(core):
        return (fresh_key(core) if fresh else canonical_key(core), fired)
    best = None
    best_h = None
    for names, key_names, amap in symmetry.perms:
        keyer = _VllmKeyer(names, key_names)
        keyer.seed(symmetry.futures, fired, amap)
        k = (keyer.key(core), _permute_mask(fired, amap))
        h = hash(k)
        if best is None or h < best_h:
            best, best_h = k, h
    return best


def _permute_mask(mask: int, amap: Sequence[int]) -> int:
    out = 0
    i = 0
    while mask:
        if mask & 1:
            out |= 1 << amap[i]
        mask >>= 1
        i += 1
    return out
