"""Every registered invariant can fail (a predicate that never fires checks nothing).

Each engine-core invariant gets a reachable core (two requests admitted by one pass on a small
pool) broken by hand in one place, and must be the only invariant that reports it. The handoff
kernels' invariants have theirs in ``test_kernel_units.py`` (``_broken_states``,
``test_invariants_detect_a_request_in_two_roles``); the last test checks that together they cover
the whole registry, so a new invariant without a broken state fails here.
"""

from __future__ import annotations

import attrs
import pytest
from pyrsistent import pdeque, pmap

import invariants
from model import core as C
from model.engine_args import engine_args_from_json
from model.frozen import FrozenDict
from model.ids import hid, rid
from model.pending_destinations import PendingDestinations, PendingEntry
from model.protocol import DirectRequest, Submit
from test_kernel_units import _broken_states

A, B = rid("a"), rid("b")


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


_ENGINE_CASES = {"vllm": _vllm_cases, "sglang": _sglang_cases}
_NAMES = [(engine, name) for engine, f in _ENGINE_CASES.items()
          for name in sorted(f(_core(engine)))]


@pytest.mark.parametrize("engine,name", _NAMES)
def test_each_core_invariant_can_fail(engine, name):
    """VLLM-2, VGEN-2, LEDGER-1, KV-2, SG-9, SG-4, SG-35, SG-34: the broken core is reported by
    exactly that invariant."""
    broken = _ENGINE_CASES[engine](_core(engine))[name]
    assert {v.invariant.name for v in invariants.violations(broken)} == {name}


def test_every_registered_invariant_has_a_broken_state():
    covered = set(_broken_states()) | {"ledger_one_role"} | {name for _e, name in _NAMES}
    assert {inv.name for inv in invariants.REGISTRY} == covered
