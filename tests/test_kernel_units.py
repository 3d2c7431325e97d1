"""Unit tests of the kernel: ports of upstream's source_holds.rs and scheduler/mod.rs unit tests,
plus rule-level checks of the protocol values, admission stages and FPM helpers.

Upstream tests are named ``test_<upstream name>``; each docstring gives its location at
a822423412a0 and the spec rules it covers.
"""

from __future__ import annotations

import math

import attrs
import pytest

import invariants
from model import fpm, protocol
from model.active_handoffs import ActiveHandoffRequests
from model.admission import AdmissionInvariant, AdmissionStage
from model.destination_holds import DestinationHolds
from model.errors import (
    CommandRejected,
    DestinationHandoffActive,
    DestinationHandoffPending,
    DestinationRequestPending,
    DestinationReservationExists,
    InternalInvariantBroken,
    SourceHandoffActive,
    SourceRequestActive,
)
from model.ids import HandoffId, RequestId, hid, rid
from model.ledger import GENERATION_MAX, HandoffLedger
from model.pending_destinations import PendingDestinations
from model.source_holds import Held, MISSING, Release, RemovedHeld, RemovedPending, SourceHolds


def u(n: int) -> str:
    """The string form of ``Uuid::from_u128(n)`` upstream uses in these tests."""
    return f"00000000-0000-0000-0000-{n:012x}"


# --- ports of lib/mocker/src/scheduler/source_holds.rs tests -------------------------------


def test_completion_atomically_moves_registered_payload_to_held():
    """source_holds.rs:454-479 — SRC-1, SRC-3, SRC-4."""
    r, h = rid(u(1)), hid(u(2))
    holds, _ = SourceHolds().register(r, h)
    assert holds.is_registered(h)
    holds, completion = holds.complete_source(r, "payload")
    assert completion == Held(h)
    assert not holds.is_registered(h)
    assert holds.is_held(h)
    with pytest.raises(SourceRequestActive):
        holds.register(r, hid(u(7)))
    holds, removed = holds.remove(h)
    assert removed == RemovedHeld("payload")
    holds, removed = holds.remove(h)
    assert removed is MISSING


def test_active_ids_are_rejected_but_released_ids_can_be_reused():
    """source_holds.rs:481-496 — SRC-1, SRC-4 (ids are reusable after removal)."""
    r, h = rid(u(3)), hid(u(4))
    holds, _ = SourceHolds().register(r, h)
    with pytest.raises(SourceHandoffActive):
        holds.register(rid(u(5)), h)
    with pytest.raises(SourceRequestActive):
        holds.register(r, hid("fresh"))
    holds, removed = holds.remove(h)
    assert removed == RemovedPending(r)
    holds, _ = holds.register(rid(u(5)), h)
    assert holds.is_registered(h)


def test_unregistered_completion_releases_payload():
    """source_holds.rs:498-507 — SRC-3."""
    holds = SourceHolds()
    same, completion = holds.complete_source(rid(u(6)), "payload")
    assert completion == Release("payload")
    assert same == holds


def test_pending_destination_preserves_fifo_after_head_cancellation():
    """source_holds.rs:509-526 — PEND-3, PEND-4, PEND-5, PEND-7."""
    first, second = hid(u(10)), hid(u(11))
    p, _ = PendingDestinations().insert(rid(u(20)), first, "first")
    p, _ = p.insert(rid(u(21)), second, "second")
    p, removed = p.remove(first)
    assert removed == (rid(u(20)), "first")
    p, due = p.front_due(0)
    assert due == (second, rid(u(21)), "second")
    p, _ = p.mark_front_attempted(0)
    p, due = p.front_due(0)
    assert due is None
    p, due = p.front_due(1)
    assert due is not None


def test_pending_destination_indexes_reject_conflicts_and_compact_tombstones():
    """source_holds.rs:528-554 — PEND-1, PEND-6, PEND-7 (compaction bound)."""
    p = PendingDestinations()
    handoffs = [hid(u(100 + i)) for i in range(8)]
    for i, h in enumerate(handoffs):
        p, _ = p.insert(rid(u(200 + i)), h, i)
    with pytest.raises(DestinationRequestPending):
        p.validate(rid(u(200)), hid("fresh"))
    with pytest.raises(DestinationHandoffPending):
        p.validate(rid("fresh"), handoffs[0])
    for h in handoffs[:6]:
        p, removed = p.remove(h)
        assert removed is not None
    assert len(p.fifo) <= len(p.by_handoff) * 2
    p, due = p.front_due(0)
    assert due == (handoffs[6], rid(u(206)), 6)
    p, popped = p.pop_front()
    assert popped == (handoffs[6], rid(u(206)), 6)
    p, popped = p.pop_front()
    assert popped[0] == handoffs[7]
    assert p.is_empty()


# --- ports of lib/mocker/src/scheduler/mod.rs Welford tests ---------------------------------


def test_welford_acc_empty():
    """scheduler/mod.rs:568-574 — FPM-1."""
    acc = fpm.WelfordAcc()
    assert (acc.count, acc.sum, acc.variance()) == (0, 0.0, 0.0)


def test_welford_acc_single_value():
    """scheduler/mod.rs:576-583 — FPM-1."""
    acc = fpm.WelfordAcc().add(42.0)
    assert (acc.count, acc.sum, acc.variance()) == (1, 42.0, 0.0)


def test_welford_acc_population_variance():
    """scheduler/mod.rs:585-596 — FPM-1: values 2,4,4,4,5,5,7,9 have mean 5, population variance 4."""
    acc = fpm.welford([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert acc.count == 8 and acc.sum == 40.0
    assert abs(acc.variance() - 4.0) < 1e-10


def test_welford_acc_matches_python():
    """scheduler/mod.rs:598-616 — FPM-1: 100, 200, 300 have population variance 20000/3."""
    acc = fpm.welford([100.0, 200.0, 300.0])
    assert acc.count == 3 and acc.sum == 600.0
    assert abs(acc.variance() - 20000.0 / 3.0) < 1e-10


# --- FPM snapshot and accept-length (FPM-2, FPM-3) -----------------------------------------


def test_build_fpm_snapshot_sums_and_variances():
    """FPM-2, derived by hand: prefills (prompt 10, prefix 4, computed 6) and (prompt 20, prefix 0,
    computed 20) give 2 prefills, 26 tokens, 4 prefix tokens, population variance of {10, 20} = 25.
    Decodes of length 3 and 5: sum 8, variance 1.  Queued prefill 7: variance 0.  No queued decodes."""
    snap = fpm.build_fpm_snapshot([(10, 4, 6), (20, 0, 20)], [3, 5], [7], [], 0.5)
    assert snap.num_prefill_requests == 2
    assert snap.sum_prefill_tokens == 26
    assert snap.sum_prefill_kv_tokens == 4
    assert snap.var_prefill_length == 25.0
    assert (snap.num_decode_requests, snap.sum_decode_kv_tokens, snap.var_decode_kv_tokens) == (2, 8, 1.0)
    assert (snap.num_queued_prefill, snap.sum_queued_prefill_tokens, snap.var_queued_prefill_length) == (1, 7, 0.0)
    assert (snap.num_queued_decode, snap.sum_queued_decode_kv_tokens) == (0, 0)
    assert snap.wall_time_secs == 0.5
    assert snap.has_scheduled_work()  # FPM-4
    assert not fpm.build_fpm_snapshot([], [], [1], [2], 0.0).has_scheduled_work()


def test_accept_length_sample_counts_visible_tokens_and_forwards():
    """FPM-3, derived by hand: two visible tokens of A and one of B are 3 tokens over 2 forwards;
    a rejected signal is invisible; no visible token gives (0, 0)."""
    S = protocol.OutputSignal
    signals = [S("A", False), S("A", False), S("B", True), S("C", True, rejected=True)]
    assert fpm.accept_length_sample(signals) == (3, 2)
    assert fpm.accept_length_sample([S("C", True, rejected=True)]) == (0, 0)
    assert fpm.accept_length_sample([]) == (0, 0)


@pytest.mark.parametrize(
    "max_num_seqs,num_gpu_blocks,expected",
    # CHAN-1/CHAN-2, derived by hand from max(max_num_seqs or num_gpu_blocks, 1) * 2
    [(None, 100, 200), (8, 100, 16), (0, 100, 2), (None, 0, 2)],
)
def test_handoff_channel_capacity(max_num_seqs, num_gpu_blocks, expected):
    assert protocol.handoff_channel_capacity(max_num_seqs, num_gpu_blocks) == expected


# --- admission stages (ADM-1) ---------------------------------------------------------------


@pytest.mark.parametrize(
    "pending,materialized,stage",
    [
        (False, True, AdmissionStage.MATERIALIZED),
        (True, True, AdmissionStage.MATERIALIZED),
        (True, False, AdmissionStage.PENDING_DESTINATION_HEAD),
        (False, False, AdmissionStage.FRESH_KV),
    ],
)
def test_admission_stage_rule(pending, materialized, stage):
    """ADM-1: materialized wins; otherwise a pending destination blocks fresh KV."""
    assert AdmissionInvariant(pending).stage_for(materialized) is stage


# --- ledger (LEDGER-1..LEDGER-5) ------------------------------------------------------------


def test_ledger_validate_destination_order_and_active_handoff():
    """LEDGER-2: pending checks, then reservation checks, then the active-handoff check."""
    ledger = HandoffLedger()
    pend, _ = ledger.pending_destinations.insert(rid("a"), hid("H"), "p")
    ledger = attrs.evolve(ledger, pending_destinations=pend)
    with pytest.raises(DestinationRequestPending):
        ledger.validate_destination(rid("a"), hid("H"))
    with pytest.raises(DestinationHandoffPending):
        ledger.validate_destination(rid("b"), hid("H"))
    held, _ = ledger.destination_holds.insert(rid("c"), hid("K"), "k")
    ledger = attrs.evolve(ledger, destination_holds=held)
    with pytest.raises(DestinationReservationExists):
        ledger.validate_destination(rid("c"), hid("Z"))
    with pytest.raises(DestinationHandoffActive):
        ledger.validate_destination(rid("d"), hid("K"))
    act, _ = ledger.active_destinations.insert(hid("Q"), rid("e"))
    ledger = attrs.evolve(ledger, active_destinations=act)
    with pytest.raises(DestinationHandoffActive):
        ledger.validate_destination(rid("f"), hid("Q"))
    assert ledger.destination_stage(hid("H")) == "pending"
    assert ledger.destination_stage(hid("K")) == "reserved"
    assert ledger.destination_stage(hid("Q")) == "active"
    assert ledger.destination_stage(hid("none")) is None
    assert ledger.owns_request(rid("e")) and not ledger.owns_request(rid("zz"))
    assert not ledger.is_empty()
    assert invariants.violations(ledger) == []


def test_ledger_generation_bump_and_overflow():
    """LEDGER-4: the generation grows by one; at u64::MAX upstream panics."""
    ledger = HandoffLedger().bump_generation().bump_generation()
    assert ledger.capacity_generation == 2
    with pytest.raises(InternalInvariantBroken):
        attrs.evolve(ledger, capacity_generation=GENERATION_MAX).bump_generation()
    # the bound is u64::MAX itself (18446744073709551615): one below it still bumps, to the bound
    assert GENERATION_MAX == 18_446_744_073_709_551_615
    top = attrs.evolve(ledger, capacity_generation=18_446_744_073_709_551_614).bump_generation()
    assert top.capacity_generation == 18_446_744_073_709_551_615


def test_source_and_destination_namespaces_are_independent():
    """LEDGER-3: the same handoff id may be a source hold and a destination of one core."""
    ledger = HandoffLedger()
    src, _ = ledger.source_holds.register(rid("s"), hid("H"))
    pend, _ = ledger.pending_destinations.insert(rid("d"), hid("H"), None)
    ledger = attrs.evolve(ledger, source_holds=src, pending_destinations=pend)
    assert invariants.violations(ledger) == []


def test_invariants_detect_a_request_in_two_roles():
    """LEDGER-1 / ledger_one_role can fail: a request both held-source and pending destination."""
    ledger = HandoffLedger()
    src, _ = ledger.source_holds.register(rid("x"), hid("H"))
    src, _ = src.complete_source(rid("x"), "kv")
    pend, _ = ledger.pending_destinations.insert(rid("x"), hid("D"), None)
    bad = attrs.evolve(ledger, source_holds=src, pending_destinations=pend)
    names = {v.invariant.name for v in invariants.violations(bad)}
    assert names == {"ledger_one_role"}


# --- the tombstone-revival quirk (PEND-Q1, upstream S1) --------------------------------------


def test_tombstone_revival_lets_a_reused_handoff_jump_the_fifo():
    """PEND-Q1: insert H, A, B; cancel H; insert D; re-insert H -> FIFO [H, A, B, D, H] and H is the head
    (the example of handoff-lifecycle notes S1)."""
    p = PendingDestinations()
    for name in "HAB":
        p, _ = p.insert(rid("r" + name), hid(name), name)
    p, _ = p.remove(hid("H"))
    p, _ = p.insert(rid("rD"), hid("D"), "D")
    p, _ = p.insert(rid("rH2"), hid("H"), "H2")
    assert list(p.fifo) == [hid(n) for n in "HABDH"]
    p, due = p.front_due(0)
    assert due == (hid("H"), rid("rH2"), "H2")
    assert p.live_order() == tuple(hid(n) for n in "HABD")


def test_revival_can_exceed_the_compaction_bound():
    """PEND-Q1 consequence, derived by hand: with duplicate FIFO slots of one live id,
    compaction keeps every copy, so len(fifo) > 2*live is reachable; the quirk-aware
    invariant pend_fifo_bound accepts it."""
    p = PendingDestinations()
    p, _ = p.insert(rid("rH"), hid("H"), 0)
    p, _ = p.insert(rid("rA"), hid("A"), 0)
    p, _ = p.insert(rid("rB"), hid("B"), 0)
    p, _ = p.remove(hid("H"))  # [H A B], live 2: no compaction
    p, _ = p.insert(rid("rH"), hid("H"), 0)  # [H A B H]
    p, _ = p.remove(hid("H"))  # [H A B H], live 2
    p, _ = p.insert(rid("rH"), hid("H"), 0)  # [H A B H H], live 3
    p, _ = p.remove(hid("A"))  # 5 > 4: compact -> [H B H H]
    p, _ = p.remove(hid("B"))  # 4 > 2: compact -> [H H H], live 1
    assert list(p.fifo) == [hid("H")] * 3
    assert len(p) == 1
    assert invariants.violations(p) == []


# --- values are frozen ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,field",
    [
        (SourceHolds(), "pending_by_request"),
        (DestinationHolds(), "by_handoff"),
        (ActiveHandoffRequests(), "by_request"),
        (PendingDestinations(), "fifo"),
        (HandoffLedger(), "capacity_generation"),
        (protocol.DirectRequest((1, 2), 3, "r"), "tokens"),
        (protocol.Submit(protocol.DirectRequest((1,), 1, "r")), "request"),
        (fpm.WelfordAcc(), "count"),
        (RequestId("r"), "value"),
    ],
)
def test_states_are_frozen(value, field):
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(value, field, None)


def test_errors_form_one_hierarchy():
    for cls in (SourceHandoffActive, SourceRequestActive, DestinationRequestPending,
                DestinationHandoffPending, DestinationReservationExists, DestinationHandoffActive):
        assert issubclass(cls, CommandRejected)
        assert cls.rule


def test_ids_are_ordered_and_typed():
    """ID-1: ids are opaque, typed, totally ordered values."""
    assert RequestId("a") < RequestId("b")
    assert RequestId("a") != HandoffId("a")
    with pytest.raises(TypeError):
        RequestId("")
    assert math.isfinite(float(len(str(RequestId("x")))))


# --- protocol values (PROTO-1..PROTO-8) and machine queries ---------------------------------


def test_protocol_values_are_hashable_and_normalized():
    """PROTO-1..PROTO-8: frozen, hashable values; tokens become a tuple, ids are typed."""
    req = protocol.DirectRequest([1, 2, 3], 4, "r")  # PROTO-1
    assert req.tokens == (1, 2, 3) and req.uuid == RequestId("r") and req.prompt_len == 3
    timing = protocol.HandoffTransferTiming(protocol.KvTransferTimingMode.FULL_PROMPT, 3, 2, 1.0)  # PROTO-2
    commands = [  # PROTO-3
        protocol.Submit(req),
        protocol.SubmitHandoffPrefill("h", req),
        protocol.ReleaseSource("h"),
        protocol.CancelSource("h"),
        protocol.ReserveDestination("h", req),
        protocol.ActivateDestination("h"),
        protocol.CancelDestination("h"),
    ]
    assert tuple(type(c) for c in commands) == protocol.COMMAND_TYPES
    assert commands[2].handoff_id == HandoffId("h")
    results = [protocol.Submitted("r"), protocol.DestinationAccepted("r"), protocol.APPLIED, protocol.NOOP]  # PROTO-4
    events = [protocol.SourceHeld("h", "r", timing), protocol.DestinationReserved("h", "r", 12)]  # PROTO-5
    effects = protocol.CommandEffects(results[0], events)  # PROTO-6
    assert effects.lifecycle_events == tuple(events) and effects.kv_events == ()
    signal = protocol.OutputSignal("r", True)  # PROTO-7
    admission = protocol.AdmissionEvent("r", 0)  # PROTO-8
    values = commands + results + events + [effects, signal, admission, timing, req]
    assert len({hash(v) for v in values}) == len(values)
    assert protocol.Applied() == protocol.APPLIED and protocol.Noop() != protocol.APPLIED


def test_source_hold_queries():
    """SRC-0, SRC-2, SRC-6: the state starts empty; contains_* see pending and held entries."""
    holds = SourceHolds()
    assert holds.is_empty()
    holds, _ = holds.register(rid("a"), hid("H"))
    assert holds.contains_request(rid("a")) and holds.contains_handoff(hid("H"))
    assert not holds.is_empty()
    holds, _ = holds.complete_source(rid("a"), "kv")
    assert holds.contains_request(rid("a")) and holds.held_payload(hid("H")) == "kv"
    assert holds.held_payloads() == ("kv",)
    holds, dropped = holds.remove_request(rid("a"))  # SRC-5: held entries are untouched
    assert dropped is None and holds.is_held(hid("H"))
    holds, _ = holds.remove(hid("H"))
    assert holds.is_empty() and holds == SourceHolds()


def test_destination_hold_queries_and_payload_order():
    """DST-0, DST-4: reservations by handoff and request; payloads in handoff-id order."""
    d = DestinationHolds()
    d, _ = d.insert(rid("b"), hid("H2"), "second")
    d, _ = d.insert(rid("a"), hid("H1"), "first")
    assert len(d) == 2 and d.contains(hid("H1")) and d.contains_request(rid("b"))
    assert d.payloads() == ("first", "second")
    assert d.get(hid("H2")) == "second" and d.get(hid("none")) is None
    with pytest.raises(InternalInvariantBroken):
        d.insert(rid("a"), hid("H3"), "dup")


def test_active_handoff_bijection():
    """ACT-0..ACT-3: a bijection h <-> r, removable from either side."""
    a, _ = ActiveHandoffRequests().insert(hid("H"), rid("r"))
    assert a.contains_handoff(hid("H")) and a.contains_request(rid("r")) and len(a) == 1
    with pytest.raises(InternalInvariantBroken):
        a.insert(hid("H2"), rid("r"))
    b, removed = a.remove_request(rid("r"))
    assert removed == hid("H") and b.is_empty()
    c, removed = a.remove_handoff(hid("H"))
    assert removed == rid("r") and c == ActiveHandoffRequests()


def test_pending_counts_live_entries_only():
    """PEND-0, PEND-8: len/has_pending count live entries, not FIFO slots; payloads in FIFO order."""
    p = PendingDestinations()
    assert not p.has_pending() and len(p) == 0
    for name in "ABC":
        p, _ = p.insert(rid("r" + name), hid(name), name)
    p, _ = p.remove(hid("B"))
    assert len(p.fifo) == 3 and len(p) == 2 and p.has_pending()
    assert p.payloads() == ("A", "C")
    assert p.entry(hid("A")).last_attempt_generation is None


def test_ledger_starts_empty():
    """LEDGER-0, LEDGER-5: a fresh ledger is empty at generation 0."""
    ledger = HandoffLedger()
    assert ledger.is_empty() and ledger.capacity_generation == 0


from hypothesis import given, strategies as st  # noqa: E402


@given(st.lists(st.integers(0, 10**6), max_size=50))
def test_welford_over_a_sequence_equals_repeated_add(values):
    """FPM-1: the batch form performs the same float operations in the same order."""
    acc = fpm.WelfordAcc()
    for v in values:
        acc = acc.add(float(v))
    assert fpm.welford(values) == acc
