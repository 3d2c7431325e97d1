"""ActiveHandoffRequests: activated destinations whose request is scheduler-owned (spec §ACT).

Upstream: ``ActiveHandoffRequests`` in lib/mocker/src/scheduler/source_holds.rs:203-243.
"""

from __future__ import annotations

from typing import Optional, Tuple

import attrs
from pyrsistent import PMap, pmap

from .errors import InternalInvariantBroken
from .ids import HandoffId, RequestId
from .transitions import Transition


@attrs.frozen
class ActiveHandoffRequests:
    """A bijection ``h <-> r`` (ACT-0)."""

    by_handoff: PMap = pmap()  # HandoffId -> RequestId
    by_request: PMap = pmap()  # RequestId -> HandoffId

    def contains_request(self, request_id: RequestId) -> bool:
        return request_id in self.by_request

    def contains_handoff(self, handoff_id: HandoffId) -> bool:
        return handoff_id in self.by_handoff

    def __len__(self) -> int:
        return len(self.by_handoff)

    def is_empty(self) -> bool:
        return not self.by_handoff

    def insert(self, handoff_id: HandoffId, request_id: RequestId) -> Tuple["ActiveHandoffRequests", None]:
        """ACT-1: record an activated destination.

        Upstream only ``debug_assert``s that neither key is present; the model
        raises :class:`InternalInvariantBroken` instead of breaking the bijection.
        """
        if handoff_id in self.by_handoff:
            raise InternalInvariantBroken(f"active destination handoff {handoff_id} already recorded", rule="ACT-1")
        if request_id in self.by_request:
            raise InternalInvariantBroken(f"active destination request {request_id} already recorded", rule="ACT-1")
        return (
            attrs.evolve(
                self,
                by_handoff=self.by_handoff.set(handoff_id, request_id),
                by_request=self.by_request.set(request_id, handoff_id),
            ),
            None,
        )

    def remove_handoff(self, handoff_id: HandoffId) -> Tuple["ActiveHandoffRequests", Optional[RequestId]]:
        """ACT-2: remove by handoff id; returns the request id or ``None``."""
        request_id = self.by_handoff.get(handoff_id)
        if request_id is None:
            return self, None
        return (
            attrs.evolve(
                self,
                by_handoff=self.by_handoff.remove(handoff_id),
                by_request=self.by_request.remove(request_id),
            ),
            request_id,
        )

    def remove_request(self, request_id: RequestId) -> Tuple["ActiveHandoffRequests", Optional[HandoffId]]:
        """ACT-3: remove by request id; returns the handoff id or ``None``."""
        handoff_id = self.by_request.get(request_id)
        if handoff_id is None:
            return self, None
        return (
            attrs.evolve(
                self,
                by_handoff=self.by_handoff.remove(handoff_id),
                by_request=self.by_request.remove(request_id),
            ),
            handoff_id,
        )


TRANSITIONS = (
    Transition(
        "ActiveHandoffRequests", "insert", "ACT-1",
        guard="neither h nor r recorded (upstream: debug_assert only)",
        change="h <-> r",
        result="-",
    ),
    Transition(
        "ActiveHandoffRequests", "remove_handoff", "ACT-2",
        guard="always", change="delete h and its r", result="r or None",
    ),
    Transition(
        "ActiveHandoffRequests", "remove_request", "ACT-3",
        guard="always", change="delete r and its h", result="h or None",
    ),
)
