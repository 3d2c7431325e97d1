"""PendingDestinations: accepted destinations waiting for KV, in a FIFO with tombstones (spec §PEND).

Upstream: ``PendingDestinations<T>`` in lib/mocker/src/scheduler/source_holds.rs:245-383.

State: ``fifo`` (a deque of handoff ids that may hold tombstones: ids no longer
live), ``by_handoff`` (``h -> PendingEntry``) and ``by_request`` (``r -> h``).
Only the head is ever probed; a failed probe marks the head with the capacity
generation it was tried at, and it is not due again until the generation moves.

Quirk PEND-Q1 (upstream S1, "tombstone revival"): ``remove`` leaves the id in the
FIFO, so re-inserting the same handoff id makes the old FIFO slot live again and
the handoff jumps ahead of entries accepted after its first insertion.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import attrs
from pyrsistent import PDeque, PMap, pdeque, pmap

from .errors import DestinationHandoffPending, DestinationRequestPending, InternalInvariantBroken
from .ids import HandoffId, RequestId
from .transitions import Transition


@attrs.frozen
class PendingEntry:
    """One live pending destination (PEND-0)."""

    request_id: RequestId
    payload: Any
    last_attempt_generation: Optional[int] = None


@attrs.frozen
class PendingDestinations:
    """The pending-destination FIFO of one core (PEND-0)."""

    fifo: PDeque = pdeque()  # of HandoffId, may contain tombstones
    by_handoff: PMap = pmap()  # HandoffId -> PendingEntry
    by_request: PMap = pmap()  # RequestId -> HandoffId

    # -- queries --

    def validate(self, request_id: RequestId, handoff_id: HandoffId) -> None:
        """PEND-1: reject a request already pending, then a handoff id already pending."""
        if request_id in self.by_request:
            raise DestinationRequestPending(f"destination request {request_id} is already pending")
        if handoff_id in self.by_handoff:
            raise DestinationHandoffPending(f"destination handoff {handoff_id} is already pending")

    def contains_request(self, request_id: RequestId) -> bool:
        return request_id in self.by_request

    def contains_handoff(self, handoff_id: HandoffId) -> bool:
        return handoff_id in self.by_handoff

    def has_pending(self) -> bool:
        """PEND-8: live entries exist (tombstones never count)."""
        return bool(self.by_handoff)

    def is_empty(self) -> bool:
        return not self.by_handoff

    def __len__(self) -> int:
        """PEND-8: the number of live entries, not ``len(fifo)``."""
        return len(self.by_handoff)

    def entry(self, handoff_id: HandoffId) -> Optional[PendingEntry]:
        return self.by_handoff.get(handoff_id)

    def live_order(self) -> Tuple[HandoffId, ...]:
        """Live handoff ids in the order the FIFO will serve them (first copy wins, PEND-Q1)."""
        seen = set()
        out = []
        for h in self.fifo:
            if h in self.by_handoff and h not in seen:
                seen.add(h)
                out.append(h)
        return tuple(out)

    def payloads(self) -> Tuple[Any, ...]:
        """PEND-8: payloads of live entries in FIFO order.

        Upstream iterates its hash map (``FxHashMap::values``), whose order is an
        artefact of the hash; only order-insensitive consumers read it (counts
        and integer sums; see fidelity notes for the Welford variance).
        """
        return tuple(self.by_handoff[h].payload for h in self.live_order())

    def head(self) -> Optional[HandoffId]:
        """The normalized head (first FIFO id that is live), without changing state."""
        for h in self.fifo:
            if h in self.by_handoff:
                return h
        return None

    # -- internal rules --

    def _normalized_fifo(self) -> PDeque:
        """PEND-2: pop tombstones off the front."""
        fifo = self.fifo
        while fifo and fifo.left not in self.by_handoff:
            fifo = fifo.popleft()
        return fifo

    @staticmethod
    def _compact_if_sparse(fifo: PDeque, by_handoff: PMap) -> PDeque:
        """PEND-7: when ``len(fifo) > 2 * live``, keep only live ids (duplicates included)."""
        if len(fifo) <= 2 * len(by_handoff):
            return fifo
        return pdeque(h for h in fifo if h in by_handoff)

    # -- transitions --

    def insert(self, request_id: RequestId, handoff_id: HandoffId, payload: Any) -> Tuple["PendingDestinations", None]:
        """PEND-3: append at the back, unmarked.  No compaction.

        Upstream only ``debug_assert``s PEND-1 here (the core validates first);
        the model raises :class:`InternalInvariantBroken` rather than corrupt the maps.
        """
        try:
            self.validate(request_id, handoff_id)
        except (DestinationRequestPending, DestinationHandoffPending) as err:
            raise InternalInvariantBroken(str(err), rule="PEND-3") from err
        return (
            PendingDestinations(
                fifo=self.fifo.append(handoff_id),
                by_handoff=self.by_handoff.set(handoff_id, PendingEntry(request_id, payload, None)),
                by_request=self.by_request.set(request_id, handoff_id),
            ),
            None,
        )

    def front_due(self, generation: int) -> Tuple["PendingDestinations", Optional[Tuple[HandoffId, RequestId, Any]]]:
        """PEND-4: normalize, then return the head unless it was already tried at ``generation``.

        An unmarked head (``None``) is always due.
        """
        fifo = self._normalized_fifo()
        new = self if fifo is self.fifo else attrs.evolve(self, fifo=fifo)
        if not fifo:
            return new, None
        h = fifo.left
        entry = self.by_handoff[h]
        if entry.last_attempt_generation == generation:
            return new, None
        return new, (h, entry.request_id, entry.payload)

    def mark_front_attempted(self, generation: int) -> Tuple["PendingDestinations", None]:
        """PEND-5: normalize, then mark the head as tried at ``generation`` (no-op when empty)."""
        fifo = self._normalized_fifo()
        if not fifo:
            return (self if fifo is self.fifo else attrs.evolve(self, fifo=fifo)), None
        h = fifo.left
        entry = self.by_handoff[h]
        return (
            attrs.evolve(
                self,
                fifo=fifo,
                by_handoff=self.by_handoff.set(h, attrs.evolve(entry, last_attempt_generation=generation)),
            ),
            None,
        )

    def pop_front(self) -> Tuple["PendingDestinations", Optional[Tuple[HandoffId, RequestId, Any]]]:
        """PEND-6: normalize, pop the head, delete its entry, then compact if sparse."""
        fifo = self._normalized_fifo()
        if not fifo:
            return (self if fifo is self.fifo else attrs.evolve(self, fifo=fifo)), None
        h = fifo.left
        fifo = fifo.popleft()
        entry = self.by_handoff[h]
        if self.by_request.get(entry.request_id) != h:
            raise InternalInvariantBroken("pending destination maps disagree", rule="PEND-6")
        by_handoff = self.by_handoff.remove(h)
        by_request = self.by_request.remove(entry.request_id)
        fifo = self._compact_if_sparse(fifo, by_handoff)
        return (
            PendingDestinations(fifo=fifo, by_handoff=by_handoff, by_request=by_request),
            (h, entry.request_id, entry.payload),
        )

    def remove(self, handoff_id: HandoffId) -> Tuple["PendingDestinations", Optional[Tuple[RequestId, Any]]]:
        """PEND-7: delete the entry from any position, leaving a FIFO tombstone; then compact if sparse."""
        entry = self.by_handoff.get(handoff_id)
        if entry is None:
            return self, None
        by_handoff = self.by_handoff.remove(handoff_id)
        by_request = self.by_request.remove(entry.request_id)
        fifo = self._compact_if_sparse(self.fifo, by_handoff)
        return (
            PendingDestinations(fifo=fifo, by_handoff=by_handoff, by_request=by_request),
            (entry.request_id, entry.payload),
        )


TRANSITIONS = (
    Transition(
        "PendingDestinations", "validate", "PEND-1",
        guard="request not pending; handoff not pending (request checked first)",
        change="none", result="-",
        errors=("destination request r is already pending", "destination handoff h is already pending"),
    ),
    Transition(
        "PendingDestinations", "normalize_front", "PEND-2",
        guard="always", change="pop tombstones off the FIFO front", result="-",
    ),
    Transition(
        "PendingDestinations", "insert", "PEND-3",
        guard="PEND-1 holds (upstream: debug_assert only)",
        change="append h to the FIFO; entry (r, payload, last_attempt=None)", result="-",
        quirks=("PEND-Q1: a tombstone of the same h earlier in the FIFO becomes live again",),
    ),
    Transition(
        "PendingDestinations", "front_due", "PEND-4",
        guard="always",
        change="normalize front",
        result="(h, r, payload) of the head unless head.last_attempt == generation; else None",
    ),
    Transition(
        "PendingDestinations", "mark_front_attempted", "PEND-5",
        guard="always", change="normalize; head.last_attempt = generation (if any head)", result="-",
    ),
    Transition(
        "PendingDestinations", "pop_front", "PEND-6",
        guard="always",
        change="normalize; pop head; delete its entry; compact if len(fifo) > 2*live",
        result="(h, r, payload) or None",
    ),
    Transition(
        "PendingDestinations", "remove", "PEND-7",
        guard="always",
        change="delete entry of h (FIFO slot stays as tombstone); compact if len(fifo) > 2*live",
        result="(r, payload) or None",
        quirks=("PEND-Q1: the tombstone can be revived by a later insert of h",),
    ),
)
