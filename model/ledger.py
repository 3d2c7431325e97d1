"""HandoffLedger: the four handoff bookkeeping machines of one core plus its capacity generation.

Spec: spec/handoff-lifecycle.md §LEDGER.  Upstream keeps these as separate
fields of ``VllmCore`` / ``SglangCore`` (lib/mocker/src/scheduler/vllm/core.rs:393-400,
lib/mocker/src/scheduler/sglang/core.rs:43-50); the model groups them so both
cores share one definition of the cross-machine rules.
"""

from __future__ import annotations

from typing import Optional

import attrs

from .active_handoffs import ActiveHandoffRequests
from .destination_holds import DestinationHolds
from .errors import DestinationHandoffActive, InternalInvariantBroken
from .ids import HandoffId, RequestId
from .pending_destinations import PendingDestinations
from .source_holds import SourceHolds
from .transitions import Transition

#: upstream stores the generation in a ``u64`` and bumps it with ``checked_add``
GENERATION_MAX = 2**64 - 1


@attrs.frozen
class HandoffLedger:
    """LEDGER-0: source holds, pending/held/active destinations and the capacity generation."""

    source_holds: SourceHolds = SourceHolds()
    pending_destinations: PendingDestinations = PendingDestinations()
    destination_holds: DestinationHolds = DestinationHolds()
    active_destinations: ActiveHandoffRequests = ActiveHandoffRequests()
    capacity_generation: int = 0

    def owns_request(self, request_id: RequestId) -> bool:
        """LEDGER-1: the request has some handoff role (source pending/held, destination pending/held/active)."""
        return (
            self.source_holds.contains_request(request_id)
            or self.pending_destinations.contains_request(request_id)
            or self.destination_holds.contains_request(request_id)
            or self.active_destinations.contains_request(request_id)
        )

    def destination_stage(self, handoff_id: HandoffId) -> Optional[str]:
        """LEDGER-2: ``"pending"``, ``"reserved"``, ``"active"`` or ``None`` (checked in that order)."""
        if self.pending_destinations.contains_handoff(handoff_id):
            return "pending"
        if self.destination_holds.contains(handoff_id):
            return "reserved"
        if self.active_destinations.contains_handoff(handoff_id):
            return "active"
        return None

    def validate_destination(self, request_id: RequestId, handoff_id: HandoffId) -> None:
        """LEDGER-2: the id checks of ``ReserveDestination`` after the request-id check.

        In order: PEND-1, DST-1, then "destination handoff h is already active"
        when h is an activated destination.
        """
        self.pending_destinations.validate(request_id, handoff_id)
        self.destination_holds.validate(request_id, handoff_id)
        if self.active_destinations.contains_handoff(handoff_id):
            raise DestinationHandoffActive(f"destination handoff {handoff_id} is already active", rule="LEDGER-2")

    def bump_generation(self) -> "HandoffLedger":
        """LEDGER-4: ``capacity_generation += 1``; overflow is an upstream panic."""
        if self.capacity_generation >= GENERATION_MAX:
            raise InternalInvariantBroken("destination capacity generation overflow", rule="LEDGER-4")
        return attrs.evolve(self, capacity_generation=self.capacity_generation + 1)

    def is_empty(self) -> bool:
        """LEDGER-5: no handoff structure holds anything (part of a core's ``is_drained``)."""
        return (
            self.source_holds.is_empty()
            and self.pending_destinations.is_empty()
            and self.destination_holds.is_empty()
            and self.active_destinations.is_empty()
        )


TRANSITIONS = (
    Transition(
        "HandoffLedger", "validate_destination", "LEDGER-2",
        guard="PEND-1, then DST-1, then h not an active destination",
        change="none", result="-",
        errors=("destination request r is already pending", "destination handoff h is already pending",
                "destination reservation already exists for request r", "destination handoff h is already active"),
    ),
    Transition(
        "HandoffLedger", "bump_generation", "LEDGER-4",
        guard="generation < 2**64 - 1 (else upstream panics)",
        change="capacity_generation += 1", result="-",
    ),
)
