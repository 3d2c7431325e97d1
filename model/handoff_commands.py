"""The seven handoff commands and the pending-destination retry, shared by both cores.

Spec: spec/core-commands.md (rules CMD-1..CMD-9, RETRY-1..RETRY-4).  Upstream
writes these twice, once per core (lib/mocker/src/scheduler/vllm/core.rs:562-752,
lib/mocker/src/scheduler/sglang/core.rs:171-328); the two copies differ only
in the engine hooks below, so the model writes the skeleton once.

The functions operate on a *core transaction*: a short-lived mutable working
copy of a frozen core that the core module builds, passes here, and freezes
again.  Nothing escapes it: from the outside every command is a pure function
``(core, command) -> (core, effects)``, and a rejected command raises before the
caller's core value is replaced.
"""

from __future__ import annotations

from typing import Any, List, Optional, Protocol, Tuple

import attrs

from .core import RetryEffects
from .errors import CommandRejected, RequestAlreadyActive
from .ids import HandoffId, RequestId
from .ledger import HandoffLedger
from .protocol import (
    APPLIED,
    NOOP,
    ActivateDestination,
    CancelDestination,
    CancelSource,
    Command,
    CommandEffects,
    DestinationAccepted,
    DestinationReserved,
    DirectRequest,
    LifecycleEvent,
    ReleaseSource,
    ReserveDestination,
    Submit,
    Submitted,
    SubmitHandoffPrefill,
)
from .source_holds import RemovedHeld, RemovedPending


class MissingRequestId(CommandRejected):
    """CMD-1: the model cannot draw a random UUID, so every request must carry an id."""

    rule = "CMD-1"


class CoreTxn(Protocol):
    """The engine hooks a core transaction provides (spec/core-commands.md §Hooks)."""

    ledger: HandoffLedger
    kv_events: List[object]

    def scheduler_owns(self, request_id: RequestId) -> bool: ...

    def submit(self, request: DirectRequest) -> None: ...

    def release_held_source(self, payload: Any) -> None: ...

    def cancel_scheduled_request(self, request_id: RequestId) -> None: ...

    def destination_precheck(self) -> None: ...

    def pending_destination_payload(self, request: DirectRequest) -> Any: ...

    def activate_destination(self, handoff_id: HandoffId, request_id: RequestId, reserved: Any) -> None: ...

    def cancel_reservation(self, reserved: Any) -> None: ...

    def retry_gate_open(self) -> bool: ...

    def probe_destination(self, payload: Any, now_ms: Optional[float]) -> Optional[Tuple[Any, int]]: ...

    def note_reservation_attempt(self) -> None: ...


def bump(txn: CoreTxn) -> None:
    """LEDGER-4 on the transaction's ledger."""
    txn.ledger = txn.ledger.bump_generation()


def _request_id(request: DirectRequest) -> RequestId:
    if request.uuid is None:
        raise MissingRequestId("request has no uuid; the model needs caller-assigned request ids")
    return request.uuid


def validate_request_id(txn: CoreTxn, request_id: RequestId) -> None:
    """CMD-1: reject an id the core already owns in any role (upstream ``validate_request_id``)."""
    if txn.scheduler_owns(request_id) or txn.ledger.owns_request(request_id):
        raise RequestAlreadyActive(f"request {request_id} is already active")


def apply_command_effects(
    txn: CoreTxn, command: Command, allow_destination_admission: bool, now_ms: Optional[float] = None
) -> CommandEffects:
    """CMD-2..CMD-8: apply one command on the transaction; return its effects."""
    if isinstance(command, Submit):
        # CMD-2
        r = _request_id(command.request)
        validate_request_id(txn, r)
        txn.submit(command.request)
        return CommandEffects(Submitted(r))

    if isinstance(command, SubmitHandoffPrefill):
        # CMD-3
        r = _request_id(command.request)
        validate_request_id(txn, r)
        txn.ledger = _set_source(txn.ledger, txn.ledger.source_holds.register(r, command.handoff_id)[0])
        txn.submit(command.request)
        return CommandEffects(Submitted(r))

    if isinstance(command, (ReleaseSource, CancelSource)):
        # CMD-4 / CMD-5
        holds, removed = txn.ledger.source_holds.remove(command.handoff_id)
        txn.ledger = _set_source(txn.ledger, holds)
        if isinstance(removed, RemovedHeld):
            txn.release_held_source(removed.payload)
            bump(txn)
        elif isinstance(removed, RemovedPending):
            if isinstance(command, CancelSource):
                txn.cancel_scheduled_request(removed.request_id)
        else:
            return CommandEffects(NOOP)
        return _after_capacity_change(txn, now_ms)

    if isinstance(command, ReserveDestination):
        # CMD-6
        txn.destination_precheck()
        r = _request_id(command.request)
        validate_request_id(txn, r)
        txn.ledger.validate_destination(r, command.handoff_id)
        payload = txn.pending_destination_payload(command.request)
        pending, _ = txn.ledger.pending_destinations.insert(r, command.handoff_id, payload)
        txn.ledger = _evolve(txn.ledger, pending_destinations=pending)
        events: Tuple[LifecycleEvent, ...] = ()
        if allow_destination_admission:
            events = retry(txn, now_ms)
        return CommandEffects(DestinationAccepted(r), events)

    if isinstance(command, ActivateDestination):
        # CMD-7
        holds, entry = txn.ledger.destination_holds.remove(command.handoff_id)
        if entry is None:
            return CommandEffects(NOOP)
        txn.ledger = _evolve(txn.ledger, destination_holds=holds)
        request_id, reserved = entry
        txn.activate_destination(command.handoff_id, request_id, reserved)
        return _after_capacity_change(txn, now_ms)

    if isinstance(command, CancelDestination):
        # CMD-8: pending, then reserved, then active
        h = command.handoff_id
        pending, removed = txn.ledger.pending_destinations.remove(h)
        if removed is not None:
            txn.ledger = _evolve(txn.ledger, pending_destinations=pending)
            bump(txn)  # even though no KV changed (upstream S14)
            return _after_capacity_change(txn, now_ms)
        holds, entry = txn.ledger.destination_holds.remove(h)
        if entry is not None:
            txn.ledger = _evolve(txn.ledger, destination_holds=holds)
            txn.cancel_reservation(entry[1])
            bump(txn)
            return _after_capacity_change(txn, now_ms)
        active, request_id = txn.ledger.active_destinations.remove_handoff(h)
        if request_id is None:
            return CommandEffects(NOOP)
        txn.ledger = _evolve(txn.ledger, active_destinations=active)
        txn.cancel_scheduled_request(request_id)
        return _after_capacity_change(txn, now_ms)

    raise CommandRejected(f"unknown command {command!r}", rule="CMD-1")


def names_nothing_held(ledger: HandoffLedger, command: Command) -> bool:
    """CORE-7: a release, cancel or activate whose handoff id the ledger holds in none of the
    places that command looks (CMD-4/CMD-5: source holds; CMD-7: destination holds; CMD-8: pending,
    reserved, active) is a ``Noop`` that touches nothing: every removal returns its input and the
    command returns before any engine hook or retry.  The cores answer such a command with their
    input core without opening a transaction."""
    t = type(command)
    if t is CancelDestination:
        h = command.handoff_id
        return (h not in ledger.pending_destinations.by_handoff and h not in ledger.destination_holds.by_handoff
                and h not in ledger.active_destinations.by_handoff)
    if t is ReleaseSource or t is CancelSource:
        src = ledger.source_holds
        return command.handoff_id not in src.held_by_handoff and command.handoff_id not in src.pending_by_handoff
    if t is ActivateDestination:
        return command.handoff_id not in ledger.destination_holds.by_handoff
    return False


def retry_is_idle(ledger: HandoffLedger) -> bool:
    """CORE-7: a retry (RETRY-1..RETRY-4) on this ledger changes nothing: the pending FIFO is
    empty, or its front is a live entry already tried at the current generation (no tombstone to
    pop, no head due, and marking a marked head again gives an equal entry)."""
    pend = ledger.pending_destinations
    fifo = pend.fifo
    if not fifo:
        return True
    entry = pend.by_handoff.get(fifo.left)
    return entry is not None and entry.last_attempt_generation == ledger.capacity_generation


#: the effects of a command that names nothing held (``names_nothing_held``)
NOOP_EFFECTS = CommandEffects(NOOP)
#: the effects of a retry that changes nothing (``retry_is_idle``)
IDLE_RETRY = RetryEffects((), ())


def command_on_core(core: Any, open_txn: Any, command: Command, allow: bool, now_ms: Optional[float]):
    """CMD-1..CMD-9 on a frozen core: ``(new core, effects)``, the KV events of the transaction
    included. ``open_txn(core)`` opens the core's transaction. A command that names nothing held
    returns the core itself (CORE-7)."""
    if names_nothing_held(core.ledger, command):
        return core, NOOP_EFFECTS
    txn = open_txn(core)
    effects = apply_command_effects(txn, command, allow, now_ms)
    return txn.freeze(), CommandEffects(effects.result, effects.lifecycle_events, tuple(txn.kv_events))


def retry_on_core(core: Any, open_txn: Any, now_ms: Optional[float]):
    """RETRY-1..RETRY-4 on a frozen core: ``(new core, RetryEffects)``; an idle retry returns the
    core itself (CORE-7)."""
    if retry_is_idle(core.ledger):
        return core, IDLE_RETRY
    txn = open_txn(core)
    events = retry(txn, now_ms)
    return txn.freeze(), RetryEffects(events, tuple(txn.kv_events))


def _after_capacity_change(txn: CoreTxn, now_ms: Optional[float]) -> CommandEffects:
    """CMD-9: an ``Applied`` release/cancel/activate always runs the retry, whatever ``allow`` says (S3)."""
    return CommandEffects(APPLIED, retry(txn, now_ms))


def retry(txn: CoreTxn, now_ms: Optional[float] = None) -> Tuple[LifecycleEvent, ...]:
    """RETRY-1..RETRY-4: probe the pending FIFO head at most once per capacity generation.

    1. ``g`` := the capacity generation.
    2. (vLLM) if the running-slot gate is closed, mark the head tried at ``g`` without probing.
    3. If no head is due (none, or already tried at ``g``), stop.
    4. Probe the KV manager; mark the head tried at ``g`` whatever the outcome; on success pop
       it into the destination holds and emit ``DestinationReserved``.
    At most one probe and one reservation per call (upstream S4).
    """
    g = txn.ledger.capacity_generation
    if not txn.retry_gate_open():
        pending, _ = txn.ledger.pending_destinations.mark_front_attempted(g)
        txn.ledger = _evolve(txn.ledger, pending_destinations=pending)
        return ()
    pending, due = txn.ledger.pending_destinations.front_due(g)
    txn.ledger = _evolve(txn.ledger, pending_destinations=pending)
    if due is None:
        return ()
    handoff_id, request_id, payload = due
    txn.note_reservation_attempt()
    outcome = txn.probe_destination(payload, now_ms)
    pending, _ = txn.ledger.pending_destinations.mark_front_attempted(g)
    txn.ledger = _evolve(txn.ledger, pending_destinations=pending)
    if outcome is None:
        return ()
    reserved, transferable = outcome
    pending, popped = txn.ledger.pending_destinations.pop_front()
    if popped is None or popped[0] != handoff_id:
        from .errors import InternalInvariantBroken

        raise InternalInvariantBroken("attempted pending destination must remain at the head", rule="RETRY-4")
    holds, _ = txn.ledger.destination_holds.insert(request_id, handoff_id, reserved)
    txn.ledger = _evolve(txn.ledger, pending_destinations=pending, destination_holds=holds)
    return (DestinationReserved(handoff_id, request_id, transferable),)


def _evolve(ledger: HandoffLedger, **changes) -> HandoffLedger:
    """The ledger with ``changes``; the ledger itself when every changed part is the one it holds
    (CORE-7: an operation that changes nothing returns its input)."""
    if all(getattr(ledger, k) is v for k, v in changes.items()):
        return ledger
    return attrs.evolve(ledger, **changes)


def _set_source(ledger: HandoffLedger, holds) -> HandoffLedger:
    return _evolve(ledger, source_holds=holds)
