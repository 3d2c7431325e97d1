"""SourceHolds: prefill requests whose KV is kept for a handoff (spec/handoff-lifecycle.md §SRC).

Upstream: ``SourceHolds<T>`` in lib/mocker/src/scheduler/source_holds.rs:98-196.

State: two bidirectional maps.  *pending* links a registered request that has
not completed to its handoff id; *held* links a completed request's handoff id
to the request and the payload (the KV the core keeps alive).
"""

from __future__ import annotations

from typing import Any, Generic, Optional, Tuple, TypeVar, Union

import attrs
from pyrsistent import PMap, pmap

from .errors import SourceHandoffActive, SourceRequestActive
from .ids import HandoffId, RequestId
from .transitions import Transition

T = TypeVar("T")


# --- outcomes -------------------------------------------------------------------------------


@attrs.frozen
class Release(Generic[T]):
    """SRC-3: the completed request was not registered; the caller frees ``payload``."""

    payload: Any


@attrs.frozen
class Held:
    """SRC-3: the completed request is now held for ``handoff_id``."""

    handoff_id: HandoffId


SourceCompletion = Union[Release, Held]


@attrs.frozen
class RemovedHeld:
    """SRC-4: the handoff was held; the caller cleans up ``payload``."""

    payload: Any


@attrs.frozen
class RemovedPending:
    """SRC-4: the handoff was registered but its request had not completed."""

    request_id: RequestId


@attrs.frozen
class RemovedMissing:
    """SRC-4: the handoff is unknown to the source holds."""


MISSING = RemovedMissing()

RemovedSource = Union[RemovedHeld, RemovedPending, RemovedMissing]


# --- state ----------------------------------------------------------------------------------


@attrs.frozen
class SourceHolds:
    """The source-hold state of one core (SRC-0)."""

    pending_by_request: PMap = pmap()  # RequestId -> HandoffId
    pending_by_handoff: PMap = pmap()  # HandoffId -> RequestId
    held_by_handoff: PMap = pmap()  # HandoffId -> (RequestId, payload)
    held_by_request: PMap = pmap()  # RequestId -> HandoffId

    # -- queries (SRC-0) --

    def contains_request(self, request_id: RequestId) -> bool:
        """SRC-2: true iff the request is pending or held."""
        return request_id in self.pending_by_request or request_id in self.held_by_request

    def contains_handoff(self, handoff_id: HandoffId) -> bool:
        """SRC-2: true iff the handoff id is pending or held."""
        return handoff_id in self.pending_by_handoff or handoff_id in self.held_by_handoff

    def is_registered(self, handoff_id: HandoffId) -> bool:
        return handoff_id in self.pending_by_handoff

    def is_held(self, handoff_id: HandoffId) -> bool:
        return handoff_id in self.held_by_handoff

    def is_empty(self) -> bool:
        """SRC-6: no pending and no held entry."""
        return not self.pending_by_request and not self.held_by_handoff and not self.held_by_request

    def held_payload(self, handoff_id: HandoffId) -> Optional[Any]:
        entry = self.held_by_handoff.get(handoff_id)
        return None if entry is None else entry[1]

    def held_payloads(self) -> Tuple[Any, ...]:
        """Payloads of every held source, in handoff-id order (deterministic)."""
        return tuple(self.held_by_handoff[h][1] for h in sorted(self.held_by_handoff))

    # -- transitions --

    def register(self, request_id: RequestId, handoff_id: HandoffId) -> Tuple["SourceHolds", None]:
        """SRC-1: register a pending source hold.

        Guard: the request is neither pending nor held, and the handoff id is
        neither pending nor held.  The request check comes first.
        """
        if self.contains_request(request_id):
            raise SourceRequestActive(f"source hold already active for request {request_id}")
        if self.contains_handoff(handoff_id):
            raise SourceHandoffActive(f"handoff {handoff_id} is already active")
        return (
            attrs.evolve(
                self,
                pending_by_request=self.pending_by_request.set(request_id, handoff_id),
                pending_by_handoff=self.pending_by_handoff.set(handoff_id, request_id),
            ),
            None,
        )

    def complete_source(self, request_id: RequestId, payload: Any) -> Tuple["SourceHolds", SourceCompletion]:
        """SRC-3: the request completed in a pass.

        Not pending: ``Release(payload)``, state unchanged.  Pending: the entry
        moves atomically from pending to held with ``payload``; ``Held(h)``.
        """
        handoff_id = self.pending_by_request.get(request_id)
        if handoff_id is None:
            return self, Release(payload)
        return (
            attrs.evolve(
                self,
                pending_by_request=self.pending_by_request.remove(request_id),
                pending_by_handoff=self.pending_by_handoff.remove(handoff_id),
                held_by_handoff=self.held_by_handoff.set(handoff_id, (request_id, payload)),
                held_by_request=self.held_by_request.set(request_id, handoff_id),
            ),
            Held(handoff_id),
        )

    def remove(self, handoff_id: HandoffId) -> Tuple["SourceHolds", RemovedSource]:
        """SRC-4: remove a handoff; held is checked before pending.

        Held: ``RemovedHeld(payload)``.  Pending: ``RemovedPending(r)``.
        Otherwise ``RemovedMissing`` with the state unchanged.
        """
        entry = self.held_by_handoff.get(handoff_id)
        if entry is not None:
            request_id, payload = entry
            return (
                attrs.evolve(
                    self,
                    held_by_handoff=self.held_by_handoff.remove(handoff_id),
                    held_by_request=self.held_by_request.remove(request_id),
                ),
                RemovedHeld(payload),
            )
        request_id = self.pending_by_handoff.get(handoff_id)
        if request_id is None:
            return self, MISSING
        return (
            attrs.evolve(
                self,
                pending_by_request=self.pending_by_request.remove(request_id),
                pending_by_handoff=self.pending_by_handoff.remove(handoff_id),
            ),
            RemovedPending(request_id),
        )

    def remove_request(self, request_id: RequestId) -> Tuple["SourceHolds", Optional[HandoffId]]:
        """SRC-5: drop a *pending* registration of the request; a held entry is untouched.

        Returns the handoff id that was dropped, or ``None``.
        """
        handoff_id = self.pending_by_request.get(request_id)
        if handoff_id is None:
            return self, None
        return (
            attrs.evolve(
                self,
                pending_by_request=self.pending_by_request.remove(request_id),
                pending_by_handoff=self.pending_by_handoff.remove(handoff_id),
            ),
            handoff_id,
        )


TRANSITIONS = (
    Transition(
        "SourceHolds", "register", "SRC-1",
        guard="request neither pending nor held; handoff neither pending nor held (request checked first)",
        change="pending[r] = h",
        result="-",
        errors=("source hold already active for request r", "handoff h is already active"),
    ),
    Transition(
        "SourceHolds", "complete_source", "SRC-3",
        guard="always",
        change="if r pending: pending[r] moves to held[h] = (r, payload)",
        result="Held(h) if r was pending, else Release(payload)",
    ),
    Transition(
        "SourceHolds", "remove", "SRC-4",
        guard="always",
        change="delete h from held, else from pending",
        result="RemovedHeld(payload) / RemovedPending(r) / RemovedMissing",
        quirks=("held is checked before pending",),
    ),
    Transition(
        "SourceHolds", "remove_request", "SRC-5",
        guard="always",
        change="delete r from pending (held untouched)",
        result="dropped h or None",
    ),
)
