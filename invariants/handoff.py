"""Invariants of the handoff bookkeeping machines (spec/handoff-lifecycle.md).

Each predicate returns ``None`` when it holds and a short message otherwise.
"""

from __future__ import annotations

from typing import Optional

from model.active_handoffs import ActiveHandoffRequests
from model.destination_holds import DestinationHolds
from model.ledger import HandoffLedger
from model.pending_destinations import PendingDestinations
from model.source_holds import SourceHolds


def _inverse(forward, backward, key_of=lambda v: v) -> Optional[str]:
    if len(forward) != len(backward):
        return f"sizes differ ({len(forward)} vs {len(backward)})"
    for k, v in forward.items():
        if backward.get(key_of(v)) != k:
            return f"{k!r} -> {v!r} has no matching reverse entry"
    return None


def src_bijective(s: SourceHolds) -> Optional[str]:
    """I1: the pending maps are mutually inverse, and so are the held maps."""
    msg = _inverse(s.pending_by_request, s.pending_by_handoff)
    if msg:
        return "pending: " + msg
    msg = _inverse(s.held_by_handoff, s.held_by_request, key_of=lambda v: v[0])
    if msg:
        return "held: " + msg
    return None


def src_disjoint(s: SourceHolds) -> Optional[str]:
    """I2: no request id and no handoff id is both pending and held."""
    both_r = set(s.pending_by_request) & set(s.held_by_request)
    both_h = set(s.pending_by_handoff) & set(s.held_by_handoff)
    if both_r or both_h:
        return f"pending and held overlap: requests {sorted(both_r)}, handoffs {sorted(both_h)}"
    return None


def dst_bijective(d: DestinationHolds) -> Optional[str]:
    """I3: reservation maps are mutually inverse."""
    return _inverse(d.by_handoff, d.by_request, key_of=lambda v: v[0])


def act_bijective(a: ActiveHandoffRequests) -> Optional[str]:
    """I3: the active-destination maps are mutually inverse."""
    return _inverse(a.by_handoff, a.by_request)


def pend_bijective(p: PendingDestinations) -> Optional[str]:
    """I3: pending entries and the request index are mutually inverse."""
    return _inverse(p.by_handoff, p.by_request, key_of=lambda e: e.request_id)


def pend_live_in_fifo(p: PendingDestinations) -> Optional[str]:
    """I4: every live pending handoff id has a FIFO slot (the live FIFO ids are exactly the map keys)."""
    missing = set(p.by_handoff) - set(p.fifo)
    if missing:
        return f"live handoffs without a FIFO slot: {sorted(missing)}"
    return None


def pend_fifo_bound(p: PendingDestinations) -> Optional[str]:
    """I4 (quirk-aware): distinct FIFO ids <= 2*live always; len(fifo) <= 2*live unless a
    handoff id occupies two FIFO slots (PEND-Q1, tombstone revival)."""
    live = len(p.by_handoff)
    distinct = len(set(p.fifo))
    if distinct > 2 * live:
        return f"{distinct} distinct FIFO ids for {live} live entries"
    if distinct == len(p.fifo) and len(p.fifo) > 2 * live:
        return f"FIFO length {len(p.fifo)} > 2 * {live} live entries"
    return None


def pend_only_head_marked(p: PendingDestinations) -> Optional[str]:
    """I13/I14: only the normalized head can carry a last-attempt generation."""
    head = p.head()
    for h, entry in p.by_handoff.items():
        if entry.last_attempt_generation is not None and h != head:
            return f"{h!r} is marked at generation {entry.last_attempt_generation} but the head is {head!r}"
    return None


def ledger_one_role(l: HandoffLedger) -> Optional[str]:
    """I5: a request id has at most one handoff role (source pending, source held,
    destination pending, reserved, active)."""
    roles = (
        ("source pending", set(l.source_holds.pending_by_request)),
        ("source held", set(l.source_holds.held_by_request)),
        ("destination pending", set(l.pending_destinations.by_request)),
        ("destination reserved", set(l.destination_holds.by_request)),
        ("destination active", set(l.active_destinations.by_request)),
    )
    for i, (name_a, a) in enumerate(roles):
        for name_b, b in roles[i + 1:]:
            both = a & b
            if both:
                return f"{sorted(both)} both {name_a} and {name_b}"
    return None


def ledger_one_destination_stage(l: HandoffLedger) -> Optional[str]:
    """I6: a handoff id is in at most one destination stage."""
    stages = (
        ("pending", set(l.pending_destinations.by_handoff)),
        ("reserved", set(l.destination_holds.by_handoff)),
        ("active", set(l.active_destinations.by_handoff)),
    )
    for i, (name_a, a) in enumerate(stages):
        for name_b, b in stages[i + 1:]:
            both = a & b
            if both:
                return f"{sorted(both)} both {name_a} and {name_b}"
    return None


def ledger_marks_not_ahead(l: HandoffLedger) -> Optional[str]:
    """I14: a head is only ever marked with the current generation, so no mark exceeds it."""
    if l.capacity_generation < 0:
        return f"negative capacity generation {l.capacity_generation}"
    for h, entry in l.pending_destinations.by_handoff.items():
        g = entry.last_attempt_generation
        if g is not None and g > l.capacity_generation:
            return f"{h!r} marked at {g} > capacity generation {l.capacity_generation}"
    return None


def ledger_roles(led: HandoffLedger, owned) -> Optional[str]:
    """LEDGER-1 with the scheduler (upstream I5, I7), for any core given the ids its scheduler
    owns: pending sources and active destinations are scheduler-owned; held sources and pending
    or reserved destinations are not."""
    for r in led.source_holds.pending_by_request:
        if r not in owned:
            return f"pending source {r!r} is not scheduler-owned"
    for r in led.active_destinations.by_request:
        if r not in owned:
            return f"active destination {r!r} is not scheduler-owned"
    for name, ids in (
        ("held source", led.source_holds.held_by_request),
        ("pending destination", led.pending_destinations.by_request),
        ("reserved destination", led.destination_holds.by_request),
    ):
        clash = owned & set(ids)
        if clash:
            return f"{name} {sorted(clash)} is also scheduler-owned"
    return None


from . import Invariant  # noqa: E402  (the registry type; defined before this module is imported)

INVARIANTS = (
    Invariant("src_bijective", "SRC-0", SourceHolds, src_bijective, src_bijective.__doc__),
    Invariant("src_disjoint", "SRC-1", SourceHolds, src_disjoint, src_disjoint.__doc__),
    Invariant("dst_bijective", "DST-0", DestinationHolds, dst_bijective, dst_bijective.__doc__),
    Invariant("act_bijective", "ACT-0", ActiveHandoffRequests, act_bijective, act_bijective.__doc__),
    Invariant("pend_bijective", "PEND-0", PendingDestinations, pend_bijective, pend_bijective.__doc__),
    Invariant("pend_live_in_fifo", "PEND-3", PendingDestinations, pend_live_in_fifo, pend_live_in_fifo.__doc__),
    Invariant("pend_fifo_bound", "PEND-7", PendingDestinations, pend_fifo_bound, pend_fifo_bound.__doc__,
              quirk="PEND-Q1"),
    Invariant("pend_only_head_marked", "PEND-5", PendingDestinations, pend_only_head_marked,
              pend_only_head_marked.__doc__),
    Invariant("ledger_one_role", "LEDGER-1", HandoffLedger, ledger_one_role, ledger_one_role.__doc__),
    Invariant("ledger_one_destination_stage", "LEDGER-2", HandoffLedger, ledger_one_destination_stage,
              ledger_one_destination_stage.__doc__),
    Invariant("ledger_marks_not_ahead", "LEDGER-4", HandoffLedger, ledger_marks_not_ahead,
              ledger_marks_not_ahead.__doc__),
)
