"""Stateful differential tests of the four bookkeeping machines (spec/handoff-lifecycle.md).

For each machine a Hypothesis ``RuleBasedStateMachine`` applies random operations
— valid and invalid: duplicate ids, unknown ids, reuse after removal, over a small
id universe — to the model and to the plain mutable rendering in
``tests/plain_kernel.py``.  After every step: both agree on the outcome (or on the
error kind), every registered invariant holds, and a rejected operation changed
nothing.  ``test_mutation_is_caught`` proves the machines can fail: each
deliberate breakage of the model must be found.

Rules exercised: SRC-1..SRC-5, DST-1..DST-3, ACT-1..ACT-3, PEND-1..PEND-7, PEND-Q1.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from pyrsistent import pdeque

import invariants
from model import source_holds
from model.active_handoffs import ActiveHandoffRequests
from model.destination_holds import DestinationHolds
from model.errors import ModelError
from model.ids import HandoffId, RequestId
from model.pending_destinations import PendingDestinations
from model.source_holds import SourceHolds

from plain_kernel import PlainActive, PlainDestinationHolds, PlainPending, PlainSourceHolds, Rejected

REQUESTS = st.sampled_from([RequestId(f"r{i}") for i in range(4)])
HANDOFFS = st.sampled_from([HandoffId(f"h{i}") for i in range(4)])
PAYLOADS = st.integers(0, 3)
GENERATIONS = st.integers(0, 2)

CI_SETTINGS = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class Differential(RuleBasedStateMachine):
    """Shared harness: run one operation on both renderings and compare."""

    model_factory = None
    plain_factory = None

    def __init__(self):
        super().__init__()
        self.model = type(self).model_factory()
        self.plain = type(self).plain_factory()

    def project(self, model):  # pragma: no cover - overridden
        raise NotImplementedError

    def normalize(self, name, outcome):
        return outcome

    def apply(self, name, *args):
        before = self.model
        plain_before = self.plain.snapshot()
        model_err = plain_err = None
        result = None
        try:
            result = getattr(self.model, name)(*args)
        except ModelError as err:
            model_err = type(err).__name__
        plain_out = None
        try:
            plain_out = getattr(self.plain, name)(*args)
        except Rejected as err:
            plain_err = err.kind
        assert model_err == plain_err, f"{name}{args}: model error {model_err}, spec error {plain_err}"
        if model_err is not None:
            # a rejected operation changes nothing
            assert self.model is before
            assert self.project(self.model) == plain_before == self.plain.snapshot()
            return
        if result is None:  # a pure check (validate) that passed
            assert plain_out is None
            return
        new, outcome = result
        assert self.normalize(name, outcome) == plain_out, f"{name}{args}"
        self.model = new

    @invariant()
    def renderings_agree(self):
        assert self.project(self.model) == self.plain.snapshot()

    @invariant()
    def registered_invariants_hold(self):
        found = invariants.violations(self.model)
        assert not found, "; ".join(map(str, found))


class SourceHoldsMachine(Differential):
    """SRC-1..SRC-5 against the plain rendering."""

    model_factory = SourceHolds
    plain_factory = PlainSourceHolds

    def project(self, m):
        return dict(m.pending_by_request), dict(m.held_by_handoff)

    def normalize(self, name, outcome):
        if isinstance(outcome, source_holds.Release):
            return ("release", outcome.payload)
        if isinstance(outcome, source_holds.Held):
            return ("held", outcome.handoff_id)
        if isinstance(outcome, source_holds.RemovedHeld):
            return ("held", outcome.payload)
        if isinstance(outcome, source_holds.RemovedPending):
            return ("pending", outcome.request_id)
        if isinstance(outcome, source_holds.RemovedMissing):
            return ("missing",)
        return outcome

    @rule(r=REQUESTS, h=HANDOFFS)
    def register(self, r, h):
        self.apply("register", r, h)

    @rule(r=REQUESTS, payload=PAYLOADS)
    def complete_source(self, r, payload):
        self.apply("complete_source", r, payload)

    @rule(h=HANDOFFS)
    def remove(self, h):
        self.apply("remove", h)

    @rule(r=REQUESTS)
    def remove_request(self, r):
        self.apply("remove_request", r)


class DestinationHoldsMachine(Differential):
    """DST-1..DST-3 against the plain rendering."""

    model_factory = DestinationHolds
    plain_factory = PlainDestinationHolds

    def project(self, m):
        return dict(m.by_handoff)

    @rule(r=REQUESTS, h=HANDOFFS)
    def validate(self, r, h):
        self.apply("validate", r, h)

    @rule(r=REQUESTS, h=HANDOFFS, payload=PAYLOADS)
    def insert(self, r, h, payload):
        self.apply("insert", r, h, payload)

    @rule(h=HANDOFFS)
    def remove(self, h):
        self.apply("remove", h)


class ActiveMachine(Differential):
    """ACT-1..ACT-3 against the plain rendering."""

    model_factory = ActiveHandoffRequests
    plain_factory = PlainActive

    def project(self, m):
        return dict(m.by_handoff)

    @rule(h=HANDOFFS, r=REQUESTS)
    def insert(self, h, r):
        self.apply("insert", h, r)

    @rule(h=HANDOFFS)
    def remove_handoff(self, h):
        self.apply("remove_handoff", h)

    @rule(r=REQUESTS)
    def remove_request(self, r):
        self.apply("remove_request", r)


class PendingMachine(Differential):
    """PEND-1..PEND-7 and the tombstone-revival quirk PEND-Q1 against the plain rendering."""

    model_factory = PendingDestinations
    plain_factory = PlainPending

    def project(self, m):
        return list(m.fifo), {
            h: (e.request_id, e.payload, e.last_attempt_generation) for h, e in m.by_handoff.items()
        }

    @rule(r=REQUESTS, h=HANDOFFS)
    def validate(self, r, h):
        self.apply("validate", r, h)

    @rule(r=REQUESTS, h=HANDOFFS, payload=PAYLOADS)
    def insert(self, r, h, payload):
        self.apply("insert", r, h, payload)

    @rule(g=GENERATIONS)
    def front_due(self, g):
        self.apply("front_due", g)

    @rule(g=GENERATIONS)
    def mark_front_attempted(self, g):
        self.apply("mark_front_attempted", g)

    @rule()
    def pop_front(self):
        self.apply("pop_front")

    @rule(h=HANDOFFS)
    def remove(self, h):
        self.apply("remove", h)


MACHINES = {
    "SourceHolds": SourceHoldsMachine,
    "DestinationHolds": DestinationHoldsMachine,
    "ActiveHandoffRequests": ActiveMachine,
    "PendingDestinations": PendingMachine,
}


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_machine_agrees_with_plain_rendering(name):
    """≥ 200 examples × 50 steps per machine (issue acceptance)."""
    run_state_machine_as_test(MACHINES[name], settings=CI_SETTINGS)


# --- mutation check: deliberate breakages the machines above must catch -------------------


def _register_without_handoff_check(self, request_id, handoff_id):
    if self.contains_request(request_id):
        from model.errors import SourceRequestActive

        raise SourceRequestActive("x")
    return (
        attrs.evolve(
            self,
            pending_by_request=self.pending_by_request.set(request_id, handoff_id),
            pending_by_handoff=self.pending_by_handoff.set(handoff_id, request_id),
        ),
        None,
    )


def _complete_keeps_pending(self, request_id, payload):
    handoff_id = self.pending_by_request.get(request_id)
    if handoff_id is None:
        return self, source_holds.Release(payload)
    return (
        attrs.evolve(
            self,
            held_by_handoff=self.held_by_handoff.set(handoff_id, (request_id, payload)),
            held_by_request=self.held_by_request.set(request_id, handoff_id),
        ),
        source_holds.Held(handoff_id),
    )


def _dst_remove_keeps_request(self, handoff_id):
    entry = self.by_handoff.get(handoff_id)
    if entry is None:
        return self, None
    return attrs.evolve(self, by_handoff=self.by_handoff.remove(handoff_id)), entry


def _act_remove_request_keeps_handoff(self, request_id):
    handoff_id = self.by_request.get(request_id)
    if handoff_id is None:
        return self, None
    return attrs.evolve(self, by_request=self.by_request.remove(request_id)), handoff_id


_original_pending_remove = PendingDestinations.remove


def _pending_remove_purges_tombstone(self, handoff_id):
    """The 'fixed' S1 behaviour: must be caught, since upstream keeps the tombstone."""
    new, out = _original_pending_remove(self, handoff_id)
    if out is None:
        return new, out
    return attrs.evolve(new, fifo=pdeque(h for h in new.fifo if h != handoff_id)), out


_original_front_due = PendingDestinations.front_due


def _front_due_ignores_mark(self, generation):
    new, _ = _original_front_due(self, generation)
    head = new.head()
    if head is None:
        return new, None
    entry = new.by_handoff[head]
    return new, (head, entry.request_id, entry.payload)


MUTATIONS = {
    "register_skips_handoff_check": ("SourceHolds", SourceHolds, "register", _register_without_handoff_check),
    "complete_keeps_pending": ("SourceHolds", SourceHolds, "complete_source", _complete_keeps_pending),
    "dst_remove_keeps_request_index": ("DestinationHolds", DestinationHolds, "remove", _dst_remove_keeps_request),
    "active_remove_keeps_handoff": (
        "ActiveHandoffRequests", ActiveHandoffRequests, "remove_request", _act_remove_request_keeps_handoff),
    "pending_remove_purges_tombstone": (
        "PendingDestinations", PendingDestinations, "remove", _pending_remove_purges_tombstone),
    "pending_front_due_ignores_mark": (
        "PendingDestinations", PendingDestinations, "front_due", _front_due_ignores_mark),
    "pending_never_compacts": (
        "PendingDestinations", PendingDestinations, "_compact_if_sparse", staticmethod(lambda fifo, by_handoff: fifo)),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_mutation_is_caught(mutation, monkeypatch):
    machine, cls, attr, replacement = MUTATIONS[mutation]
    monkeypatch.setattr(cls, attr, replacement)
    with pytest.raises(Exception):
        run_state_machine_as_test(
            MACHINES[machine],
            # detection is what matters; shrinking the found failure is skipped to keep CI short
            settings=settings(CI_SETTINGS, derandomize=True, database=None, print_blob=False,
                              phases=[Phase.explicit, Phase.generate]),
        )
