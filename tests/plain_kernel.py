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


# ---------------------------------------------------------------------------------------------
# A plain handoff engine for the lockstep oracle harness (spec/oracle-kit.md HARN-9, HARN-10)
# ---------------------------------------------------------------------------------------------


def _ceil_div(a, b):
    return -(-a // b)


class PlainHandoffEngine:
    """The command-level handoff bookkeeping of a vLLM / TRT-LLM core, written from
    spec/core-commands.md (CMD-1..CMD-9, RETRY-1..RETRY-4) on top of the plain machines above.

    It has no scheduler, so it runs the seven commands and the standalone retry but no pass
    (``supported_ops``); the KV pool is a block count: a reservation holds
    ``ceil(prompt / block_size)`` blocks, an activated destination keeps them until it is
    cancelled.  With prompts private to their request id (no two live requests share a block)
    that decides every probe exactly, cached or not: a resurrected cached block and a fresh one
    both come out of the ``num_gpu_blocks - held`` blocks nobody holds.  It speaks the
    step-trace shapes (spec/step-trace.md) and observes the result or error kind and the
    lifecycle events, less ``transferable_prompt_tokens`` (which counts the blocks missing from
    the prefix cache, a cache this engine does not model); it reports no KV events.

    ``bug`` injects one deliberate defect (see ``BUGS``); the harness must catch each.
    """

    name = "plain-handoff-engine"
    supported_ops = ("submit", "submit_prefill", "release_source", "cancel_source", "reserve_destination",
                     "activate_destination", "cancel_destination", "retry")

    BUGS = (
        "release_pending_is_noop",  # CMD-4: releasing a pending source answers Noop
        "id_check_skips_pending_destinations",  # CMD-1: a pending destination's id counts as free
        "capacity_check_off_by_one",  # CMD-6: a prompt of exactly the pool size is refused
        "no_bump_on_reservation_cancel",  # CMD-8 stage 2: cancelling a reservation keeps the generation
        "retry_serves_newest",  # RETRY-3: the newest pending destination is probed, not the head
        "second_cancel_applied",  # CMD-8 stage 4: cancelling a cancelled destination answers Applied
    )

    def __init__(self, bug=None):
        if bug is not None and bug not in self.BUGS:
            raise ValueError(f"unknown bug {bug!r}")
        self.bug = bug
        if bug is not None:
            self.name = f"plain-handoff-engine[{bug}]"

    # -- set-up ----------------------------------------------------------------------------

    def start(self, header):
        a = header["engine_args"]
        self.engine = str(a.get("engine_type", "vllm")).lower()
        if self.engine not in ("vllm", "trtllm"):
            raise ValueError("the plain engine implements the vLLM / TRT-LLM bookkeeping only")
        self.block_size = a.get("block_size") or 16
        self.num_blocks = a.get("num_gpu_blocks", 16384)
        self.max_num_seqs = a.get("max_num_seqs", 256)
        self.src = PlainSourceHolds()
        self.pend = PlainPending()
        self.dst = PlainDestinationHolds()
        self.act = PlainActive()
        self.owned = {}  # scheduler-owned request -> blocks it holds
        self.used = 0
        self.generation = 0
        self.cancelled = set()

    # -- helpers -----------------------------------------------------------------------------

    def _blocks(self, tokens):
        return _ceil_div(len(tokens), self.block_size)

    def _has_role(self, r):
        if r in self.src.pending or any(v[0] == r for v in self.src.held.values()):
            return True
        if self.bug != "id_check_skips_pending_destinations" and any(v[0] == r for v in self.pend.entries.values()):
            return True
        return any(v[0] == r for v in self.dst.by_handoff.values()) or r in self.act.by_handoff.values()

    def _check_id(self, r):  # CMD-1
        if r is None:
            raise Rejected("MissingRequestId")
        if r in self.owned or self._has_role(r):
            raise Rejected("RequestAlreadyActive")

    def _drop(self, r):  # cancel a scheduler-owned request; bump iff it held KV
        blocks = self.owned.pop(r, 0)
        self.src.remove_request(r)
        self.act.remove_request(r)
        if blocks:
            self.used -= blocks
            self.generation += 1

    def _retry(self):  # RETRY-1..RETRY-4
        g = self.generation
        if self.max_num_seqs is not None and self.max_num_seqs <= 0:
            self.pend.mark_front_attempted(g)  # the running set (always empty here) is full
            return []
        if self.bug == "retry_serves_newest":
            live = [h for h in self.pend.fifo if h in self.pend.entries]
            if not live or self.pend.entries[live[-1]][2] == g:
                return []
            h = live[-1]
            r, tokens, _ = self.pend.entries[h]
            self.pend.entries[h][2] = g
            if self._blocks(tokens) > self.num_blocks - self.used:
                return []
            self.pend.remove(h)
        else:
            due = self.pend.front_due(g)
            if due is None:
                return []
            h, r, tokens = due
            self.pend.mark_front_attempted(g)
            if self._blocks(tokens) > self.num_blocks - self.used:
                return []
            self.pend.pop_front()
        n = self._blocks(tokens)
        self.used += n
        self.dst.insert(r, h, n)
        # transferable_prompt_tokens is left out: it counts the blocks not found in the prefix cache,
        # and this engine does not model the cache (the capacity decision does not depend on it)
        return [{"kind": "destination_reserved", "handoff_id": h, "request_id": r}]

    def _applied(self):  # CMD-9
        return {"result": {"kind": "applied"}, "lifecycle_events": self._retry()}

    # -- the step -------------------------------------------------------------------------------

    def step(self, op):
        try:
            return getattr(self, "_op_" + op["op"])(op)
        except Rejected as err:
            return {"error": err.kind}

    def _op_retry(self, op):
        return {"lifecycle_events": self._retry()}

    def _op_submit(self, op):  # CMD-2
        r = op["request"].get("uuid")
        self._check_id(r)
        self.owned[r] = 0
        return {"result": {"kind": "submitted", "request_id": r}, "lifecycle_events": []}

    def _op_submit_prefill(self, op):  # CMD-3
        r = op["request"].get("uuid")
        self._check_id(r)
        self.src.register(r, op["handoff_id"])
        self.owned[r] = 0
        return {"result": {"kind": "submitted", "request_id": r}, "lifecycle_events": []}

    def _op_release_source(self, op):  # CMD-4
        out = self.src.remove(op["handoff_id"])
        if out[0] == "missing":
            return {"result": {"kind": "noop"}, "lifecycle_events": []}
        if out[0] == "held":  # unreachable without passes: nothing completes
            self.generation += 1
        elif self.bug == "release_pending_is_noop":
            self.src.register(out[1], op["handoff_id"])
            return {"result": {"kind": "noop"}, "lifecycle_events": []}
        return self._applied()

    def _op_cancel_source(self, op):  # CMD-5
        out = self.src.remove(op["handoff_id"])
        if out[0] == "missing":
            return {"result": {"kind": "noop"}, "lifecycle_events": []}
        if out[0] == "held":
            self.generation += 1
        else:
            self._drop(out[1])
        return self._applied()

    def _op_reserve_destination(self, op):  # CMD-6
        if self.engine == "trtllm":
            raise Rejected("DestinationUnsupported")
        h = op["handoff_id"]
        r = op["request"].get("uuid")
        self._check_id(r)
        self.pend.validate(r, h)
        self.dst.validate(r, h)
        if h in self.act.by_handoff:
            raise Rejected("DestinationHandoffActive")
        tokens = op["request"]["tokens"]
        limit = self.num_blocks - 1 if self.bug == "capacity_check_off_by_one" else self.num_blocks
        if self._blocks(tokens) > limit:
            raise Rejected("DestinationPromptTooLarge")
        self.pend.insert(r, h, list(tokens))
        self.cancelled.discard(h)
        events = self._retry() if op.get("allow_destination_admission", True) else []
        return {"result": {"kind": "destination_accepted", "request_id": r}, "lifecycle_events": events}

    def _op_activate_destination(self, op):  # CMD-7
        h = op["handoff_id"]
        entry = self.dst.remove(h)
        if entry is None:
            return {"result": {"kind": "noop"}, "lifecycle_events": []}
        r, n = entry
        self.act.insert(h, r)
        self.owned[r] = n
        return self._applied()

    def _op_cancel_destination(self, op):  # CMD-8
        h = op["handoff_id"]
        if self.pend.remove(h) is not None:
            self.generation += 1
            self.cancelled.add(h)
            return self._applied()
        entry = self.dst.remove(h)
        if entry is not None:
            self.used -= entry[1]
            if self.bug != "no_bump_on_reservation_cancel":
                self.generation += 1
            self.cancelled.add(h)
            return self._applied()
        r = self.act.remove_handoff(h)
        if r is not None:
            self._drop(r)
            self.cancelled.add(h)
            return self._applied()
        if self.bug == "second_cancel_applied" and h in self.cancelled:
            return self._applied()
        return {"result": {"kind": "noop"}, "lifecycle_events": []}
