"""Hypothesis stateful test over the SGLang core (spec/sglang-core.md, spec/core-commands.md).

Random commands (valid and invalid: duplicate ids, unknown handoffs, reuse after
removal, oversized destinations), passes and retries on small pools with random
page sizes, chunk and prefill budgets, FIFO or LPM, and all three worker types.
After every step:
* every registered invariant holds (ledger machines, queues SG-4 with SGQ-10, roles,
  lock counts SG-35, the quirk-aware slot conservation SG-34 with SGQ-3 / SGQ-4, the ratio
  range SG-9);
* a rejected command raised before anything changed (the old core is kept and is
  still valid);
* the transition is pure: running it again on the same input gives an equal core
  and an equal result (CORE-1);
* a pass never ends before it starts (``end_ms >= now_ms``, CORE-3).
>= 300 examples x 60 steps.
"""

from __future__ import annotations

import pytest
from core_machine import CI_SETTINGS, CoreMachine, mutation_is_caught
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test


@st.composite
def sglang_args(draw):
    bs = draw(st.integers(1, 4))
    sg = {
        "chunked_prefill_size": bs * draw(st.integers(1, 4)),
        "schedule_policy": draw(st.sampled_from(["fifo", "lpm"])),
    }
    if draw(st.booleans()):
        sg["max_prefill_tokens"] = draw(st.sampled_from([2, 4, 8, 16]))
    if draw(st.booleans()):
        sg["clip_max_new_tokens"] = draw(st.integers(1, 4))
    if draw(st.booleans()):
        sg["schedule_conservativeness"] = draw(st.sampled_from([0.0, 0.5, 1.0, 2.0]))
    return {
        "engine_type": "sglang",
        "num_gpu_blocks": draw(st.integers(2, 10)),
        "block_size": bs,
        "max_num_seqs": draw(st.sampled_from([None, 1, 2, 3])),
        "worker_type": draw(st.sampled_from(["aggregated", "prefill", "decode"])),
        "sglang": sg,
    }


class SglangMachine(CoreMachine):
    def engine_args(self):
        return sglang_args()

    def observe_pass(self, before, result):
        assert result.token_ms == result.end_ms
        core = self.core
        if len(core.waiting) and core.waiting[0].output_ids and not core.waiting[0].kv_indices:
            event("pass: retraction")
        if core.double_freed_slots > before.double_freed_slots:
            event("pass: SGQ-4 double free")
        if core.leaked_slots > before.leaked_slots:
            event("pass: SGQ-3 leak")


def test_sglang_stateful():
    run_state_machine_as_test(SglangMachine, settings=CI_SETTINGS)


# --- the stateful test can fail: deliberate breakages it must catch -----------------------


def _leak_held_source(self, payload):
    """Breaks SGGEN-2: a released source keeps its KV."""


def _cancel_reservation_keeps_kv(self, reserved):
    """Breaks SG-33: a cancelled reservation keeps its KV and its lock."""


def _retract_without_unlock(self, req):
    """Breaks SG-24: retraction frees slots but keeps the radix lock."""
    self.kv.free_indices(req.kv_indices[req.cached_tokens:])


MUTATIONS = {
    "leak_held_source": ("release_held_source", _leak_held_source),
    "cancel_reservation_keeps_kv": ("cancel_reservation", _cancel_reservation_keeps_kv),
    "retract_without_unlock": ("free_request_kv", _retract_without_unlock),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_sglang_mutation_is_caught(mutation, monkeypatch):
    from model import sglang_core

    name, replacement = MUTATIONS[mutation]
    mutation_is_caught(SglangMachine, sglang_core._Txn, name, replacement, monkeypatch)
