"""Small test helpers for the engine-core ports (Python counterparts of upstream's test scaffolding).

Upstream drives a mutable ``VllmCore`` / ``EngineCore`` (``core.receive``,
``core.apply_command``, ``core.execute_pass``...).  The model's cores are frozen
values, so :class:`Core` keeps the current value and replaces it after every
operation; the tests then read like upstream's.

* :func:`u` is ``Uuid::from_u128(n)``: request ids are UUID strings, so the
  request key (SEQ-2 input) is the UUID's integer, as upstream's uuid-derived
  partial-block ids are unique per request.
* :class:`Collector` stands in for ``TraceCollector`` (first admission and token
  times per request): admissions are stamped at the pass start, tokens at
  ``PassResult.token_ms``.
* :class:`RouterIndex` stands in for ``RouterIndexerHarness``
  (lib/mocker/src/scheduler/test_utils.rs:24-175): a per-worker set of block
  hashes that counts the event outcomes the harness asserts on -- a Stored
  whose parent is unknown, a Removed of an unknown block (errors), and a
  Stored of a block already present (duplicate-store warning).
* :func:`stored_hashes` / :func:`removed_event_count` mirror the helpers of the
  same name (test_utils.rs:237-276).
"""

from __future__ import annotations

import uuid as _uuid
from typing import Dict, Iterable, List, Optional

import attrs

from model import core as C
from model.engine_args import EngineArgs
from model.kv_events import KvRemoved, KvStored
from model.protocol import (
    ActivateDestination,
    CancelDestination,
    CancelSource,
    DirectRequest,
    ReleaseSource,
    ReserveDestination,
    Submit,
    Submitted,
    SubmitHandoffPrefill,
)


def u(n: int) -> str:
    """``Uuid::from_u128(n)`` as the model's request / handoff id string."""
    return str(_uuid.UUID(int=n))


def args(**kw) -> EngineArgs:
    """``MockEngineArgs::builder()...build()`` with upstream's defaults for anything not given."""
    return EngineArgs(**kw)


def request(uuid: str, tokens: Iterable[int], max_output_tokens: int) -> DirectRequest:
    return DirectRequest(tuple(tokens), max_output_tokens, uuid)


class Core:
    """A mutable handle on a frozen core value (upstream's ``&mut VllmCore``)."""

    def __init__(self, engine_args: EngineArgs, *, capture_kv_events: bool = False, dp_rank: int = 0) -> None:
        self.value = C.new_core(engine_args, dp_rank=dp_rank, capture_kv_events=capture_kv_events)
        self.kv_events: List[object] = []  # events from commands / retries (``drain_kv_events``)

    # -- commands ----------------------------------------------------------------------------

    def effects(self, command, allow: bool = True):
        new, eff = C.apply_command_effects(self.value, command, allow)
        self.value = new
        self.kv_events.extend(eff.kv_events)
        return eff

    def apply(self, command):
        """``apply_command``: the effects' lifecycle events are dropped (CMD-9)."""
        return self.effects(command, True).result

    def receive(self, req: DirectRequest) -> str:
        result = self.apply(Submit(req))
        assert isinstance(result, Submitted)
        return result.request_id

    def submit_prefill(self, handoff: str, req: DirectRequest):
        return self.apply(SubmitHandoffPrefill(handoff, req))

    def release(self, handoff: str):
        return self.apply(ReleaseSource(handoff))

    def cancel_source(self, handoff: str):
        return self.apply(CancelSource(handoff))

    def reserve(self, handoff: str, req: DirectRequest, allow: bool = True):
        return self.effects(ReserveDestination(handoff, req), allow)

    def activate(self, handoff: str):
        return self.apply(ActivateDestination(handoff))

    def cancel_destination(self, handoff: str, allow: bool = True):
        return self.effects(CancelDestination(handoff), allow)

    def retry(self):
        new, eff = C.retry_pending_destinations(self.value)
        self.value = new
        self.kv_events.extend(eff.kv_events)
        return list(eff.lifecycle_events)

    def drain_kv_events(self) -> List[object]:
        out, self.kv_events = self.kv_events, []
        return out

    # -- passes ------------------------------------------------------------------------------

    def execute(self, now_ms: float, collector: Optional["Collector"] = None):
        new, result = C.execute_pass(self.value, now_ms)
        self.value = new
        if collector is not None:
            collector.observe(result)
        return result

    def hidden(self, now_ms: float):
        new, result = C.execute_hidden_pass(self.value, now_ms)
        self.value = new
        return result

    # -- queries -----------------------------------------------------------------------------

    def is_empty(self) -> bool:
        return C.is_empty(self.value)

    def is_drained(self) -> bool:
        return C.is_drained(self.value)

    def num_requests(self) -> int:
        return C.num_requests(self.value)

    def metrics(self):
        return C.metrics(self.value)

    # vLLM-core views (``core.state`` / ``core.kv_manager`` in upstream tests)

    @property
    def requests(self):
        return self.value.requests

    @property
    def waiting(self) -> List[str]:
        """The live waiting deque (stale ids skipped), as upstream tests read ``state.waiting``
        right after a pass, when no stale id can precede a live one at the front."""
        v = self.value
        return [x.value for x in v.waiting if x in v.waiting_members and x in v.requests]

    @property
    def running(self) -> List[str]:
        v = self.value
        return [x.value for x in v.running if x in v.running_members and x in v.requests]

    def req(self, uuid: str):
        from model.ids import rid

        return self.value.requests[rid(uuid)]

    def install_running(self, kv, requests) -> None:
        """Replace a vLLM core's KV pool and requests with ``kv`` and ``requests`` (in order), all
        running: a state built directly, as upstream's tests build one."""
        from pyrsistent import pmap, pset, pvector

        ids = [r.uuid for r in requests]
        self.value = attrs.evolve(self.value, kv=kv, requests=pmap({r.uuid: r for r in requests}),
                                  running=pvector(ids), running_members=pset(ids))

    def num_active_blocks(self) -> int:
        from model import vllm_kv

        return vllm_kv.num_active_blocks(self.value.kv)

    def source_is_held(self, handoff: str) -> bool:
        from model.ids import hid

        return self.value.ledger.source_holds.is_held(hid(handoff))

    def source_is_registered(self, handoff: str) -> bool:
        from model.ids import hid

        return self.value.ledger.source_holds.is_registered(hid(handoff))

    def destination_is_held(self, handoff: str) -> bool:
        """Upstream ``destination_is_held``: reserved, or still pending."""
        from model.ids import hid

        h = hid(handoff)
        ledger = self.value.ledger
        return ledger.destination_holds.contains(h) or ledger.pending_destinations.contains_handoff(h)

    def reservation_attempts(self) -> int:
        return self.value.destination_reservation_attempts


@attrs.define
class Snapshot:
    first_admit_ms: Optional[float] = None
    first_token_ms: Optional[float] = None
    tokens: int = 0


class Collector:
    """``TraceCollector`` for the fields upstream tests read (admission and token times)."""

    def __init__(self) -> None:
        self.by_request: Dict[str, Snapshot] = {}

    def observe(self, result) -> None:
        for adm in result.admissions:
            snap = self.by_request.setdefault(adm.uuid.value, Snapshot())
            if snap.first_admit_ms is None:
                snap.first_admit_ms = result.now_ms
        for sig in result.output_signals:
            if sig.rejected:
                continue
            snap = self.by_request.setdefault(sig.uuid.value, Snapshot())
            if snap.first_token_ms is None:
                snap.first_token_ms = result.token_ms
            snap.tokens += 1

    def snapshot(self, uuid: str) -> Optional[Snapshot]:
        return self.by_request.get(uuid)


def stored_hashes(events) -> List[int]:
    """The local (``tokens_hash``) hashes of every Stored block, in order."""
    return [b.tokens_hash for e in events if isinstance(e.data, KvStored) for b in e.data.blocks]


def removed_event_count(events) -> int:
    return sum(1 for e in events if isinstance(e.data, KvRemoved))


class RouterIndex:
    """A minimal router-side view of one worker's cached blocks, counting bad events."""

    def __init__(self) -> None:
        self.present: set = set()
        self.stored_ok = 0
        self.removed_ok = 0
        self.errors: List[str] = []
        self.warnings: List[str] = []

    def apply(self, events) -> None:
        for e in events:
            data = e.data
            if isinstance(data, KvStored):
                if data.parent_hash is not None and data.parent_hash not in self.present:
                    self.errors.append(f"stored/parent_not_found {data.parent_hash}")
                    continue
                for block in data.blocks:
                    if block.block_hash in self.present:
                        self.warnings.append(f"duplicate_store {block.block_hash}")
                    self.present.add(block.block_hash)
                self.stored_ok += 1
            elif isinstance(data, KvRemoved):
                bad = [h for h in data.block_hashes if h not in self.present]
                if bad:
                    self.errors.append(f"removed/block_not_found {bad}")
                    continue
                self.present.difference_update(data.block_hashes)
                self.removed_ok += 1
        assert not self.errors, self.errors

    def assert_no_event_errors(self) -> None:
        assert not self.errors, self.errors

    def assert_no_event_warnings(self) -> None:
        assert not self.warnings, self.warnings
