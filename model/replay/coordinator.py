"""The per-handoff coordinator of disaggregated replay (spec/replay.md DIS-4..DIS-7).

A pure state machine, one per prefill-to-decode handoff: the driver feeds it
*facts* (the source is held, the destination is reserved, the transfer
finished, the handoff failed) and the *outcomes* of the actions it issued, and
it answers with the next actions.  It owns ordering only; it touches no core.

Upstream: ``HandoffCoordinatorCore`` (lib/mocker/src/common/handoff.rs:347-656).
The coordinator is a frozen value; every transition returns ``(coordinator,
actions)``.  Action ids are a per-coordinator counter, as upstream.
"""

from __future__ import annotations

import enum
from typing import Optional, Tuple, Union

import attrs
from pyrsistent import PMap, pmap

from model.errors import InternalInvariantBroken
from model.replay.common import ReplayError
from model.ids import HandoffId
from model.timing import HandoffTransferTiming, transfer_action_delay_ms

__all__ = [
    "HandoffOrder",
    "ActionKind",
    "IssuedAction",
    "Outcome",
    "Failed",
    "SourceHeldFact",
    "DestinationReservedFact",
    "TransferCompletedFact",
    "FailedFact",
    "TimedOutFact",
    "CanceledFact",
    "Completion",
    "Coordinator",
]


class HandoffOrder(str, enum.Enum):
    """DIS-4: SourceFirst (vLLM: prefill, then destination) or DestinationFirst (SGLang)."""

    SOURCE_FIRST = "source_first"
    DESTINATION_FIRST = "destination_first"


class ActionKind(str, enum.Enum):
    SUBMIT_PREFILL = "submit_prefill"
    RESERVE_DESTINATION = "reserve_destination"
    START_TRANSFER = "start_transfer"
    ACTIVATE_DESTINATION = "activate_destination"
    RELEASE_SOURCE = "release_source"
    CANCEL_SOURCE = "cancel_source"
    CANCEL_DESTINATION = "cancel_destination"
    COMPLETE = "complete"


@attrs.frozen
class IssuedAction:
    """One action with its coordinator-local id; ``delay_ms`` only for StartTransfer."""

    id: int
    kind: ActionKind
    delay_ms: Optional[float] = None


class Outcome(str, enum.Enum):
    SUBMITTED = "submitted"
    ACCEPTED = "accepted"
    SCHEDULED = "scheduled"
    APPLIED = "applied"
    NOOP = "noop"


@attrs.frozen
class Failed:
    """An action failed (the message is upstream's error text)."""

    message: str


ActionOutcome = Union[Outcome, Failed]


@attrs.frozen
class SourceHeldFact:
    transfer_timing: HandoffTransferTiming


@attrs.frozen
class DestinationReservedFact:
    transferable_prompt_tokens: int


@attrs.frozen
class TransferCompletedFact:
    pass


@attrs.frozen
class FailedFact:
    pass


@attrs.frozen
class TimedOutFact:
    pass


@attrs.frozen
class CanceledFact:
    pass


Fact = Union[SourceHeldFact, DestinationReservedFact, TransferCompletedFact, FailedFact, TimedOutFact, CanceledFact]


class Completion(str, enum.Enum):
    SUCCESS = "success"
    CANCELED = "canceled"


class _Mode(str, enum.Enum):
    ACTIVE = "active"
    CLEANING_UP = "cleaning_up"
    COMPLETE = "complete"


#: DIS-5: which outcomes each action kind accepts (any other is an error)
_ALLOWED = {
    ActionKind.SUBMIT_PREFILL: (Outcome.SUBMITTED,),
    ActionKind.RESERVE_DESTINATION: (Outcome.ACCEPTED,),
    ActionKind.START_TRANSFER: (Outcome.SCHEDULED,),
    ActionKind.ACTIVATE_DESTINATION: (Outcome.APPLIED,),
    ActionKind.RELEASE_SOURCE: (Outcome.APPLIED, Outcome.NOOP),
    ActionKind.CANCEL_SOURCE: (Outcome.APPLIED, Outcome.NOOP),
    ActionKind.CANCEL_DESTINATION: (Outcome.APPLIED, Outcome.NOOP),
}


def _broken(message: str) -> InternalInvariantBroken:
    return InternalInvariantBroken(message, rule="DIS-5")


@attrs.frozen
class Coordinator:
    """DIS-4..DIS-7: the ordering state of one handoff (upstream ``HandoffCoordinatorCore``)."""

    handoff_id: HandoffId
    order: HandoffOrder
    mode: _Mode = _Mode.ACTIVE
    started: bool = False
    next_id: int = 0
    issued: PMap = pmap()  # action id -> ActionKind
    outcomes: PMap = pmap()  # action id -> ActionOutcome
    # source progress
    submit_issued: bool = False
    submitted: bool = False
    held: bool = False
    transfer_timing: Optional[HandoffTransferTiming] = None
    release_issued: bool = False
    source_cancel_issued: bool = False
    source_cleanup_done: bool = False
    # destination progress
    reserve_issued: bool = False
    accepted: bool = False
    reserved: bool = False
    transferable_prompt_tokens: Optional[int] = None
    activation_issued: bool = False
    activation_applied: bool = False
    destination_cancel_issued: bool = False
    destination_cleanup_done: bool = False
    # transfer progress
    transfer_issued: bool = False
    transfer_scheduled: bool = False
    transfer_completed: bool = False
    completion: Optional[Completion] = None

    # -- queries ---------------------------------------------------------------

    @property
    def is_complete(self) -> bool:
        return self.mode is _Mode.COMPLETE

    # -- transitions -------------------------------------------------------------

    def start(self) -> Tuple["Coordinator", Tuple[IssuedAction, ...]]:
        """DIS-4: the first action: SubmitPrefill (SourceFirst) or ReserveDestination (DestinationFirst).

        A second call issues nothing (handoff.rs:377-387)."""
        if self.started:
            return self, ()
        c = attrs.evolve(self, started=True)
        if self.order is HandoffOrder.SOURCE_FIRST:
            c, a = c._issue(ActionKind.SUBMIT_PREFILL, submit_issued=True)
        else:
            c, a = c._issue(ActionKind.RESERVE_DESTINATION, reserve_issued=True)
        return c, (a,)

    def on_fact(self, fact: Fact) -> Tuple["Coordinator", Tuple[IssuedAction, ...]]:
        """DIS-5: a fact from a core or the transport (handoff.rs:389-442).

        Facts are ignored once the coordinator left the active mode; repeated
        facts are ignored; out-of-order facts are errors."""
        if self.mode is not _Mode.ACTIVE:
            return self, ()
        if isinstance(fact, SourceHeldFact):
            if self.held:
                return self, ()
            if not self.submitted:
                raise _broken("source held before prefill submission was acknowledged")
            reason = fact.transfer_timing.invalid_reason()
            if reason is not None:  # TIME-14: reachable from the engine args, an error upstream
                raise ReplayError(reason, rule="TIME-14")
            return attrs.evolve(self, held=True, transfer_timing=fact.transfer_timing)._advance_active()
        if isinstance(fact, DestinationReservedFact):
            if self.reserved:
                return self, ()
            if not self.accepted:
                raise _broken("destination reserved before ownership was accepted")
            return attrs.evolve(
                self, reserved=True, transferable_prompt_tokens=fact.transferable_prompt_tokens
            )._advance_active()
        if isinstance(fact, TransferCompletedFact):
            if self.transfer_completed:
                return self, ()
            if not self.transfer_scheduled:
                raise _broken("transfer completed before it was scheduled")
            return attrs.evolve(self, transfer_completed=True)._advance_active()
        return self._begin_cleanup()

    def on_action_outcome(self, action_id: int, outcome: ActionOutcome) -> Tuple["Coordinator", Tuple[IssuedAction, ...]]:
        """DIS-5: the outcome of an issued action (handoff.rs:444-512)."""
        if self.mode is _Mode.COMPLETE:
            return self, ()
        kind = self.issued.get(action_id)
        if kind is None:
            raise _broken(f"unknown handoff action {action_id}")
        previous = self.outcomes.get(action_id)
        if previous is not None:
            if previous != outcome:
                raise _broken(f"conflicting outcome for handoff action {action_id}")
            return self, ()
        c = attrs.evolve(self, outcomes=self.outcomes.set(action_id, outcome))
        if isinstance(outcome, Failed):
            if kind in (ActionKind.CANCEL_SOURCE, ActionKind.CANCEL_DESTINATION):
                raise _broken(f"handoff cleanup action {action_id} failed")
            return c._begin_cleanup()
        if kind is ActionKind.COMPLETE:
            return c, ()
        if outcome not in _ALLOWED[kind]:
            raise _broken(f"invalid handoff action outcome {outcome}")
        flag = {
            ActionKind.SUBMIT_PREFILL: "submitted",
            ActionKind.RESERVE_DESTINATION: "accepted",
            ActionKind.START_TRANSFER: "transfer_scheduled",
            ActionKind.ACTIVATE_DESTINATION: "activation_applied",
            ActionKind.RELEASE_SOURCE: "source_cleanup_done",
            ActionKind.CANCEL_SOURCE: "source_cleanup_done",
            ActionKind.CANCEL_DESTINATION: "destination_cleanup_done",
        }[kind]
        c = attrs.evolve(c, **{flag: True})
        if c.mode is _Mode.ACTIVE:
            return c._advance_active()
        if c.mode is _Mode.CLEANING_UP:
            return c._advance_cleanup()
        return c, ()

    # -- internals -------------------------------------------------------------------

    def _issue(self, kind: ActionKind, delay_ms: Optional[float] = None, **flags) -> Tuple["Coordinator", IssuedAction]:
        aid = self.next_id
        c = attrs.evolve(self, next_id=aid + 1, issued=self.issued.set(aid, kind), **flags)
        return c, IssuedAction(aid, kind, delay_ms)

    def _advance_active(self) -> Tuple["Coordinator", Tuple[IssuedAction, ...]]:
        """DIS-6: the next step of the success path (handoff.rs:518-573)."""
        if self.order is HandoffOrder.SOURCE_FIRST and self.held and not self.reserve_issued:
            c, a = self._issue(ActionKind.RESERVE_DESTINATION, reserve_issued=True)
            return c, (a,)
        if self.order is HandoffOrder.DESTINATION_FIRST and self.reserved and not self.submit_issued:
            c, a = self._issue(ActionKind.SUBMIT_PREFILL, submit_issued=True)
            return c, (a,)
        if self.held and self.reserved and not self.transfer_issued:
            assert self.transfer_timing is not None and self.transferable_prompt_tokens is not None
            delay = transfer_action_delay_ms(self.transfer_timing, self.transferable_prompt_tokens)
            c, a = self._issue(ActionKind.START_TRANSFER, delay, transfer_issued=True)
            return c, (a,)
        if self.transfer_completed and not self.activation_issued:
            c, a = self._issue(ActionKind.ACTIVATE_DESTINATION, activation_issued=True)
            return c, (a,)
        if self.activation_applied and not self.release_issued:
            c, a = self._issue(ActionKind.RELEASE_SOURCE, release_issued=True)
            return c, (a,)
        if self.source_cleanup_done:
            c, a = self._complete()
            return c, (a,)
        return self, ()

    def _begin_cleanup(self) -> Tuple["Coordinator", Tuple[IssuedAction, ...]]:
        if self.mode is _Mode.COMPLETE:
            return self, ()
        return attrs.evolve(self, mode=_Mode.CLEANING_UP)._advance_cleanup()

    def _advance_cleanup(self) -> Tuple["Coordinator", Tuple[IssuedAction, ...]]:
        """DIS-7: cancel every side whose first action was issued, then complete (handoff.rs:583-607)."""
        c = self
        actions = []
        if c.submit_issued and not c.source_cancel_issued and not c.source_cleanup_done:
            c, a = c._issue(ActionKind.CANCEL_SOURCE, source_cancel_issued=True)
            actions.append(a)
        if c.reserve_issued and not c.destination_cancel_issued and not c.destination_cleanup_done:
            c, a = c._issue(ActionKind.CANCEL_DESTINATION, destination_cancel_issued=True)
            actions.append(a)
        if (
            not actions
            and (not c.submit_issued or c.source_cleanup_done)
            and (not c.reserve_issued or c.destination_cleanup_done)
        ):
            c, a = c._complete()
            actions.append(a)
        return c, tuple(actions)

    def _complete(self) -> Tuple["Coordinator", IssuedAction]:
        completion = Completion.CANCELED if self.mode is _Mode.CLEANING_UP else Completion.SUCCESS
        c, a = attrs.evolve(self, completion=completion, mode=_Mode.COMPLETE)._issue(ActionKind.COMPLETE)
        # upstream forgets the journal once complete
        return attrs.evolve(c, issued=pmap(), outcomes=pmap()), a


def new_coordinator(handoff_id: HandoffId, order: HandoffOrder) -> Coordinator:
    return Coordinator(handoff_id=handoff_id, order=order)
