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
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import invariants
from model import core as C
from model.engine_args import engine_args_from_json
from model.errors import ModelError
from model.protocol import (
    ActivateDestination,
    CancelDestination,
    CancelSource,
    DirectRequest,
    ReleaseSource,
    ReserveDestination,
    Submit,
    SubmitHandoffPrefill,
)

REQUESTS = st.sampled_from([f"r{i}" for i in range(12)])
HANDOFFS = st.sampled_from([f"h{i}" for i in range(4)])
# a two-token alphabet makes prompts share prefixes (prefix-cache hits, evictions)
PROMPTS = st.lists(st.integers(1, 2), min_size=0, max_size=12)
# mostly short outputs so requests complete within a few passes; 0 (never completes) stays possible
OUTPUTS = st.one_of(st.integers(1, 3), st.integers(0, 6))


def engine_args(engine: str):
    return st.fixed_dictionaries(
        {
            "engine_type": st.just(engine),
            "num_gpu_blocks": st.integers(2, 10),
            "block_size": st.integers(2, 4),
            "max_num_seqs": st.sampled_from([None, 1, 2, 3]),
            "max_num_batched_tokens": st.sampled_from([None, 4, 8, 16]),
            "enable_prefix_caching": st.booleans(),
            "enable_chunked_prefill": st.booleans(),
            "preemption_mode": st.sampled_from(["lifo", "fifo"]),
            "worker_type": st.sampled_from(["aggregated", "prefill", "decode"]),
        }
    )


class CoreMachine(RuleBasedStateMachine):
    engine = "vllm"

    @initialize(data=st.data())
    def setup(self, data):
        self.args = engine_args_from_json(data.draw(engine_args(type(self).engine)))
        self.core = C.new_core(self.args)
        self.now = 0.0
        self.preemptions = 0

    def step(self, fn):
        old = self.core
        try:
            new, out = fn(old)
        except ModelError as err:
            event(f"rejected: {type(err).__name__}")
            # rejected before anything changed: the caller keeps ``old``; it is still valid
            assert not invariants.violations(old)
            return None
        again = fn(old)
        assert again == (new, out), "transition is not a function of its inputs"
        self.core = new
        return out

    def command(self, cmd, allow=True):
        effects = self.step(lambda c: C.apply_command_effects(c, cmd, allow))
        if effects is not None:
            event(f"{type(cmd).__name__}: {type(effects.result).__name__}")
            for ev in effects.lifecycle_events:
                event(f"command: {type(ev).__name__}")
        return effects

    @rule(r=REQUESTS, prompt=PROMPTS, m=OUTPUTS)
    def submit(self, r, prompt, m):
        self.command(Submit(DirectRequest(prompt, m, r)))

    @rule(h=HANDOFFS, r=REQUESTS, prompt=PROMPTS, m=OUTPUTS)
    def submit_prefill(self, h, r, prompt, m):
        self.command(SubmitHandoffPrefill(h, DirectRequest(prompt, m, r)))

    @rule(h=HANDOFFS)
    def release_source(self, h):
        self.command(ReleaseSource(h))

    @rule(h=HANDOFFS)
    def cancel_source(self, h):
        self.command(CancelSource(h))

    @rule(h=HANDOFFS, r=REQUESTS, prompt=PROMPTS, m=OUTPUTS, allow=st.booleans())
    def reserve(self, h, r, prompt, m, allow):
        self.command(ReserveDestination(h, DirectRequest(prompt, m, r)), allow)

    @rule(h=HANDOFFS)
    def activate(self, h):
        self.command(ActivateDestination(h))

    @rule(h=HANDOFFS)
    def cancel_destination(self, h):
        self.command(CancelDestination(h))

    # passes are what make progress: three rules give them three times the weight of one command
    @rule(idle=st.sampled_from([0.0, 0.5]), count=st.integers(1, 4))
    def run_passes(self, idle, count):
        for _ in range(count):
            self.run_pass(idle)

    @rule(count=st.integers(1, 4))
    def run_passes_back_to_back(self, count):
        self.run_passes(0.0, count)

    @rule(count=st.integers(1, 4))
    def run_passes_with_retry(self, count):
        for _ in range(count):
            self.run_pass(0.0)
            self.retry()

    def run_pass(self, idle):
        now = self.now + idle
        result = self.step(lambda c: C.execute_pass(c, now))
        assert result is not None
        assert result.end_ms >= now
        for ev in result.lifecycle_events:
            event(f"pass: {type(ev).__name__}")
        if any(s.rejected for s in result.output_signals):
            event("pass: rejection")
        if any(s.completed and not s.rejected for s in result.output_signals):
            event("pass: completion")
        assert result.token_ms >= now
        self.now = result.end_ms
        if result.metrics.vllm_preemptions_total > self.preemptions:
            event("pass: preemption")
        self.preemptions = result.metrics.vllm_preemptions_total

    @rule()
    def retry(self):
        self.step(lambda c: C.retry_pending_destinations(c))

    @invariant()
    def invariants_hold(self):
        if hasattr(self, "core"):
            found = invariants.violations(self.core)
            assert not found, "; ".join(map(str, found))


class VllmMachine(CoreMachine):
    engine = "vllm"


class TrtllmMachine(CoreMachine):
    engine = "trtllm"


CI_SETTINGS = settings(
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


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
    monkeypatch.setattr(vllm_core._Txn, name, replacement)
    with pytest.raises(Exception):
        run_state_machine_as_test(
            VllmMachine,
            # detection is what matters here; shrinking a found failure is skipped to keep CI short
            settings=settings(CI_SETTINGS, max_examples=200, derandomize=True, database=None,
                              phases=[Phase.explicit, Phase.generate]),
        )
