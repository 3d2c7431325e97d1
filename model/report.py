"""Per-request report records and the replay summary (spec/replay.md, REP-1..REP-18).

Pure code: no I/O, no clocks.  The replay drivers feed timing facts into a
:class:`TraceCollector` (one frozen value, updated by returning a new one from
each ``on_*`` function, with the same first-wins / max semantics as upstream's
``TraceCollector``), then call :func:`finish` with the measured wall time to get
the summary dict and the ordered per-request records.

Everything here can also be used without the collector: build
:class:`RequestTimeline` values directly and call :func:`build_summary` /
:func:`build_records`.

Upstream iterates a hash map keyed by random UUIDs when it sums (REP-16), so its
``mean_*``/``std_*`` values and accumulated worker-seconds can differ from ours in
the last ulp; every other number is exact.
"""

from __future__ import annotations

import enum
import math
import struct
from operator import sub as _sub
from typing import Iterable, Mapping, Sequence

import attrs
from pyrsistent import PVector, pvector

from .frozen import EMPTY as _EMPTY_MAP, FrozenDict, adopt as _adopt, draft as _draft

from model.errors import InvalidInput, check_reservation, rust_display

__all__ = [
    "TerminalStatus",
    "RequestTimeline",
    "SlaThresholds",
    "WorkerAccounting",
    "TraceCollector",
    "PerRequestRecord",
    "DistributionStats",
    "REPORT_FIELDS",
    "SUMMARY_WALL_CLOCK_KEYS",
    "uuid_from_int",
    "total_order_key",
    "percentile_rank",
    "distribution_stats",
    "build_record",
    "build_records",
    "record_sort_key",
    "build_summary",
    "summary_keys",
    "finish",
]


# ---------------------------------------------------------------------------
# small numeric helpers
# ---------------------------------------------------------------------------

_F64 = struct.Struct("<d")
_I64 = struct.Struct("<q")


def total_order_key(x: float) -> int:
    """REP-14: an integer key ordering floats like Rust's ``f64::total_cmp``.

    ``-NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN``; equal keys mean
    bit-identical floats.
    """
    bits = _I64.unpack(_F64.pack(x))[0]
    return bits ^ 0x7FFF_FFFF_FFFF_FFFF if bits < 0 else bits


def _fmax(a: float, b: float) -> float:
    """Rust ``f64::max``: IEEE maxNum (a NaN operand yields the other operand)."""
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return a if a >= b else b


def _seq_sum(values: Iterable[float]) -> float:
    """Left-to-right float sum, like Rust's ``Iterator::sum``.

    Python's built-in ``sum`` is compensated for floats since 3.12, so it is not
    used for anything upstream adds with plain ``+`` (REP-16).
    """
    total = 0.0
    for v in values:
        total += v
    return total


def _round_half_away(x: float) -> int:
    """Rust ``f64::round`` for a finite ``x >= 0``: ties go away from zero (REP-13)."""
    whole = math.floor(x)
    return int(whole) + (1 if x - whole >= 0.5 else 0)


def uuid_from_int(n: int) -> str:
    """Rust ``Uuid::from_u128(n).to_string()``: lowercase, hyphenated, zero-padded."""
    if not 0 <= n < 1 << 128:
        raise InvalidInput("uuid", n, "must fit in 128 bits")
    h = f"{n:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# ---------------------------------------------------------------------------
# per-request facts
# ---------------------------------------------------------------------------


class TerminalStatus(str, enum.Enum):
    """REP-3: terminal outcome of a request, serialized in snake_case."""

    COMPLETED = "completed"
    REJECTED = "rejected"
    CANCELED = "canceled"
    FAILED = "failed"


def _opt_float(v: float | None) -> float | None:
    return None if v is None else float(v)


@attrs.frozen(slots=False)  # instance dicts: the per-token copy (:func:`_with_token`) is one dict update
class RequestTimeline:
    """Every fact the collector records about one request (REP-1).

    Filled by the replay driver (usually through :class:`TraceCollector`).
    Field meanings, with the upstream collector call that sets each one:

    - ``arrival_time_ms``, ``input_length``, ``output_length``: ``on_arrival``
      (``output_length`` is the *requested* ``max_output_tokens``).
    - ``first_admit_ms``: time of the first admission (``on_admit`` and the
      prefill/decode variants), first value wins.
    - ``token_times_ms``: one entry per emitted output token (``on_token``), in
      emission order.
    - ``reused_input_tokens``: max over *all* admissions of the cached-prefix
      tokens; ``first_admission_reused_input_tokens``: the value at the first one.
    - ``prefill_worker_idx`` / ``decode_worker_idx``: first dispatch target.
    - ``session_id`` / ``turn_index``: workload-driver metadata, first call wins.
    - the disaggregated handoff times, ``prefill_reused_input_tokens`` /
      ``decode_reused_input_tokens`` (max over prefill / decode admissions), the
      router overlaps and ``terminal_status``: only captured when per-request
      records are requested (``detail`` in upstream); first value wins.
    """

    uuid: str
    arrival_time_ms: float = attrs.field(converter=float)
    input_length: int
    output_length: int
    first_admit_ms: float | None = attrs.field(default=None, converter=_opt_float)
    token_times_ms: PVector = attrs.field(default=pvector(), converter=pvector)
    reused_input_tokens: int = 0
    first_admission_reused_input_tokens: int = 0
    prefill_worker_idx: int | None = None
    decode_worker_idx: int | None = None
    session_id: str | None = None
    turn_index: int | None = None
    prefill_reused_input_tokens: int | None = None
    prefill_admit_ms: float | None = attrs.field(default=None, converter=_opt_float)
    source_held_ms: float | None = attrs.field(default=None, converter=_opt_float)
    destination_reserved_ms: float | None = attrs.field(default=None, converter=_opt_float)
    destination_activated_ms: float | None = attrs.field(default=None, converter=_opt_float)
    decode_admit_ms: float | None = attrs.field(default=None, converter=_opt_float)
    source_released_ms: float | None = attrs.field(default=None, converter=_opt_float)
    decode_reused_input_tokens: int | None = None
    prefill_route_overlap_tokens: int | None = None
    decode_route_overlap_tokens: int | None = None
    terminal_status: TerminalStatus | None = None

    # -- derived values (REP-2) -------------------------------------------

    @property
    def first_token_ms(self) -> float | None:
        return self.token_times_ms[0] if self.token_times_ms else None

    @property
    def last_token_ms(self) -> float | None:
        return self.token_times_ms[-1] if self.token_times_ms else None

    @property
    def ttft_ms(self) -> float | None:
        """REP-2: ``max(first_token - arrival, 0)``."""
        t = self.first_token_ms
        return None if t is None else _fmax(t - self.arrival_time_ms, 0.0)

    @property
    def e2e_latency_ms(self) -> float | None:
        """REP-2: ``max(last_token - arrival, 0)``."""
        t = self.last_token_ms
        return None if t is None else _fmax(t - self.arrival_time_ms, 0.0)

    @property
    def ttst_ms(self) -> float | None:
        """REP-2: ``max(t[1] - t[0], 0)`` when at least two tokens."""
        t = self.token_times_ms
        return _fmax(t[1] - t[0], 0.0) if len(t) >= 2 else None

    @property
    def mean_tpot_ms(self) -> float | None:
        """REP-2: ``max(t[-1] - t[0], 0) / (len(t) - 1)`` (the report's ``itl_ms``)."""
        t = self.token_times_ms
        if len(t) < 2:
            return None
        return _fmax(t[-1] - t[0], 0.0) / float(len(t) - 1)

    def itls_ms(self) -> tuple[float, ...]:
        """REP-11: every per-token gap ``max(t[i+1] - t[i], 0)``."""
        t = list(self.token_times_ms)
        # _fmax(d, 0.0) written out: a NaN gap gives 0.0, any other gap d gives d if d >= 0.0 else 0.0
        return tuple(
            (d if d >= 0.0 else 0.0) if d == d else 0.0 for d in map(_sub, t[1:], t[:-1])
        )

    @property
    def counts_as_completed(self) -> bool:
        """REP-7: admitted at least once and emitted at least one token."""
        return self.first_admit_ms is not None and len(self.token_times_ms) > 0

    @property
    def report_reused_input_tokens(self) -> int:
        """REP-3: the prefill-side maximum when recorded, else the overall maximum."""
        if self.prefill_reused_input_tokens is not None:
            return self.prefill_reused_input_tokens
        return self.reused_input_tokens


# ---------------------------------------------------------------------------
# SLA, worker accounting
# ---------------------------------------------------------------------------


def _check_sla(name: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(name, value, "must be a number", rule="REP-12")
    if not math.isfinite(value) or value < 0:
        raise InvalidInput(
            name, value, f"{name} must be a finite, non-negative value, got {rust_display(float(value))}",
            rule="REP-12",
        )


@attrs.frozen
class SlaThresholds:
    """REP-12: goodput SLA; each bound that is set must hold (``<=``).

    The bounds are checked by :meth:`check`, not when built: the binding checks them at one
    point of its argument order (DRV-1), which ``check_setup`` follows."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    e2e_ms: float | None = None

    def check(self) -> "SlaThresholds":
        """REP-12: upstream ``validate_sla_threshold`` on ttft, itl, then e2e; returns ``self``."""
        for name in ("ttft_ms", "itl_ms", "e2e_ms"):
            _check_sla(f"sla_{name}", getattr(self, name))  # the binding's argument names
        return self

    @property
    def is_set(self) -> bool:
        return self.ttft_ms is not None or self.itl_ms is not None or self.e2e_ms is not None

    def is_good(self, ttft_ms: float, e2e_ms: float, output_length: int) -> bool:
        """REP-12: e2e bound, then ttft bound, then ``(e2e-ttft)/(osl-1)`` when osl > 1."""
        if self.e2e_ms is not None and e2e_ms > self.e2e_ms:
            return False
        if self.ttft_ms is not None and ttft_ms > self.ttft_ms:
            return False
        if self.itl_ms is not None and output_length > 1:
            avg_itl_ms = (e2e_ms - ttft_ms) / (float(output_length) - 1.0)
            if avg_itl_ms > self.itl_ms:
                return False
        return True


@attrs.frozen
class WorkerAccounting:
    """REP-9/REP-10: provisioned worker-seconds and GPUs per worker.

    Agg/disagg drivers call :meth:`add_worker_seconds` at every clock advance
    with ``count * dt_ms / 1000`` per role (aggregated replay passes prefill 0).
    The single-worker runtime instead sets ``static_worker_count=(0, 1)``, and
    the summary then uses ``count * duration_s``.
    """

    prefill_worker_seconds: float = 0.0
    decode_worker_seconds: float = 0.0
    static_worker_count: tuple[int, int] | None = None
    prefill_gpus_per_worker: int = 0
    decode_gpus_per_worker: int = 0

    def add_worker_seconds(self, prefill: float, decode: float) -> "WorkerAccounting":
        return attrs.evolve(
            self,
            prefill_worker_seconds=self.prefill_worker_seconds + prefill,
            decode_worker_seconds=self.decode_worker_seconds + decode,
        )

    def with_static_worker_count(self, prefill: int, decode: int) -> "WorkerAccounting":
        return attrs.evolve(self, static_worker_count=(prefill, decode))

    def with_gpus_per_worker(self, prefill: int, decode: int) -> "WorkerAccounting":
        return attrs.evolve(self, prefill_gpus_per_worker=prefill, decode_gpus_per_worker=decode)

    def worker_seconds(self, duration_s: float) -> tuple[float, float]:
        """REP-9: ``(prefill, decode)`` worker-seconds for a run of ``duration_s``."""
        if self.static_worker_count is not None:
            p, d = self.static_worker_count
            return float(p) * duration_s, float(d) * duration_s
        return self.prefill_worker_seconds, self.decode_worker_seconds


# ---------------------------------------------------------------------------
# collector
# ---------------------------------------------------------------------------


def _frozen_map(value) -> FrozenDict:
    return value if type(value) is FrozenDict else FrozenDict(value)


def _map_set(m: FrozenDict, key, value) -> FrozenDict:
    """``m`` with ``key`` set to ``value`` (one copy)."""
    d = _draft(m)
    d[key] = value
    return _adopt(d)


@attrs.frozen
class TraceCollector:
    """A pure mirror of upstream's ``TraceCollector`` (REP-1).

    Every ``on_*`` returns a new collector.  Calls naming an unknown uuid are
    no-ops, as upstream.  ``capture_per_request`` gates the detail facts
    (handoff times, overlaps, terminal status, session metadata) exactly like
    upstream's ``detail`` box: without it no per-request records are produced.
    ``order`` keeps first-arrival order, which is the summation order used here.
    """

    #: uuid -> timeline, an immutable dict (one C-level copy per change; reads at dict speed)
    requests: FrozenDict = attrs.field(default=_EMPTY_MAP, converter=_frozen_map)
    order: PVector = attrs.field(factory=pvector)
    capture_per_request: bool = False
    sla: SlaThresholds = attrs.field(factory=SlaThresholds)
    accounting: WorkerAccounting = attrs.field(factory=WorkerAccounting)

    # -- configuration ------------------------------------------------------

    def with_capture_per_request(self, value: bool = True) -> "TraceCollector":
        return attrs.evolve(self, capture_per_request=value)

    def with_sla(self, sla: SlaThresholds) -> "TraceCollector":
        return attrs.evolve(self, sla=sla.check())

    def add_worker_seconds(self, prefill: float, decode: float) -> "TraceCollector":
        return attrs.evolve(self, accounting=self.accounting.add_worker_seconds(prefill, decode))

    def set_static_worker_count(self, prefill: int, decode: int) -> "TraceCollector":
        return attrs.evolve(self, accounting=self.accounting.with_static_worker_count(prefill, decode))

    def set_gpus_per_worker(self, prefill: int, decode: int) -> "TraceCollector":
        return attrs.evolve(self, accounting=self.accounting.with_gpus_per_worker(prefill, decode))

    # -- helpers -------------------------------------------------------------

    def timelines(self) -> tuple[RequestTimeline, ...]:
        """Every recorded request, in first-arrival order."""
        return tuple(self.requests[u] for u in self.order)

    def _update(self, uuid: str, **changes: object) -> "TraceCollector":
        return attrs.evolve(self, requests=_map_set(self.requests, uuid, attrs.evolve(self.requests[uuid], **changes)))

    def _detail(self, uuid: str) -> RequestTimeline | None:
        if not self.capture_per_request:
            return None
        return self.requests.get(uuid)

    # -- facts ------------------------------------------------------------------

    def on_arrival(self, uuid: str, arrival_time_ms: float, input_length: int, output_length: int) -> "TraceCollector":
        """Insert (or replace) the request's entry with a fresh timeline.  REP-1: upstream reserves
        room for ``output_length`` f64 token times here, and a reservation of more than isize::MAX
        bytes panics with "capacity overflow" (collector.rs:590); the model refuses the request the
        same way."""
        check_reservation("output_length", output_length, output_length, 8, "REP-1")  # f64 times
        tl = RequestTimeline(
            uuid=uuid, arrival_time_ms=arrival_time_ms, input_length=input_length, output_length=output_length
        )
        order = self.order if uuid in self.requests else self.order.append(uuid)
        return attrs.evolve(self, requests=_map_set(self.requests, uuid, tl), order=order)

    def on_session_metadata(self, uuid: str, session_id: str, turn_index: int) -> "TraceCollector":
        tl = self._detail(uuid)
        if tl is None or tl.session_id is not None:
            return self
        return self._update(uuid, session_id=session_id, turn_index=turn_index)

    def on_prefill_assigned(self, uuid: str, worker_idx: int) -> "TraceCollector":
        tl = self.requests.get(uuid)
        if tl is None or tl.prefill_worker_idx is not None:
            return self
        return self._update(uuid, prefill_worker_idx=worker_idx)

    def on_decode_assigned(self, uuid: str, worker_idx: int) -> "TraceCollector":
        tl = self.requests.get(uuid)
        if tl is None or tl.decode_worker_idx is not None:
            return self
        return self._update(uuid, decode_worker_idx=worker_idx)

    def on_admit(self, uuid: str, admit_time_ms: float, reused_input_tokens: int) -> "TraceCollector":
        tl = self.requests.get(uuid)
        if tl is None:
            return self
        changes: dict[str, object] = {"reused_input_tokens": max(tl.reused_input_tokens, reused_input_tokens)}
        if tl.first_admit_ms is None:
            changes["first_admit_ms"] = admit_time_ms
            changes["first_admission_reused_input_tokens"] = reused_input_tokens
        return self._update(uuid, **changes)

    def on_prefill_admit(self, uuid: str, admit_time_ms: float, reused_input_tokens: int) -> "TraceCollector":
        return self._side_admit("prefill", uuid, admit_time_ms, reused_input_tokens)

    def on_decode_admit(self, uuid: str, admit_time_ms: float, reused_input_tokens: int) -> "TraceCollector":
        return self._side_admit("decode", uuid, admit_time_ms, reused_input_tokens)

    def _side_admit(self, side: str, uuid: str, admit_time_ms: float, reused_input_tokens: int) -> "TraceCollector":
        """An admission on one side of a disaggregated replay: the request-wide admission, then the
        side's first admission time and its largest reuse."""
        c = self.on_admit(uuid, admit_time_ms, reused_input_tokens)
        tl = c._detail(uuid)
        if tl is None:
            return c
        first = getattr(tl, f"{side}_admit_ms")
        reused = getattr(tl, f"{side}_reused_input_tokens")
        return c._update(uuid, **{
            f"{side}_admit_ms": first if first is not None else admit_time_ms,
            f"{side}_reused_input_tokens": max(reused or 0, reused_input_tokens),
        })

    def _first_wins(self, uuid: str, name: str, value: object) -> "TraceCollector":
        tl = self._detail(uuid)
        if tl is None or getattr(tl, name) is not None:
            return self
        return self._update(uuid, **{name: value})

    def on_source_held(self, uuid: str, at_ms: float) -> "TraceCollector":
        return self._first_wins(uuid, "source_held_ms", at_ms)

    def on_destination_reserved(self, uuid: str, at_ms: float) -> "TraceCollector":
        return self._first_wins(uuid, "destination_reserved_ms", at_ms)

    def on_destination_activated(self, uuid: str, at_ms: float) -> "TraceCollector":
        return self._first_wins(uuid, "destination_activated_ms", at_ms)

    def on_source_released(self, uuid: str, at_ms: float) -> "TraceCollector":
        return self._first_wins(uuid, "source_released_ms", at_ms)

    def on_prefill_route_overlap(self, uuid: str, tokens: int) -> "TraceCollector":
        return self._first_wins(uuid, "prefill_route_overlap_tokens", tokens)

    def on_decode_route_overlap(self, uuid: str, tokens: int) -> "TraceCollector":
        return self._first_wins(uuid, "decode_route_overlap_tokens", tokens)

    def on_terminal(self, uuid: str, status: TerminalStatus) -> "TraceCollector":
        return self._first_wins(uuid, "terminal_status", TerminalStatus(status))

    def on_token(self, uuid: str, token_time_ms: float) -> "TraceCollector":
        tl = self.requests.get(uuid)
        if tl is None:
            return self
        return self._update(uuid, token_times_ms=tl.token_times_ms.append(float(token_time_ms)))

    def on_tokens(self, uuids, token_time_ms: float) -> "TraceCollector":
        """``on_token`` for each uuid in order, all stamped ``token_time_ms`` (one pass's tokens).

        Equal to calling :meth:`on_token` once per uuid; the new timelines are collected in a
        local map (a repeated uuid sees its earlier token) and set in one copy of the map."""
        requests = self.requests
        get = requests.get
        changed: dict = {}
        t = float(token_time_ms)
        for uuid in uuids:
            tl = changed.get(uuid)
            if tl is None:
                tl = get(uuid)
                if tl is None:
                    continue
            changed[uuid] = _with_token(tl, t)
        if not changed:
            return self
        d = _draft(requests)
        d.update(changed)
        return TraceCollector(_adopt(d), self.order, self.capture_per_request, self.sla, self.accounting)


_TIMELINE_FIELDS = tuple(f.name for f in attrs.fields(RequestTimeline))
_new = object.__new__
_set = object.__setattr__


def _with_token(tl: "RequestTimeline", t: float) -> "RequestTimeline":
    """``attrs.evolve(tl, token_times_ms=...append(t))`` without evolve's per-call introspection:
    a fresh instance gets a copy of the fields (its instance dict, in one update) before anyone
    can see it, then the longer token list (hot path: one call per token)."""
    new = _new(RequestTimeline)
    d = new.__dict__
    d.update(tl.__dict__)
    d["token_times_ms"] = tl.token_times_ms.append(t)
    return new


assert _TIMELINE_FIELDS == (
    "uuid", "arrival_time_ms", "input_length", "output_length", "first_admit_ms", "token_times_ms",
    "reused_input_tokens", "first_admission_reused_input_tokens", "prefill_worker_idx", "decode_worker_idx",
    "session_id", "turn_index", "prefill_reused_input_tokens", "prefill_admit_ms", "source_held_ms",
    "destination_reserved_ms", "destination_activated_ms", "decode_admit_ms", "source_released_ms",
    "decode_reused_input_tokens", "prefill_route_overlap_tokens", "decode_route_overlap_tokens",
    "terminal_status",
), "_with_token must copy every RequestTimeline field"


# ---------------------------------------------------------------------------
# per-request records
# ---------------------------------------------------------------------------

#: REP-3: the 26 JSONL keys, in serialization order.
REPORT_FIELDS: tuple[str, ...] = (
    "session_id",
    "turn_index",
    "uuid",
    "arrival_time_ms",
    "first_admit_ms",
    "first_token_ms",
    "last_token_ms",
    "ttft_ms",
    "ttst_ms",
    "e2e_latency_ms",
    "itl_ms",
    "input_length",
    "output_length",
    "reused_input_tokens",
    "prefill_worker_idx",
    "decode_worker_idx",
    "prefill_admit_ms",
    "source_held_ms",
    "destination_reserved_ms",
    "destination_activated_ms",
    "decode_admit_ms",
    "source_released_ms",
    "decode_reused_input_tokens",
    "prefill_route_overlap_tokens",
    "decode_route_overlap_tokens",
    "terminal_status",
)


@attrs.frozen
class PerRequestRecord:
    """REP-3: one JSONL row; attribute order is the serialization order."""

    session_id: str | None
    turn_index: int | None
    uuid: str
    arrival_time_ms: float
    first_admit_ms: float | None
    first_token_ms: float | None
    last_token_ms: float | None
    ttft_ms: float | None
    ttst_ms: float | None
    e2e_latency_ms: float | None
    itl_ms: float | None
    input_length: int
    output_length: int
    reused_input_tokens: int
    prefill_worker_idx: int | None
    decode_worker_idx: int | None
    prefill_admit_ms: float | None
    source_held_ms: float | None
    destination_reserved_ms: float | None
    destination_activated_ms: float | None
    decode_admit_ms: float | None
    source_released_ms: float | None
    decode_reused_input_tokens: int | None
    prefill_route_overlap_tokens: int | None
    decode_route_overlap_tokens: int | None
    terminal_status: TerminalStatus

    def to_dict(self) -> dict[str, object]:
        """Ordered plain dict (``terminal_status`` as its string)."""
        out: dict[str, object] = {}
        for name in REPORT_FIELDS:
            v = getattr(self, name)
            out[name] = v.value if isinstance(v, TerminalStatus) else v
        return out


assert tuple(a.name for a in attrs.fields(PerRequestRecord)) == REPORT_FIELDS


def build_record(tl: RequestTimeline) -> PerRequestRecord | None:
    """REP-3/REP-4: the JSONL row of one request, or None without a terminal status."""
    if tl.terminal_status is None:
        return None
    return PerRequestRecord(
        session_id=tl.session_id,
        turn_index=tl.turn_index,
        uuid=tl.uuid,
        arrival_time_ms=tl.arrival_time_ms,
        first_admit_ms=tl.first_admit_ms,
        first_token_ms=tl.first_token_ms,
        last_token_ms=tl.last_token_ms,
        ttft_ms=tl.ttft_ms,
        ttst_ms=tl.ttst_ms,
        e2e_latency_ms=tl.e2e_latency_ms,
        itl_ms=tl.mean_tpot_ms,
        input_length=tl.input_length,
        output_length=tl.output_length,
        reused_input_tokens=tl.report_reused_input_tokens,
        prefill_worker_idx=tl.prefill_worker_idx,
        decode_worker_idx=tl.decode_worker_idx,
        prefill_admit_ms=tl.prefill_admit_ms,
        source_held_ms=tl.source_held_ms,
        destination_reserved_ms=tl.destination_reserved_ms,
        destination_activated_ms=tl.destination_activated_ms,
        decode_admit_ms=tl.decode_admit_ms,
        source_released_ms=tl.source_released_ms,
        decode_reused_input_tokens=tl.decode_reused_input_tokens,
        prefill_route_overlap_tokens=tl.prefill_route_overlap_tokens,
        decode_route_overlap_tokens=tl.decode_route_overlap_tokens,
        terminal_status=tl.terminal_status,
    )


def record_sort_key(rec: PerRequestRecord | Mapping[str, object]) -> tuple[int, str]:
    """REP-5: ascending arrival (IEEE total order), then uuid string."""
    if isinstance(rec, PerRequestRecord):
        return total_order_key(rec.arrival_time_ms), rec.uuid
    return total_order_key(float(rec["arrival_time_ms"])), str(rec["uuid"])  # type: ignore[arg-type]


def build_records(timelines: Iterable[RequestTimeline]) -> tuple[PerRequestRecord, ...]:
    """REP-4/REP-5: rows of every request with a terminal status, in report order."""
    recs = [r for r in (build_record(t) for t in timelines) if r is not None]
    recs.sort(key=record_sort_key)
    return tuple(recs)


# ---------------------------------------------------------------------------
# distributions
# ---------------------------------------------------------------------------


@attrs.frozen
class DistributionStats:
    """REP-13: mean, min, max, median, p75, p90, p95, p99, population std."""

    mean: float = 0.0
    min: float = 0.0
    max: float = 0.0
    median: float = 0.0
    p75: float = 0.0
    p90: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    std: float = 0.0


#: order of the nine statistics in the summary
_STAT_NAMES = ("mean", "min", "max", "median", "p75", "p90", "p95", "p99", "std")


def percentile_rank(n: int, percentile: float) -> int:
    """REP-13: ``min(round_half_away((n-1) * p / 100), n-1)``; nearest rank, no interpolation.

    >>> percentile_rank(4, 50.0)   # (3*50)/100 = 1.5 rounds away to 2
    2
    """
    if n <= 0:
        raise InvalidInput("n", n, "percentile of an empty sample", rule="REP-13")
    x = float(n - 1) * percentile / 100.0
    return min(_round_half_away(x), n - 1)


def _mean(values: Sequence[float]) -> float:
    return _seq_sum(values) / float(len(values)) if values else 0.0


def distribution_stats(values: Sequence[float]) -> DistributionStats:
    """REP-13: the nine statistics of ``values`` (all zero when empty).

    ``mean`` is the plain left-to-right sum over ``values`` in the given order
    divided by n; ``std`` is the population standard deviation
    ``sqrt(sum((x-mean)^2)/n)``.  Percentiles pick the element of rank
    :func:`percentile_rank` in IEEE total order.
    """
    if not values:
        return DistributionStats()
    vals = list(values)
    if 0.0 in vals or any(map(math.isnan, vals)):
        ordered = sorted(vals, key=total_order_key)
    else:  # no NaN, no signed zero: float order is total order, equal values have equal bits
        ordered = sorted(vals)
    n = len(vals)
    mean = _mean(vals)
    variance = _seq_sum((x - mean) * (x - mean) for x in vals) / float(n)
    return DistributionStats(
        mean=mean,
        min=ordered[0],
        max=ordered[-1],
        median=ordered[percentile_rank(n, 50.0)],
        p75=ordered[percentile_rank(n, 75.0)],
        p90=ordered[percentile_rank(n, 90.0)],
        p95=ordered[percentile_rank(n, 95.0)],
        p99=ordered[percentile_rank(n, 99.0)],
        std=math.sqrt(variance),
    )


# ---------------------------------------------------------------------------
# summary
# ---------------------------------------------------------------------------

#: REP-17: the keys that depend on the real elapsed time, not on the simulation
SUMMARY_WALL_CLOCK_KEYS: frozenset[str] = frozenset(
    {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
)

#: REP-15: distribution families in summary order, with their key suffix
_FAMILIES = (
    ("ttft", "_ms"),
    ("ttst", "_ms"),
    ("tpot", "_ms"),
    ("itl", "_ms"),
    ("e2e_latency", "_ms"),
    ("output_token_throughput_per_user", ""),
)


def summary_keys(with_goodput: bool) -> tuple[str, ...]:
    """REP-15: every summary key in upstream's serialization order (74, or 77 with goodput).

    ``mocker_spec.formats.write_summary_json`` writes the dict as REP-18 says.
    """
    keys = [
        "num_requests",
        "completed_requests",
        "total_input_tokens",
        "total_output_tokens",
        "duration_ms",
        "wall_time_ms",
        "request_throughput_rps",
        "input_throughput_tok_s",
        "output_throughput_tok_s",
        "total_throughput_tok_s",
        "prefill_worker_seconds",
        "decode_worker_seconds",
        "prefill_gpus_per_worker",
        "decode_gpus_per_worker",
        "gpu_hours",
    ]
    if with_goodput:
        keys += ["goodput_completed_requests", "goodput_request_throughput_rps", "goodput_output_throughput_tok_s"]
    keys += [
        "processed_tokens",
        "processed_tokens_per_s",
        "processed_output_tokens_per_s",
        "prefix_cache_reused_ratio",
        "first_admission_prefix_cache_reused_ratio",
    ]
    for name, suffix in _FAMILIES:
        # upstream writes "max_itl_ms" a second time right after the itl family
        # (same value); in a map that is the same key, so it appears once
        keys += [f"{stat}_{name}{suffix}" for stat in _STAT_NAMES]
    return tuple(keys)


def build_summary(
    timelines: Iterable[RequestTimeline],
    accounting: WorkerAccounting = WorkerAccounting(),
    sla: SlaThresholds = SlaThresholds(),
    wall_time_ms: float = 0.0,
) -> dict[str, float | int]:
    """REP-6..REP-17: the summary dict, keys in upstream order.

    ``timelines`` is every request that arrived (``num_requests`` counts them
    all); only those that :attr:`RequestTimeline.counts_as_completed` feed the
    statistics.  Sums run in the iteration order of ``timelines``.
    """
    tls = list(timelines)
    ttfts: list[float] = []
    ttsts: list[float] = []
    tpots: list[float] = []
    itls: list[float] = []
    e2es: list[float] = []
    per_user: list[float] = []
    duration_ms = 0.0
    total_in = total_out = completed = 0
    reused = first_reused = 0
    good = good_out = 0

    for tl in tls:
        if not tl.counts_as_completed:
            continue
        completed += 1
        # REP-8: requested lengths; reuse is the max over all admissions
        total_in += tl.input_length
        total_out += tl.output_length
        reused += tl.reused_input_tokens
        first_reused += tl.first_admission_reused_input_tokens
        duration_ms = _fmax(duration_ms, tl.last_token_ms)  # type: ignore[arg-type]
        ttft = tl.ttft_ms
        e2e = tl.e2e_latency_ms
        assert ttft is not None and e2e is not None
        ttfts.append(ttft)
        e2es.append(e2e)
        if sla.is_set and sla.is_good(ttft, e2e, tl.output_length):
            good += 1
            good_out += tl.output_length
        ttst = tl.ttst_ms
        if ttst is not None:
            ttsts.append(ttst)
        tpot = tl.mean_tpot_ms
        if tpot is not None:
            tpots.append(tpot)
            gaps = tl.itls_ms()
            per_user.extend([1000.0 / gap for gap in gaps if gap > 0.0])
            itls.extend(gaps)

    duration_s = _fmax(duration_ms / 1000.0, 1e-9)
    pws, dws = accounting.worker_seconds(duration_s)
    pg, dg = accounting.prefill_gpus_per_worker, accounting.decode_gpus_per_worker
    gpu_hours = (pws * float(pg) + dws * float(dg)) / 3600.0
    processed = total_in + total_out
    wall = float(wall_time_ms)

    out: dict[str, float | int] = {
        "num_requests": len(tls),
        "completed_requests": completed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "duration_ms": duration_ms,
        "wall_time_ms": wall,
        "request_throughput_rps": float(completed) / duration_s,
        "input_throughput_tok_s": float(total_in) / duration_s,
        "output_throughput_tok_s": float(total_out) / duration_s,
        "total_throughput_tok_s": float(total_in + total_out) / duration_s,
        "prefill_worker_seconds": pws,
        "decode_worker_seconds": dws,
        "prefill_gpus_per_worker": pg,
        "decode_gpus_per_worker": dg,
        "gpu_hours": gpu_hours,
    }
    if sla.is_set:
        out["goodput_completed_requests"] = good
        out["goodput_request_throughput_rps"] = float(good) / duration_s
        out["goodput_output_throughput_tok_s"] = float(good_out) / duration_s
    out["processed_tokens"] = processed
    out["processed_tokens_per_s"] = 0.0 if wall <= 0.0 else float(processed) / wall * 1000.0
    out["processed_output_tokens_per_s"] = 0.0 if wall <= 0.0 else float(total_out) / wall * 1000.0
    out["prefix_cache_reused_ratio"] = 0.0 if total_in == 0 else float(reused) / float(total_in)
    out["first_admission_prefix_cache_reused_ratio"] = (
        0.0 if total_in == 0 else float(first_reused) / float(total_in)
    )
    samples = {
        "ttft": ttfts,
        "ttst": ttsts,
        "tpot": tpots,
        "itl": itls,
        "e2e_latency": e2es,
        "output_token_throughput_per_user": per_user,
    }
    for name, suffix in _FAMILIES:
        st = distribution_stats(samples[name])
        for stat in _STAT_NAMES:
            out[f"{stat}_{name}{suffix}"] = getattr(st, stat)
    return out


def finish(
    collector: TraceCollector, wall_time_ms: float = 0.0
) -> tuple[dict[str, float | int], tuple[PerRequestRecord, ...]]:
    """REP-4..REP-17: ``(summary, records)``; records only when capture was on."""
    tls = collector.timelines()
    summary = build_summary(tls, collector.accounting, collector.sla, wall_time_ms)
    records = build_records(tls) if collector.capture_per_request else ()
    return summary, records
