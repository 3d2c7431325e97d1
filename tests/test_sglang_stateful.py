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
# a two-token alphabet makes prompts share prefixes (radix hits, duplicate pages, evictions)
PROMPTS = st.lists(st.integers(1, 2), min_size=0, max_size=12)
OUTPUTS = st.one_of(st.integers(1, 3), st.integers(0, 6))


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


class SglangMachine(RuleBasedStateMachine):
    @initialize(data=st.data())
    def setup(self, data):
        self.args = engine_args_from_json(data.draw(sglang_args()))
        self.core = C.new_core(self.args)
        self.now = 0.0

    def step(self, fn):
        old = self.core
        try:
            new, out = fn(old)
        except ModelError as err:
            event(f"rejected: {type(err).__name__}")
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
        before = self.core
        result = self.step(lambda c: C.execute_pass(c, now))
        assert result is not None
        assert result.end_ms >= now
        assert result.token_ms == result.end_ms
        for ev in result.lifecycle_events:
            event(f"pass: {type(ev).__name__}")
        if any(s.completed for s in result.output_signals):
            event("pass: completion")
        if len(self.core.waiting) and self.core.waiting[0].output_ids and not self.core.waiting[0].kv_indices:
            event("pass: retraction")
        if self.core.double_freed_slots > before.double_freed_slots:
            event("pass: SGQ-4 double free")
        if self.core.leaked_slots > before.leaked_slots:
            event("pass: SGQ-3 leak")
        self.now = result.end_ms

    @rule()
    def retry(self):
        self.step(lambda c: C.retry_pending_destinations(c))

    @invariant()
    def invariants_hold(self):
        if hasattr(self, "core"):
            found = invariants.violations(self.core)
            assert not found, "; ".join(map(str, found))


CI_SETTINGS = settings(
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


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
    monkeypatch.setattr(sglang_core._Txn, name, replacement)
    with pytest.raises(Exception):
        run_state_machine_as_test(
            SglangMachine,
            settings=settings(CI_SETTINGS, max_examples=200, derandomize=True, database=None,
                              phases=[Phase.explicit, Phase.generate]),
        )
