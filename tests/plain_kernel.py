"""Plain mutable renderings of the four bookkeeping machines, written from spec/handoff-lifecycle.md.

They deliberately share no code with ``model/``: dicts and lists mutated in place.
The stateful tests run both renderings side by side and require them to agree.
Errors are reported as the name of the model error class the spec prescribes.
"""

from __future__ import annotations


class Rejected(Exception):
    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class PlainSourceHolds:
    def __init__(self):
        self.pending = {}  # r -> h
        self.held = {}  # h -> (r, payload)

    def snapshot(self):
        return dict(self.pending), dict(self.held)

    def register(self, r, h):  # SRC-1
        if r in self.pending or any(v[0] == r for v in self.held.values()):
            raise Rejected("SourceRequestActive")
        if h in self.pending.values() or h in self.held:
            raise Rejected("SourceHandoffActive")
        self.pending[r] = h

    def complete_source(self, r, payload):  # SRC-3
        if r not in self.pending:
            return ("release", payload)
        h = self.pending.pop(r)
        self.held[h] = (r, payload)
        return ("held", h)

    def remove(self, h):  # SRC-4
        if h in self.held:
            return ("held", self.held.pop(h)[1])
        for r, hh in list(self.pending.items()):
            if hh == h:
                del self.pending[r]
                return ("pending", r)
        return ("missing",)

    def remove_request(self, r):  # SRC-5
        return self.pending.pop(r, None)


class PlainDestinationHolds:
    def __init__(self):
        self.by_handoff = {}

    def snapshot(self):
        return dict(self.by_handoff)

    def validate(self, r, h):  # DST-1
        if any(v[0] == r for v in self.by_handoff.values()):
            raise Rejected("DestinationReservationExists")
        if h in self.by_handoff:
            raise Rejected("DestinationHandoffActive")

    def insert(self, r, h, payload):  # DST-2
        try:
            self.validate(r, h)
        except Rejected:
            raise Rejected("InternalInvariantBroken")
        self.by_handoff[h] = (r, payload)

    def remove(self, h):  # DST-3
        return self.by_handoff.pop(h, None)


class PlainActive:
    def __init__(self):
        self.by_handoff = {}

    def snapshot(self):
        return dict(self.by_handoff)

    def insert(self, h, r):  # ACT-1
        if h in self.by_handoff or r in self.by_handoff.values():
            raise Rejected("InternalInvariantBroken")
        self.by_handoff[h] = r

    def remove_handoff(self, h):  # ACT-2
        return self.by_handoff.pop(h, None)

    def remove_request(self, r):  # ACT-3
        for h, rr in list(self.by_handoff.items()):
            if rr == r:
                del self.by_handoff[h]
                return h
        return None


class PlainPending:
    def __init__(self):
        self.fifo = []  # may hold tombstones
        self.entries = {}  # h -> [r, payload, mark]

    def snapshot(self):
        return list(self.fifo), {h: tuple(v) for h, v in self.entries.items()}

    def validate(self, r, h):  # PEND-1
        if any(v[0] == r for v in self.entries.values()):
            raise Rejected("DestinationRequestPending")
        if h in self.entries:
            raise Rejected("DestinationHandoffPending")

    def _normalize(self):  # PEND-2
        while self.fifo and self.fifo[0] not in self.entries:
            self.fifo.pop(0)

    def _compact(self):  # PEND-7 (and PEND-6)
        if len(self.fifo) > 2 * len(self.entries):
            self.fifo = [h for h in self.fifo if h in self.entries]

    def insert(self, r, h, payload):  # PEND-3
        try:
            self.validate(r, h)
        except Rejected:
            raise Rejected("InternalInvariantBroken")
        self.fifo.append(h)
        self.entries[h] = [r, payload, None]

    def front_due(self, g):  # PEND-4
        self._normalize()
        if not self.fifo:
            return None
        h = self.fifo[0]
        r, payload, mark = self.entries[h]
        if mark == g:
            return None
        return (h, r, payload)

    def mark_front_attempted(self, g):  # PEND-5
        self._normalize()
        if self.fifo:
            self.entries[self.fifo[0]][2] = g

    def pop_front(self):  # PEND-6
        self._normalize()
        if not self.fifo:
            return None
        h = self.fifo.pop(0)
        r, payload, _ = self.entries.pop(h)
        self._compact()
        return (h, r, payload)

    def remove(self, h):  # PEND-7
        if h not in self.entries:
            return None
        r, payload, _ = self.entries.pop(h)
        self._compact()
        return (r, payload)
