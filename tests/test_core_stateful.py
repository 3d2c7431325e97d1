"""Hypothesis stateful tests over whole engine cores (spec/core-commands.md, spec/vllm-core.md).

Random commands (valid and invalid: duplicate ids, unknown handoffs, reuse after
removal, TRT-LLM reservations), passes and retries on small pools.  After every
step:
* every registered invariant holds (kernel machines, ledger, queues, roles, exact
  KV ownership, KV pool conservation: CORE-1, LEDGER-1, VLLM-2, VGEN-2, KV-2);
* a rejected command raised before anything changed (the old core is kept and is
  still valid);
* the transition is pure: running it again on the same input gives an equal core
  and an equal result (CORE-1);
* a pass never ends before it starts (``end_ms >= now_ms``, CORE-3).
≥ 300 examples × 60 steps per engine type.
"""

from __future__ import annotations

import pytest
from core_machine import CI_SETTINGS, CoreMachine, mutation_is_caught
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test


def engine_args(engine: str):
    return st.fixed_dictionaries(
        {
            "engine_type": st.just(engine),
            "num_gpu_blocks": st.integers(2, 10),
            "block_size": st.sampled_from([2, 4]),  # powers of two (KV-1)
            "max_num_seqs": st.sampled_from([None, 1, 2, 3]),
            "max_num_batched_tokens": st.sampled_from([None, 4, 8, 16]),
            "enable_prefix_caching": st.booleans(),
            "enable_chunked_prefill": st.booleans(),
            "preemption_mode": st.sampled_from(["lifo", "fifo"]),
            "worker_type": st.sampled_from(["aggregated", "prefill", "decode"]),
        }
    )


class VllmMachine(CoreMachine):
    engine = "vllm"

    def engine_args(self):
        return engine_args(type(self).engine)

    def observe_pass(self, before, result):
        if result.metrics.vllm_preemptions_total > before.metrics().vllm_preemptions_total:
            event("pass: preemption")


class TrtllmMachine(VllmMachine):
    engine = "trtllm"


@pytest.mark.parametrize("machine", [VllmMachine, TrtllmMachine], ids=["vllm", "trtllm"])
def test_core_stateful(machine):
    run_state_machine_as_test(machine, settings=CI_SETTINGS)


# --- the stateful test can fail: deliberate breakages it must catch -----------------------


def _leak_held_source(self, payload):
    """Breaks VGEN-2: a released source keeps its KV."""


def _drop_without_freeing(self, uuid):
    """Breaks VLLM-17: a dropped request's blocks are never released."""
    self.take_completed(uuid)


def _cancel_reservation_keeps_kv(self, reserved):
    """Breaks CMD-8 / VLLM-22: a cancelled reservation keeps its KV."""


MUTATIONS = {
    "leak_held_source": ("release_held_source", _leak_held_source),
    "drop_without_freeing": ("drop_request", _drop_without_freeing),
    "cancel_reservation_keeps_kv": ("cancel_reservation", _cancel_reservation_keeps_kv),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_core_mutation_is_caught(mutation, monkeypatch):
    from model import vllm_core

    name, replacement = MUTATIONS[mutation]
    mutation_is_caught(VllmMachine, vllm_core._Txn, name, replacement, monkeypatch)
