"""Invariants of the vLLM / TRT-LLM core (spec/vllm-core.md, spec/kv-vllm.md).

Each predicate returns ``None`` when it holds and a short message otherwise.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

from model import sequence as seqm
from model import vllm_kv as kvm
from model.errors import InternalInvariantBroken
from model.vllm_core import RequestStatus, VllmCore

from .handoff import ledger_roles


def kv_pool_consistent(kv: kvm.VllmKvState) -> Optional[str]:
    """KV-2/KV-3: reset + inactive + active = N, holder counts match handles, the eviction index is well formed."""
    try:
        kvm.check_invariants(kv)
    except InternalInvariantBroken as err:
        return str(err)
    return None


def queues_consistent(core: VllmCore) -> Optional[str]:
    """VLLM-2 (upstream I19): every request is a member of exactly one of waiting / running, with a
    matching status and a queue slot; waiting-for-remote-KV requests never enter the scheduler."""
    both = core.waiting_members & core.running_members
    if both:
        return f"{sorted(both)} both waiting and running"
    members = core.waiting_members | core.running_members
    if set(members) != set(core.requests):
        return f"members {sorted(members)} differ from requests {sorted(core.requests)}"
    waiting_slots, running_slots = set(core.waiting), set(core.running)
    for r in core.waiting_members:
        if core.requests[r].status is RequestStatus.RUNNING:
            return f"{r!r} waits but is marked running"
        if r not in waiting_slots:
            return f"{r!r} is a waiting member without a queue slot"
    for r in core.running_members:
        if core.requests[r].status is not RequestStatus.RUNNING:
            return f"{r!r} runs but is marked {core.requests[r].status.value}"
        if r not in running_slots:
            return f"{r!r} is a running member without a queue slot"
    for r, req in core.requests.items():
        if req.status is RequestStatus.WAITING_FOR_REMOTE_KV:
            return f"{r!r} is scheduler-owned while waiting for remote KV"
        seq = req.sequence
        if req.num_computed_tokens > len(seq) or seq.num_allocated_tokens > len(seq):
            return f"{r!r} computed {req.num_computed_tokens} / allocated {seq.num_allocated_tokens} of {len(seq)}"
    return None


def roles_consistent(core: VllmCore) -> Optional[str]:
    """LEDGER-1 with the scheduler (upstream I5, I7): pending sources and active destinations are
    scheduler-owned; held sources and pending or reserved destinations are not."""
    return ledger_roles(core.ledger, set(core.requests))


def _held_blocks(seq: seqm.ActiveSequence):
    n = -(-seq.num_allocated_tokens // seq.block_size)
    return list(seq.unique_blocks[: min(n, len(seq.unique_blocks))])


def kv_ownership_exact(core: VllmCore) -> Optional[str]:
    """VGEN-2 / VLLM-20 (upstream I8, I9): the KV manager's references are exactly those of the
    scheduler-owned requests, the held sources (their deferred Derefs), and the destination
    reservations; pending destinations own nothing."""
    full = Counter()
    partial = Counter()
    for req in core.requests.values():
        for b in _held_blocks(req.sequence):
            (full if isinstance(b, seqm.FullBlock) else partial)[b.seq_hash if isinstance(b, seqm.FullBlock) else b] += 1
    for h in core.ledger.source_holds.held_by_handoff:
        payload = core.ledger.source_holds.held_payload(h)
        for sig in payload.deferred_deref:
            for b in sig.blocks:
                (full if isinstance(b, seqm.FullBlock) else partial)[b.seq_hash if isinstance(b, seqm.FullBlock) else b] += 1
    reservations = [p.kv for p in core.ledger.destination_holds.payloads()]
    ids = {r.reservation_id for r in reservations}
    if ids != set(core.kv.destinations):
        return f"reservations {sorted(ids)} differ from the KV manager's {sorted(core.kv.destinations)}"
    kv_full = Counter({h: len(v) for h, v in core.kv.active_full.items()})
    if kv_full != full:
        diff = {h: (kv_full.get(h, 0), full.get(h, 0)) for h in set(kv_full) | set(full) if kv_full.get(h, 0) != full.get(h, 0)}
        return f"full-block references (kv, owners) differ: {diff}"
    kv_partial = Counter(core.kv.active_partial.keys())
    if kv_partial != partial:
        return f"partial blocks differ: kv {sorted(map(repr, kv_partial))} owners {sorted(map(repr, partial))}"
    return None


from . import Invariant  # noqa: E402

INVARIANTS = (
    Invariant("kv_pool_consistent", "KV-2", kvm.VllmKvState, kv_pool_consistent, kv_pool_consistent.__doc__),
    Invariant("vllm_queues_consistent", "VLLM-2", VllmCore, queues_consistent, queues_consistent.__doc__),
    Invariant("vllm_roles_consistent", "LEDGER-1", VllmCore, roles_consistent, roles_consistent.__doc__),
    Invariant("vllm_kv_ownership_exact", "VGEN-2", VllmCore, kv_ownership_exact, kv_ownership_exact.__doc__),
)
