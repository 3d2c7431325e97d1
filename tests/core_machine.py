"""The Hypothesis state machine shared by the whole-core stateful tests
(tests/test_core_stateful.py for vLLM / TRT-LLM, tests/test_sglang_stateful.py for SGLang).

Random commands (valid and invalid: duplicate ids, unknown handoffs, reuse after removal),
passes and retries.  After every step:

* every registered invariant holds (``invariants.violations``);
* a rejected command raised before anything changed (the old core is kept and is still valid);
* the transition is pure: running it again on the same input gives an equal core and an equal
  result (CORE-1);
* a pass never ends before it starts (``end_ms >= now_ms``, CORE-3).

A subclass gives the engine-argument strategy (:meth:`CoreMachine.engine_args`) and may label
what a pass did (:meth:`CoreMachine.observe_pass`).  :func:`mutation_is_caught` runs a machine on a
deliberately broken core, to show the test can fail.
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
# a two-token alphabet makes prompts share prefixes (prefix-cache / radix hits, evictions)
PROMPTS = st.lists(st.integers(1, 2), min_size=0, max_size=12)
# mostly short outputs so requests complete within a few passes; 0 (never completes) stays possible
OUTPUTS = st.one_of(st.integers(1, 3), st.integers(0, 6))

#: >= 300 examples x 60 steps per engine type (issue acceptance)
CI_SETTINGS = settings(
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class CoreMachine(RuleBasedStateMachine):
    """Drives one core through random commands, passes and retries (see the module docstring)."""

    def engine_args(self):
        """The strategy of engine-argument JSON objects this machine draws from."""
        raise NotImplementedError

    def observe_pass(self, before, result) -> None:
        """Label what a pass did (Hypothesis events); may assert engine-specific facts."""

    @initialize(data=st.data())
    def setup(self, data):
        self.args = engine_args_from_json(data.draw(self.engine_args()))
        self.core = C.new_core(self.args)
        self.now = 0.0

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
        before = self.core
        result = self.step(lambda c: C.execute_pass(c, now))
        assert result is not None
        assert result.end_ms >= now
        assert result.token_ms >= now
        for ev in result.lifecycle_events:
            event(f"pass: {type(ev).__name__}")
        if any(s.rejected for s in result.output_signals):
            event("pass: rejection")
        if any(s.completed and not s.rejected for s in result.output_signals):
            event("pass: completion")
        self.observe_pass(before, result)
        self.now = result.end_ms

    @rule()
    def retry(self):
        self.step(lambda c: C.retry_pending_destinations(c))

    @invariant()
    def invariants_hold(self):
        if hasattr(self, "core"):
            found = invariants.violations(self.core)
            assert not found, "; ".join(map(str, found))


def mutation_is_caught(machine, txn_class, name, replacement, monkeypatch) -> None:
    """Replace ``txn_class.name`` by ``replacement`` and expect ``machine`` to fail."""
    monkeypatch.setattr(txn_class, name, replacement)
    with pytest.raises(Exception):
        run_state_machine_as_test(
            machine,
            # detection is what matters here; shrinking a found failure is skipped to keep CI short
            settings=settings(CI_SETTINGS, max_examples=200, derandomize=True, database=None,
                              phases=[Phase.explicit, Phase.generate]),
        )
