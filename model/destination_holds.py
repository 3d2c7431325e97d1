"""DestinationHolds: destinations that own a physical KV reservation (spec/handoff-lifecycle.md §DST).

Upstream: ``DestinationHolds<T>`` in lib/mocker/src/scheduler/source_holds.rs:198-201, 385-447.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import attrs
from pyrsistent import PMap, pmap

from .errors import DestinationHandoffActive, DestinationReservationExists, InternalInvariantBroken
from .ids import HandoffId, RequestId
from .transitions import Transition


@attrs.frozen
class DestinationHolds:
    """Reserved destinations of one core (DST-0): ``h -> (r, payload)`` and ``r -> h``."""

    by_handoff: PMap = pmap()  # HandoffId -> (RequestId, payload)
    by_request: PMap = pmap()  # RequestId -> HandoffId

    def validate(self, request_id: RequestId, handoff_id: HandoffId) -> None:
        """DST-1: reject a request that already has a reservation, then a reserved handoff id."""
        if request_id in self.by_request:
            raise DestinationReservationExists(
                f"destination reservation already exists for request {request_id}"
            )
        if handoff_id in self.by_handoff:
            raise DestinationHandoffActive(f"destination handoff {handoff_id} is already active")

    def contains_request(self, request_id: RequestId) -> bool:
        return request_id in self.by_request

    def contains(self, handoff_id: HandoffId) -> bool:
        return handoff_id in self.by_handoff

    def get(self, handoff_id: HandoffId) -> Optional[Any]:
        entry = self.by_handoff.get(handoff_id)
        return None if entry is None else entry[1]

    def __len__(self) -> int:
        return len(self.by_handoff)

    def is_empty(self) -> bool:
        return not self.by_handoff

    def payloads(self) -> Tuple[Any, ...]:
        """DST-4: every payload, in handoff-id order (upstream iterates a hash map; see DST-4)."""
        return tuple(self.by_handoff[h][1] for h in sorted(self.by_handoff))

    def insert(self, request_id: RequestId, handoff_id: HandoffId, payload: Any) -> Tuple["DestinationHolds", None]:
        """DST-2: add a reservation.

        Upstream only ``debug_assert``s that DST-1 passes; callers (the retry)
        guarantee it.  The model raises :class:`InternalInvariantBroken` instead
        of silently overwriting.
        """
        try:
            self.validate(request_id, handoff_id)
        except DestinationReservationExists as err:
            raise InternalInvariantBroken(str(err), rule="DST-2") from err
        except DestinationHandoffActive as err:
            raise InternalInvariantBroken(str(err), rule="DST-2") from err
        return (
            attrs.evolve(
                self,
                by_handoff=self.by_handoff.set(handoff_id, (request_id, payload)),
                by_request=self.by_request.set(request_id, handoff_id),
            ),
            None,
        )

    def remove(self, handoff_id: HandoffId) -> Tuple["DestinationHolds", Optional[Tuple[RequestId, Any]]]:
        """DST-3: remove a reservation; returns ``(r, payload)`` or ``None`` if unknown."""
        entry = self.by_handoff.get(handoff_id)
        if entry is None:
            return self, None
        request_id = entry[0]
        return (
            attrs.evolve(
                self,
                by_handoff=self.by_handoff.remove(handoff_id),
                by_request=self.by_request.remove(request_id),
            ),
            entry,
        )


TRANSITIONS = (
    Transition(
        "DestinationHolds", "validate", "DST-1",
        guard="request has no reservation; handoff not reserved (request checked first)",
        change="none",
        result="-",
        errors=("destination reservation already exists for request r", "destination handoff h is already active"),
    ),
    Transition(
        "DestinationHolds", "insert", "DST-2",
        guard="DST-1 holds (upstream: debug_assert only)",
        change="by_handoff[h] = (r, payload); by_request[r] = h",
        result="-",
    ),
    Transition(
        "DestinationHolds", "remove", "DST-3",
        guard="always",
        change="delete h and its request",
        result="(r, payload) or None",
    ),
)
