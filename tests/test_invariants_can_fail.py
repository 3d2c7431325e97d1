"""Every registered invariant can fail (a predicate that never fires checks nothing).

Each invariant gets a hand-made broken state and must be the only invariant that reports it: the
handoff kernels' invariants a kernel value built directly, the engine cores' ones a reachable core
(two requests admitted by one pass on a small pool) broken in one place. The last test checks that
the table covers the whole registry, so a new invariant without a broken state fails here.
"""

from __future__ import annotations

import attrs
import pytest
from pyrsistent import pdeque, pmap

import invariants
from model import core as C
from model.active_handoffs import ActiveHandoffRequests
from model.destination_holds import DestinationHolds
from model.engine_args import engine_args_from_json
from model.frozen import FrozenDict
from model.ids import hid, rid
from model.ledger import HandoffLedger
from model.pending_destinations import PendingDestinations, PendingEntry
from model.protocol import DirectRequest, Submit
from model.source_holds import SourceHolds

A, B = rid("a"), rid("b")


def _handoff_cases():
    """One hand-made kernel state per handoff invariant that breaks that invariant and no other."""
    r, r2, h, h2 = rid("r"), rid("r2"), hid("H"), hid("H2")
    entry = PendingEntry(r, None, None)
    held_r, _ = SourceHolds().register(r, hid("S"))
    held_r, _ = held_r.complete_source(r, "kv")
    return {
        # r both a held source and a pending destination (test_kernel_units has the same case)
        "ledger_one_role": HandoffLedger(source_holds=held_r, pending_destinations=PendingDestinations(
            fifo=pdeque([h]), by_handoff=pmap({h: entry}), by_request=pmap({r: h}))),
        # a pending request whose handoff map has no entry
        "src_bijective": SourceHolds(pending_by_request=pmap({r: h})),
        # r both pending (as H) and held (as H2), each pair of maps consistent
        "src_disjoint": SourceHolds(pending_by_request=pmap({r: h}), pending_by_handoff=pmap({h: r}),
                                    held_by_handoff=pmap({h2: (r, None)}), held_by_request=pmap({r: h2})),
        "dst_bijective": DestinationHolds(by_handoff=pmap({h: (r, None)})),
        "act_bijective": ActiveHandoffRequests(by_handoff=pmap({h: r})),
        "pend_bijective": PendingDestinations(fifo=pdeque([h]), by_handoff=pmap({h: entry})),
        # a live entry without a FIFO slot
        "pend_live_in_fifo": PendingDestinations(by_handoff=pmap({h: entry}), by_request=pmap({r: h})),
        # three distinct FIFO ids for one live entry (two tombstones past the bound)
        "pend_fifo_bound": PendingDestinations(fifo=pdeque([h, hid("T1"), hid("T2")]), by_handoff=pmap({h: entry}),
                                               by_request=pmap({r: h})),
        # the second entry carries a mark while H is the head
        "pend_only_head_marked": PendingDestinations(
            fifo=pdeque([h, h2]), by_handoff=pmap({h: entry, h2: PendingEntry(r2, None, 0)}),
            by_request=pmap({r: h, r2: h2})),
        # H pending (for r) and active (for r2): two destination stages, one role per request
        "ledger_one_destination_stage": HandoffLedger(
            pending_destinations=PendingDestinations(fifo=pdeque([h]), by_handoff=pmap({h: entry}),
                                                     by_request=pmap({r: h})),
            active_destinations=ActiveHandoffRequests(by_handoff=pmap({h: r2}), by_request=pmap({r2: h}))),
        # the head marked at generation 5 while the capacity generation is 0
        "ledger_marks_not_ahead": HandoffLedger(pending_destinations=PendingDestinations(
            fifo=pdeque([h]), by_handoff=pmap({h: PendingEntry(r, None, 5)}), by_request=pmap({r: h}))),
    }


def _second_cases():
    """Broken states that the first table's ones leave unchecked: each must also be reported by its
    invariant alone (a predicate that checks one of its clauses only fails here)."""
    r, r2, h = rid("r"), rid("r2"), hid("H")
    entry = PendingEntry(r, None, None)
    pending = PendingDestinations(fifo=pdeque([h]), by_handoff=pmap({h: entry}), by_request=pmap({r: h}))
    reserved = DestinationHolds(by_handoff=pmap({h: (r2, None)}), by_request=pmap({r2: h}))
    active = ActiveHandoffRequests(by_handoff=pmap({h: r}), by_request=pmap({r: h}))
    return [
        # PEND-Q1 revival: H fills two of four slots, so only the distinct count (3 > 2 * 1) is over
        ("pend_fifo_bound", PendingDestinations(fifo=pdeque([h, hid("T1"), hid("T2"), h]),
                                                by_handoff=pmap({h: entry}), by_request=pmap({r: h}))),
        # H pending (for r) and reserved (for r2)
        ("ledger_one_destination_stage", HandoffLedger(pending_destinations=pending, destination_holds=reserved)),
        # H reserved (for r2) and active (for r)
        ("ledger_one_destination_stage", HandoffLedger(destination_holds=reserved, active_destinations=active)),
    ]


@pytest.mark.parametrize("name, state", _second_cases(), ids=["fifo-revival", "pending-reserved", "reserved-active"])
def test_each_clause_can_fail(name, state):
    """PEND-7, LEDGER-2: each clause of the bound and each pair of destination stages is checked."""
    assert {v.invariant.name for v in invariants.violations(state)} == {name}


def _core(engine: str):
    """Requests a (10 tokens) and b (6 tokens, sharing a's first block) both running after one pass."""
    core = C.new_core(engine_args_from_json({"engine_type": engine, "block_size": 4, "num_gpu_blocks": 8}))
    core, _ = C.apply_command_effects(core, Submit(DirectRequest(list(range(10)), 3, "a")))
    core, _ = C.apply_command_effects(core, Submit(DirectRequest(list(range(6)), 3, "b")))
    core, _ = C.execute_pass(core, 0.0)
    assert invariants.violations(core) == []
    return core


def _pending_a():
    """A ledger part that lists the running request a as a pending destination."""
    return PendingDestinations(fifo=pdeque([hid("H")]), by_handoff=pmap({hid("H"): PendingEntry(A, None, None)}),
                               by_request=pmap({A: hid("H")}))


def _vllm_cases(v):
    return {
        # b stays a running member without a slot in the running queue
        "vllm_queues_consistent": attrs.evolve(v, running=v.running.remove(B)),
        # b vanishes from the scheduler while the KV manager still counts its blocks
        "vllm_kv_ownership_exact": attrs.evolve(
            v, requests=FrozenDict({k: r for k, r in v.requests.items() if k != B}),
            running=v.running.remove(B), running_members=v.running_members - {B}),
        # a pending destination (owns nothing) that the scheduler owns
        "vllm_roles_consistent": attrs.evolve(v, ledger=attrs.evolve(v.ledger, pending_destinations=_pending_a())),
        # one block counted twice: reset + inactive + active > N
        "kv_pool_consistent": attrs.evolve(v, kv=attrs.evolve(v.kv, reset=v.kv.reset + 1)),
    }


def _sglang_cases(s):
    ra, rb = s.running
    return {
        "sglang_new_token_ratio_in_range": attrs.evolve(s, new_token_ratio=s.config.init_new_token_ratio + 1.0),
        "sglang_roles_consistent": attrs.evolve(s, ledger=attrs.evolve(s.ledger, pending_destinations=_pending_a())),
        # a fully materialized request back in the waiting queue
        "sglang_queues_consistent": attrs.evolve(s, running=(ra,), waiting=(rb,)),
        # b claims a's locked node: the lock counts no longer match their holders
        "sglang_lock_counts": attrs.evolve(s, running=(ra, attrs.evolve(rb, last_node=ra.last_node))),
        # a ghost leaked slot that no slot accounts for
        "sglang_slot_conservation": attrs.evolve(s, leaked_slots=s.leaked_slots + 1),
    }


_CASES = {**_handoff_cases(), **_vllm_cases(_core("vllm")), **_sglang_cases(_core("sglang"))}


@pytest.mark.parametrize("name", sorted(_CASES))
def test_each_invariant_can_fail(name):
    """SRC-0, SRC-1, DST-0, ACT-0, PEND-0, PEND-3, PEND-5, PEND-7, LEDGER-1, LEDGER-2, LEDGER-4, KV-2,
    VLLM-2, VGEN-2, SG-4, SG-9, SG-34, SG-35: the broken state is reported by exactly that invariant."""
    assert {v.invariant.name for v in invariants.violations(_CASES[name])} == {name}


def test_every_registered_invariant_has_a_broken_state():
    assert {inv.name for inv in invariants.REGISTRY} == set(_CASES)


def test_assert_holds_raises_with_every_violation_and_passes_a_sound_state():
    """The assertion form of the registry: silent on the fixture core, and on a broken one an
    ``InvariantViolation`` carrying what :func:`invariants.violations` finds."""
    invariants.assert_holds(_core("vllm"))
    broken = _CASES["src_bijective"]
    with pytest.raises(invariants.InvariantViolation) as err:
        invariants.assert_holds(broken)
    assert [v.invariant.name for v in err.value.violations] == ["src_bijective"]
    assert str(err.value).startswith("src_bijective (")


def test_kv_ownership_message_counts_each_differing_block():
    """VGEN-2: the message lists every full block whose KV references and owner count differ, as
    ``(kv, owners)``. Dropping request a from the fixture (a: blocks [0-3] and [4-7]; b shares
    [0-3]) leaves the shared block at (2 references, 1 owner) and a's own second block at (1, 0):
    a block only the KV manager knows counts 0 owners."""
    import ast

    from invariants.vllm_core import kv_ownership_exact

    v = _core("vllm")
    broken = attrs.evolve(v, requests=FrozenDict({k: r for k, r in v.requests.items() if k != A}),
                          running=v.running.remove(A), running_members=v.running_members - {A})
    blocks = v.requests[A].sequence.unique_blocks
    first, second = blocks[0].seq_hash, blocks[1].seq_hash
    message = kv_ownership_exact(broken)
    assert message.startswith("full-block references (kv, owners) differ: ")
    assert ast.literal_eval(message.split(": ", 1)[1]) == {first: (2, 1), second: (1, 0)}
    # the other way round: an owned block the KV manager forgot counts 0 references
    forgot = attrs.evolve(v, kv=attrs.evolve(v.kv, active_full=FrozenDict(
        {h: refs for h, refs in v.kv.active_full.items() if h != second})))
    assert ast.literal_eval(kv_ownership_exact(forgot).split(": ", 1)[1]) == {second: (0, 1)}
