"""Offline-replay workloads: mooncake traces and synthetic inputs (spec/replay.md, WL-1..WL-19).

Pure code: rows arrive already read (decoded dicts, or text lines with their
line numbers); the shell (``mocker_spec.formats``) does the file I/O.

Pipeline for a trace file (WL-14):

1. :func:`parse_mooncake_row` / :func:`parse_mooncake_line` -- one row, serde rules.
2. :func:`trace_from_mooncake_rows` -- rows to sessions and turns (clamping,
   delays, sessions by first appearance).
3. :func:`normalize_session_starts` then :func:`speed_up_timing`.
4. :func:`is_single_turn` chooses the path: a flat, stably sorted request list
   (:func:`to_single_turn_requests` + :func:`normalize_trace_requests`) or the
   session workload (:class:`Trace`, run by a workload driver).

:func:`load_trace_workload` chains the four steps.

Request ids: upstream draws random v4 UUIDs for trace requests.  The model is
deterministic: flat trace request ``i`` (0-based, file order) gets
``uuid_from_int(i + 1)``, the scheme upstream itself uses for synthetic flat
requests (WL-13).  Report rows are ordered by (arrival, uuid), so among equal
arrivals our order is file order while upstream's is random; the uuid value of a
report row carries no meaning.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping, Sequence

import attrs

from model.errors import InvalidInput, check_reservation, rust_display
from model.rustlib import RUST_WHITESPACE, has_lone_surrogate, no_json_constant, serde_json_number
from model.report import total_order_key, uuid_from_int

__all__ = [
    "MooncakeRow",
    "TurnTrace",
    "SessionTrace",
    "Trace",
    "ReplayRequest",
    "FlatWorkload",
    "SessionWorkload",
    "MOONCAKE_FIELDS",
    "MOONCAKE_ALIASES",
    "parse_mooncake_row",
    "parse_mooncake_line",
    "trace_from_mooncake_rows",
    "trace_from_mooncake_lines",
    "synthesize_tokens",
    "cumulative_session_tokens",
    "normalize_session_starts",
    "speed_up_timing",
    "validate_for_trace_mode",
    "validate_for_concurrency_mode",
    "is_single_turn",
    "to_single_turn_requests",
    "normalize_trace_requests",
    "load_trace_workload",
    "canonical_trace_format",
    "workload_from_trace",
    "synthetic_token_id",
    "synthetic_requests",
    "synthetic_workload",
    "synthetic_replay_workload",
    "SYNTHETIC_SEED",
    "DEFAULT_TRACE_BLOCK_SIZE",
    "SYNTHETIC_PREFIX_TAG",
]

#: WL-5: ``trace_block_size`` when a replay gives none (the binding's default)
DEFAULT_TRACE_BLOCK_SIZE = 512

_U64_MAX = (1 << 64) - 1
_U32_MAX = (1 << 32) - 1
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


def _bad(line: int | None, field: str, value: object, reason: str, rule: str, detail: str | None = None) -> InvalidInput:
    """An InvalidInput naming ``trace line N`` and the field; ``.line`` holds N."""
    name = field if line is None else f"trace line {line}: {field}"
    err = InvalidInput(name, value, reason, rule=rule, detail=detail)
    err.line = line  # type: ignore[attr-defined]
    return err


# ---------------------------------------------------------------------------
# WL-1..WL-4: one mooncake row
# ---------------------------------------------------------------------------

#: WL-1: the row fields in declaration order (a JSON array row is read positionally): the
#: compiled build's row, which adds ``request_id`` and ``output_token_ids`` to the pinned nine
MOONCAKE_FIELDS: tuple[str, ...] = (
    "request_id",
    "session_id",
    "input_length",
    "output_length",
    "output_token_ids",
    "hash_ids",
    "timestamp",
    "delay",
    "priority",
    "strict_priority",
    "policy_class",
)

#: WL-1: accepted alternative key -> canonical field
MOONCAKE_ALIASES: Mapping[str, str] = {
    "input_tokens": "input_length",
    "output_tokens": "output_length",
    "created_time": "timestamp",
    "delay_ms": "delay",
}


@attrs.frozen
class MooncakeRow:
    """WL-1: one decoded trace row; every field optional at this stage."""

    session_id: str | None = None
    input_length: int | None = None
    output_length: int | None = None
    hash_ids: tuple[int, ...] | None = None
    request_id: str | None = None  # the compiled build's row only (WL-1)
    output_token_ids: tuple[int, ...] | None = None  # the compiled build's row only (WL-1, WL-5)
    timestamp: float | None = None
    delay: float | None = None
    priority: int | None = None
    strict_priority: int | None = None
    policy_class: str | None = None


def _as_uint(line: int | None, field: str, v: Any, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(line, field, v, f"invalid type: expected an integer in 0..={hi}", "WL-2")
    if not 0 <= v <= hi:
        raise _bad(line, field, v, f"invalid value: expected an integer in 0..={hi}", "WL-2")
    return v


def _as_f64(line: int | None, field: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(line, field, v, "invalid type: expected a number", "WL-2")
    x = float(v)
    if not math.isfinite(x):
        # serde_json has no NaN/Infinity literals and rejects out-of-range numbers
        raise _bad(line, field, v, "invalid value: expected a finite number", "WL-2")
    return x


def _convert(line: int | None, field: str, v: Any) -> Any:
    if v is None:
        return None
    if field in ("session_id", "policy_class", "request_id"):
        if not isinstance(v, str):
            raise _bad(line, field, v, "invalid type: expected a string", "WL-2")
        if has_lone_surrogate(v):
            raise _bad(line, field, v, "lone surrogate in hex escape", "WL-2")
        return v
    if field in ("input_length", "output_length"):
        return _as_uint(line, field, v, _U64_MAX)
    if field == "hash_ids":
        if not isinstance(v, (list, tuple)):
            raise _bad(line, field, v, "invalid type: expected an array of u64", "WL-2")
        return tuple(_as_uint(line, field, h, _U64_MAX) for h in v)
    if field == "output_token_ids":
        if not isinstance(v, (list, tuple)):
            raise _bad(line, field, v, "invalid type: expected an array of u32", "WL-2")
        return tuple(_as_uint(line, field, t, _U32_MAX) for t in v)
    if field in ("timestamp", "delay"):
        return _as_f64(line, field, v)
    if field == "priority":
        if isinstance(v, bool) or not isinstance(v, int) or not _I32_MIN <= v <= _I32_MAX:
            raise _bad(line, field, v, "invalid value: expected an i32", "WL-2")
        return v
    if field == "strict_priority":
        return _as_uint(line, field, v, _U32_MAX)
    raise AssertionError(field)  # pragma: no cover


class JsonObject:
    """A JSON object as decoded for serde: its ``(key, value)`` pairs in text order, repeats kept
    (serde sees every key; only a repeated *field* is an error, WL-2)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


def parse_mooncake_row(raw: Any, line: int | None = None) -> MooncakeRow:
    """WL-1/WL-2: decode one row with upstream's (serde) acceptance rules.

    ``raw`` is a JSON object (a :class:`JsonObject` from :func:`parse_mooncake_line`, or a dict)
    or, as serde also accepts for a struct, a JSON array read positionally in
    :data:`MOONCAKE_FIELDS` order (missing trailing elements are absent fields).  Entries are
    read in order, each checked as it comes: unknown keys are skipped unread; a field given twice
    (under its name or its alias) is a duplicate-field error; a key holding an escaped lone
    surrogate is an error; ``null`` means absent.  ``line`` (1-based) is only used in error messages.
    """
    values: dict[str, Any] = {}
    if isinstance(raw, (JsonObject, Mapping)):
        for key, v in (raw.pairs if isinstance(raw, JsonObject) else raw.items()):
            if isinstance(key, str) and has_lone_surrogate(key):
                raise _bad(line, "row", key, "lone surrogate in hex escape", "WL-2")
            canonical = MOONCAKE_ALIASES.get(key, key)
            if canonical not in MOONCAKE_FIELDS:
                continue
            if canonical in values:
                raise _bad(line, canonical, v, f"duplicate field `{canonical}`", "WL-2")
            values[canonical] = _convert(line, canonical, v)
    elif isinstance(raw, (list, tuple)):
        for field, v in zip(MOONCAKE_FIELDS, raw):
            values[field] = _convert(line, field, v)
        if len(raw) > len(MOONCAKE_FIELDS):
            raise _bad(line, "row", raw, f"invalid length {len(raw)}, expected at most {len(MOONCAKE_FIELDS)} elements", "WL-2")
    else:
        raise _bad(line, "row", raw, "invalid type: expected a JSON object", "WL-2")
    return MooncakeRow(**{k: v for k, v in values.items() if v is not None})


def parse_failure(line: int, source: str | None) -> str:
    """WL-4: upstream's text for a line serde cannot read as a row (a JSON error or a bad value
    alike; trace.rs:192-198), naming the file as it was given when it is known."""
    return f"failed to parse line {line} from {source} as JSON" if source is not None else \
        f"failed to parse line {line} as JSON"


def parse_mooncake_line(text: str, line: int, source: str | None = None) -> MooncakeRow | None:
    """WL-3: parse one text line; ``None`` for a blank (whitespace-only) line.

    JSON is read like serde_json: no NaN/Infinity literals, no out-of-range
    numbers, numbers valued as serde_json values them (WL-2). Any refusal carries upstream's text
    (:func:`parse_failure`, ``source`` being the file's name) with the exact cause as its detail.
    """
    if not text.strip(RUST_WHITESPACE):  # Rust's str::trim (WL-3)
        return None
    try:
        raw = json.loads(
            text,
            object_pairs_hook=JsonObject,
            parse_constant=no_json_constant,
            parse_float=serde_json_number,
            parse_int=serde_json_number,
        )
    except ValueError as exc:  # JSONDecodeError is a ValueError
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise _bad(line, "json", shown, parse_failure(line, source), "WL-3", detail=str(exc)) from None
    try:
        return parse_mooncake_row(raw, line)
    except InvalidInput as exc:  # a bad value is a serde error of the line too
        err = InvalidInput(exc.field, exc.value, parse_failure(line, source), rule=exc.rule, detail=exc.reason)
        err.line = line  # type: ignore[attr-defined]
        raise err from None


# ---------------------------------------------------------------------------
# WL-5..WL-9: rows to sessions
# ---------------------------------------------------------------------------


@attrs.frozen
class TurnTrace:
    """One request of a session (upstream ``TurnTrace``); ``source_line`` is 1-based or None."""

    input_length: int
    max_output_tokens: int
    hash_ids: tuple[int, ...] = attrs.field(converter=tuple)
    delay_after_previous_ms: float = 0.0
    priority: int = 0
    strict_priority: int = 0
    policy_class: str | None = None
    source_line: int | None = attrs.field(default=None, eq=False)


@attrs.frozen
class SessionTrace:
    session_id: str
    first_arrival_timestamp_ms: float | None
    turns: tuple[TurnTrace, ...] = attrs.field(converter=tuple)


@attrs.frozen
class Trace:
    """Sessions in first-appearance order; ``block_size`` is the trace block size."""

    block_size: int
    sessions: tuple[SessionTrace, ...] = attrs.field(converter=tuple)


def trace_from_mooncake_rows(
    rows: Iterable[tuple[int, MooncakeRow | Mapping[str, Any] | None]], trace_block_size: int,
    source: str | None = None,
) -> Trace:
    """WL-5..WL-8: build a :class:`Trace` from ``(line_number, row)`` pairs (WL-5, WL-6, WL-7, WL-8).

    ``row`` may be a :class:`MooncakeRow`, a decoded JSON value (parsed with
    :func:`parse_mooncake_row`) or ``None`` for a skipped blank line.  Line
    numbers are 1-based and count blank lines.
    """
    if isinstance(trace_block_size, bool) or not isinstance(trace_block_size, int) or trace_block_size <= 0:
        raise InvalidInput("trace_block_size", trace_block_size, "trace_block_size must be greater than 0", rule="WL-5")
    sessions: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    last_ts: list[float | None] = []
    replayed_outputs = 0  # the first line that gives output_token_ids

    for line, raw in rows:
        if raw is None:
            continue
        row = raw if isinstance(raw, MooncakeRow) else parse_mooncake_row(raw, line)
        # WL-6: a row without session_id is its own session, named after its line
        session_id = row.session_id if row.session_id is not None else f"request_{line}"
        if row.hash_ids is None:
            raise _bad(line, "hash_ids", None, f"trace line {line} is missing hash_ids", "WL-5")
        capacity = len(row.hash_ids) * trace_block_size
        if capacity > _U64_MAX:
            raise _bad(line, "hash_ids", len(row.hash_ids), f"trace line {line} synthesized capacity overflow", "WL-5")
        # WL-8: clamp to the synthesizable capacity, never reject
        input_length = min(row.input_length if row.input_length is not None else capacity, capacity)
        if row.output_length is None:
            raise _bad(line, "output_length", None, f"trace line {line} is missing output_length", "WL-5")
        if row.output_token_ids is not None:  # the compiled build's output token replay (WL-1)
            if len(row.output_token_ids) != row.output_length:
                raise _bad(line, "output_token_ids", len(row.output_token_ids),
                           f"trace line {line} output_length {row.output_length} does not match output_token_ids "
                           f"length {len(row.output_token_ids)}", "WL-5")
            replayed_outputs = replayed_outputs or line

        if session_id not in index:
            index[session_id] = len(sessions)
            sessions.append({"id": session_id, "first": row.timestamp, "turns": []})
            last_ts.append(row.timestamp)
        si = index[session_id]
        sess = sessions[si]
        if not sess["turns"]:
            delay = row.delay if row.delay is not None else 0.0
            if delay != 0.0:
                raise _bad(line, "delay", row.delay,
                           f"trace line {line} sets delay on the first turn of session {session_id}", "WL-7")
            delay = 0.0
        elif row.delay is not None:
            delay = row.delay
        elif row.timestamp is not None:
            prev = last_ts[si]
            if prev is None:
                raise _bad(line, "timestamp", row.timestamp,
                           f"trace line {line} for session {session_id} cannot infer delay without a previous timestamp",
                           "WL-7")
            delay = row.timestamp - prev
        else:
            delay = 0.0
        if not math.isfinite(delay) or delay < 0.0:
            raise _bad(line, "delay", delay, f"trace line {line} has invalid delay {rust_display(delay)}", "WL-7")

        sess["turns"].append(
            TurnTrace(
                input_length=input_length,
                max_output_tokens=row.output_length,
                hash_ids=row.hash_ids,
                delay_after_previous_ms=delay,
                priority=row.priority if row.priority is not None else 0,
                strict_priority=row.strict_priority if row.strict_priority is not None else 0,
                policy_class=row.policy_class,
                source_line=line,
            )
        )
        if row.timestamp is not None:
            last_ts[si] = row.timestamp

    if not sessions:
        raise InvalidInput("trace", None, "trace file did not contain any requests" if source is None else
                           f"trace file {source} did not contain any requests", rule="WL-5")
    if replayed_outputs:
        raise _bad(replayed_outputs, "output_token_ids", "...",
                   "output token replay (a build feature newer than the pinned source) is not supported by the model",
                   "WL-1")
    return Trace(
        block_size=trace_block_size,
        sessions=tuple(SessionTrace(s["id"], s["first"], tuple(s["turns"])) for s in sessions),
    )


def trace_from_mooncake_lines(lines: Iterable[str], trace_block_size: int) -> Trace:
    """WL-3: :func:`trace_from_mooncake_rows` over text lines numbered from 1.

    Rows are parsed lazily, so an error in an early line is reported before a
    later line is looked at (upstream reads line by line too).
    """

    def rows() -> Iterable[tuple[int, MooncakeRow | None]]:
        for i, text in enumerate(lines, start=1):
            yield i, parse_mooncake_line(text, i)

    return trace_from_mooncake_rows(rows(), trace_block_size)


# ---------------------------------------------------------------------------
# WL-10: tokens
# ---------------------------------------------------------------------------


def synthesize_tokens(turn: TurnTrace, trace_block_size: int) -> tuple[int, ...]:
    """WL-10: each hash id ``h`` becomes ``h mod 2**32`` repeated ``trace_block_size`` times, cut at ``input_length``."""
    if trace_block_size <= 0:
        raise InvalidInput("trace_block_size", trace_block_size, "trace_block_size must be greater than 0", rule="WL-10")
    capacity = len(turn.hash_ids) * trace_block_size
    if capacity < turn.input_length:
        raise InvalidInput(
            "input_length", turn.input_length,
            f"input_length {turn.input_length} exceeds synthesized capacity {capacity}", rule="WL-10",
        )
    # upstream first reserves input_length u32 tokens (trace.rs:57)
    check_reservation("input_length", turn.input_length, turn.input_length, 4, "WL-10")
    out: list[int] = []
    for h in turn.hash_ids:
        # upstream extends a whole block before cutting: a Vec<u32> that would pass isize::MAX
        # bytes panics with "capacity overflow" (trace.rs:134); the model only appends what it keeps
        check_reservation("trace_block_size", trace_block_size, len(out) + trace_block_size, 4, "WL-10")
        out.extend([h & _U32_MAX] * min(trace_block_size, turn.input_length - len(out)))
        if len(out) >= turn.input_length:
            break
    if len(out) != turn.input_length:
        # only reachable with input_length 0 and no hash ids left to stop the loop
        raise InvalidInput(
            "input_length", turn.input_length,
            f"failed to synthesize {turn.input_length} tokens from {len(turn.hash_ids)} hash_ids", rule="WL-10",
        )
    return tuple(out)


def cumulative_session_tokens(session: SessionTrace, trace_block_size: int) -> tuple[tuple[int, ...], ...]:
    """WL-18 (``mooncake-delta``): turn k's prompt is turns 0..k's tokens concatenated."""
    acc: list[int] = []
    out = []
    for turn in session.turns:
        acc.extend(synthesize_tokens(turn, trace_block_size))
        out.append(tuple(acc))
    return tuple(out)


# ---------------------------------------------------------------------------
# WL-11..WL-13: timing and validation
# ---------------------------------------------------------------------------


def normalize_session_starts(trace: Trace) -> Trace:
    """WL-11: subtract the minimum first timestamp (over sessions that have one)."""
    firsts = [s.first_arrival_timestamp_ms for s in trace.sessions if s.first_arrival_timestamp_ms is not None]
    if not firsts:
        return trace
    m = min(firsts, key=total_order_key)
    return attrs.evolve(
        trace,
        sessions=tuple(
            s if s.first_arrival_timestamp_ms is None
            else attrs.evolve(s, first_arrival_timestamp_ms=s.first_arrival_timestamp_ms - m)
            for s in trace.sessions
        ),
    )


def _check_ratio(ratio: float, name: str, rule: str, named: bool = False) -> None:
    """``named``: the text starts with the argument's name (WL-15's, replay/mod.rs:102-106);
    WL-12's starts with ``ratio`` (trace.rs:583)."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio <= 0.0:
        shown = rust_display(ratio) if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) else ratio
        raise InvalidInput(name, ratio, f"{name if named else 'ratio'} must be a finite positive number, got {shown}",
                           rule=rule)


def speed_up_timing(trace: Trace, ratio: float) -> Trace:
    """WL-12: divide every first timestamp and every inter-turn delay by ``ratio``."""
    _check_ratio(ratio, "arrival_speedup_ratio", "WL-12")
    r = float(ratio)
    return attrs.evolve(
        trace,
        sessions=tuple(
            attrs.evolve(
                s,
                first_arrival_timestamp_ms=None if s.first_arrival_timestamp_ms is None
                else s.first_arrival_timestamp_ms / r,
                turns=tuple(attrs.evolve(t, delay_after_previous_ms=t.delay_after_previous_ms / r) for t in s.turns),
            )
            for s in trace.sessions
        ),
    )


def _validate(trace: Trace, allow_missing_first_timestamp: bool) -> None:
    if trace.block_size <= 0:
        raise InvalidInput("trace_block_size", trace.block_size, "block_size must be greater than 0", rule="WL-9")
    if not trace.sessions:
        raise InvalidInput("trace", None, "trace must contain at least one session", rule="WL-9")
    for s in trace.sessions:
        first_line = s.turns[0].source_line if s.turns else None
        if not s.turns:
            raise InvalidInput("session", s.session_id, f"session {s.session_id} must contain at least one turn", rule="WL-9")
        ts = s.first_arrival_timestamp_ms
        if ts is None and not allow_missing_first_timestamp:
            raise _bad(first_line, "timestamp", None,
                       f"trace mode requires first_arrival_timestamp_ms for session {s.session_id}", "WL-9")
        if ts is not None and (not math.isfinite(ts) or ts < 0.0):
            raise _bad(first_line, "timestamp", ts,
                       f"session {s.session_id} has invalid first_arrival_timestamp_ms {rust_display(ts)}", "WL-9")
        for k, t in enumerate(s.turns):
            if t.input_length == 0:
                raise _bad(t.source_line, "input_length", 0,
                           f"session {s.session_id} turn {k} must have a positive input_length", "WL-9")
            if not t.hash_ids:
                raise _bad(t.source_line, "hash_ids", [],
                           f"session {s.session_id} turn {k} must contain at least one hash id", "WL-9")
            cap = len(t.hash_ids) * trace.block_size
            if cap < t.input_length:
                raise _bad(t.source_line, "input_length", t.input_length,
                           f"session {s.session_id} turn {k} input_length {t.input_length} exceeds synthesized capacity {cap}",
                           "WL-9")
            d = t.delay_after_previous_ms
            if not math.isfinite(d) or d < 0.0:
                raise _bad(t.source_line, "delay", d, f"session {s.session_id} turn {k} has invalid delay {rust_display(d)}", "WL-9")
            if k == 0 and d != 0.0:
                raise _bad(t.source_line, "delay", d,
                           f"session {s.session_id} first turn must have delay_after_previous_ms == 0.0", "WL-9")


def validate_for_trace_mode(trace: Trace) -> None:
    """WL-9: every session needs a finite non-negative first timestamp; every turn a prompt."""
    _validate(trace, False)


def validate_for_concurrency_mode(trace: Trace) -> None:
    """WL-9: as :func:`validate_for_trace_mode`, but a missing first timestamp is allowed."""
    _validate(trace, True)


def is_single_turn(trace: Trace) -> bool:
    """WL-14: every session has exactly one turn."""
    return all(len(s.turns) == 1 for s in trace.sessions)


# ---------------------------------------------------------------------------
# WL-13..WL-15: flat requests
# ---------------------------------------------------------------------------


@attrs.frozen
class ReplayRequest:
    """One request handed to the replay (upstream ``DirectRequest``, ``dp_rank`` 0)."""

    uuid: str
    tokens: tuple[int, ...] = attrs.field(converter=tuple, repr=lambda t: f"<{len(t)} tokens>")
    max_output_tokens: int
    arrival_timestamp_ms: float | None = None
    priority: int = 0
    strict_priority: int = 0
    policy_class: str | None = None
    #: DRV-17: the session and turn a request came from, for requests released by the session
    #: workload driver (WL-20: every concurrency-mode trace file); None on the flat path
    session_id: str | None = None
    turn_index: int = 0


def to_single_turn_requests(trace: Trace) -> tuple[ReplayRequest, ...]:
    """WL-13: one request per (single-turn) session, uuid ``i+1`` in session order."""
    out = []
    for i, s in enumerate(trace.sessions):
        if len(s.turns) != 1:
            raise InvalidInput(
                "session", s.session_id,
                f"to_single_turn_requests requires exactly one turn per session, but session {s.session_id} has {len(s.turns)} turns",
                rule="WL-13",
            )
        t = s.turns[0]
        out.append(
            ReplayRequest(
                uuid=uuid_from_int(i + 1),
                tokens=synthesize_tokens(t, trace.block_size),
                max_output_tokens=t.max_output_tokens,
                arrival_timestamp_ms=s.first_arrival_timestamp_ms,
                priority=t.priority,
                strict_priority=t.strict_priority,
                policy_class=t.policy_class,
            )
        )
    return tuple(out)


def normalize_trace_requests(requests: Sequence[ReplayRequest], arrival_speedup_ratio: float) -> tuple[ReplayRequest, ...]:
    """WL-15: stable sort by arrival (IEEE total order), subtract the first, divide by the ratio."""
    _check_ratio(arrival_speedup_ratio, "arrival_speedup_ratio", "WL-15", named=True)
    for r in requests:
        if r.arrival_timestamp_ms is None:
            raise InvalidInput("arrival_timestamp_ms", None,
                               "trace replay requests must have an arrival timestamp", rule="WL-15")
    ordered = sorted(requests, key=lambda r: total_order_key(r.arrival_timestamp_ms))  # stable
    if not ordered:
        raise InvalidInput("requests", (), "trace replay requires at least one timestamped request", rule="WL-15")
    first = ordered[0].arrival_timestamp_ms
    ratio = float(arrival_speedup_ratio)
    return tuple(attrs.evolve(r, arrival_timestamp_ms=(r.arrival_timestamp_ms - first) / ratio) for r in ordered)


@attrs.frozen
class FlatWorkload:
    """WL-14: the flat request path; requests in replay (arrival) order."""

    requests: tuple[ReplayRequest, ...] = attrs.field(converter=tuple)


@attrs.frozen
class SessionWorkload:
    """WL-14: the session path, run by a workload driver (multi-turn traces, synthetic workloads)."""

    trace: Trace
    #: ``mooncake-delta``: turn prompts accumulate per session (WL-18)
    accumulate_deltas: bool = False


def canonical_trace_format(trace_format: str) -> str:
    """WL-19: the binding's names (``mooncake_delta`` spells ``mooncake-delta``); the agentic
    formats exist upstream but are not modelled; anything else is refused with the binding's text."""
    if trace_format in ("mooncake", "mooncake-delta"):
        return trace_format
    if trace_format == "mooncake_delta":
        return "mooncake-delta"
    if trace_format in ("agentic_mooncake", "agentic-mooncake", "applied_compute_agentic"):
        raise InvalidInput("trace_format", trace_format,
                           "only 'mooncake' and 'mooncake-delta' are modelled", rule="WL-19")
    raise InvalidInput("trace_format", trace_format,
                       "trace_format must be 'mooncake', 'mooncake-delta', 'agentic_mooncake'/'agentic-mooncake', "
                       f"or 'applied_compute_agentic', got '{trace_format}'", rule="WL-19")


def load_trace_workload(
    rows: Iterable[tuple[int, MooncakeRow | Mapping[str, Any] | None]],
    trace_block_size: int = DEFAULT_TRACE_BLOCK_SIZE,
    arrival_speedup_ratio: float = 1.0,
    trace_format: str = "mooncake",
    *,
    validate_sessions: bool = True,
    source: str | None = None,
) -> FlatWorkload | SessionWorkload:
    """WL-14: the offline (non-concurrency) trace-file pipeline for ``mooncake`` / ``mooncake-delta``.

    Order of checks as upstream: parse every row, normalize, speed up (ratio
    check), then validate.  Single-turn traces give a :class:`FlatWorkload`
    (request ``i`` of the file gets uuid ``i+1``), others a :class:`SessionWorkload`;
    ``validate_sessions`` False is the disaggregated replay's session path (WL-9).
    """
    trace_format = canonical_trace_format(trace_format)
    trace = speed_up_timing(normalize_session_starts(trace_from_mooncake_rows(rows, trace_block_size, source)),
                            arrival_speedup_ratio)
    return workload_from_trace(trace, trace_format, validate_sessions=validate_sessions)


def workload_from_trace(trace: Trace, trace_format: str = "mooncake", *,
                        validate_sessions: bool = True) -> FlatWorkload | SessionWorkload:
    """WL-14, WL-9: validate a (normalized, sped-up) mooncake trace and choose its replay path.

    Single-turn traces become a :class:`FlatWorkload`, stably sorted with
    :func:`normalize_trace_requests` at ratio 1, and are always validated first; any multi-turn
    session keeps the whole trace on the session path, validated unless ``validate_sessions`` is
    False: upstream's disaggregated trace replay builds its session driver without the check
    (replay/offline/entrypoints.rs:545, where the aggregated runtimes go through
    ``into_trace_driver_with_block_size``, 642-646 and 772-776).
    """
    if is_single_turn(trace):
        validate_for_trace_mode(trace)
        return FlatWorkload(normalize_trace_requests(to_single_turn_requests(trace), 1.0))
    if validate_sessions:
        validate_for_trace_mode(trace)
    return SessionWorkload(trace, accumulate_deltas=trace_format == "mooncake-delta")


def load_concurrency_trace_workload(
    rows: Iterable[tuple[int, MooncakeRow | Mapping[str, Any] | None]],
    trace_block_size: int = DEFAULT_TRACE_BLOCK_SIZE,
    *,
    validate: bool = True,
    accumulate_deltas: bool = False,
    source: str | None = None,
) -> FlatWorkload | SessionWorkload:
    """WL-20: a ``mooncake`` trace file replayed with ``replay_concurrency`` (closed loop).

    Upstream runs it through the concurrency workload driver: no normalization, no speed-up (the
    ratio is ignored), timestamps optional, and sessions released in **file order** (their first
    line), not sorted by timestamp.  The aggregated runtimes validate first (WL-9, a missing
    timestamp allowed); the disaggregated one does not (``validate=False``).  Single-turn or not,
    the trace is a :class:`SessionWorkload` for that driver (DRV-17), as upstream's always is.
    """
    trace = trace_from_mooncake_rows(rows, trace_block_size, source)
    if validate:
        validate_for_concurrency_mode(trace)
    return SessionWorkload(trace, accumulate_deltas=accumulate_deltas)


# ---------------------------------------------------------------------------
# WL-16..WL-17: synthetic inputs
# ---------------------------------------------------------------------------

#: WL-17: seed of upstream's synthetic RNG (only draws prefix-group ids; see there)
SYNTHETIC_SEED = 42
#: WL-17: high bits of a shared-prefix hash id (``| group << 32 | block_idx``)
SYNTHETIC_PREFIX_TAG = 0xD00D_0000_0000_0000
_M64 = _U64_MAX


def synthetic_token_id(request_idx: int, token_idx: int) -> int:
    """WL-16: splitmix64 finalizer of ``(request_idx << 32) ^ token_idx``, low 32 bits, 0 -> 1."""
    v = (((request_idx << 32) ^ token_idx) + 0x9E37_79B9_7F4A_7C15) & _M64
    v ^= v >> 30
    v = (v * 0xBF58_476D_1CE4_E5B9) & _M64
    v ^= v >> 27
    v = (v * 0x94D0_49BB_1331_11EB) & _M64
    v ^= v >> 31
    token = v & _U32_MAX
    return token if token != 0 else 1


def _check_count(name: str, v: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidInput(name, v, f"{name} must be at least 1", rule="WL-16")


def _check_nonneg(name: str, v: float, rule: str, quote: bool = False) -> None:
    """``quote``: the text ends with the value in Rust's display (the flat synthetic path's,
    binding:1776-1781; WL-17's quotes nothing)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0.0:
        shown = f", got {rust_display(float(v))}" if quote and isinstance(v, (int, float)) and not isinstance(v, bool) else ""
        raise InvalidInput(name, v, f"{name} must be a finite non-negative number{shown}", rule=rule)


def synthetic_requests(
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    arrival_interval_ms: float,
    include_arrival_timestamps: bool = True,
) -> tuple[ReplayRequest, ...]:
    """WL-16: the flat synthetic requests; uuid ``i+1``, arrival ``i * interval`` (or None)."""
    _check_count("input_tokens", input_tokens)
    _check_count("output_tokens", output_tokens)
    _check_count("request_count", request_count)
    _check_nonneg("arrival_interval_ms", arrival_interval_ms, "WL-16", quote=True)
    # the binding reserves the request list (128-byte entries, measured against the compiled
    # build), then each prompt of u32 tokens, up front (replay.rs:1783-1787)
    check_reservation("request_count", request_count, request_count, 128, "WL-16")
    check_reservation("input_tokens", input_tokens, input_tokens, 4, "WL-16")
    interval = float(arrival_interval_ms)
    return tuple(
        ReplayRequest(
            uuid=uuid_from_int(i + 1),
            tokens=tuple(synthetic_token_id(i, j) for j in range(input_tokens)),
            max_output_tokens=output_tokens,
            arrival_timestamp_ms=float(i) * interval if include_arrival_timestamps else None,
        )
        for i in range(request_count)
    )


def _round_half_away(x: float) -> int:
    whole = math.floor(x)
    return int(whole) + (1 if x - whole >= 0.5 else 0)


def synthetic_workload(
    block_size: int,
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    arrival_interval_ms: float = 1.0,
    turns_per_session: int = 1,
    shared_prefix_ratio: float = 0.0,
    num_prefix_groups: int = 0,
    inter_turn_delay_ms: float = 0.0,
) -> Trace:
    """WL-17: upstream ``build_synthetic_workload`` + ``Trace::synthetic`` (seed 42).

    ``request_count`` sessions of ``turns_per_session`` turns.  Session ``k``
    starts at the sequential sum of ``k`` gaps of ``1000 / (1000 / interval)``
    (all 0 for a zero interval).  Each turn has ``ceil(input_tokens /
    block_size)`` hash ids: the first ``min(n, round_half_away(n * ratio))`` are
    the shared prefix ``TAG | group << 32 | block_idx`` when prefix groups are on
    (``num_prefix_groups > 0`` and ``ratio > 0``), the rest come from one global
    counter starting at 1.  Abstraction: upstream draws each session's group
    from a ChaCha12 RNG; the group only sets bits 32..63 of the hash id, which
    the token expansion (``h mod 2**32``, WL-10) discards, so every group yields
    the same tokens.  The model uses group 0 for every session: hash ids may
    differ from upstream's in those bits; tokens, block hashes and therefore
    every scheduling outcome are identical.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise InvalidInput("block_size", block_size, "block_size must be greater than 0", rule="WL-17")
    _check_count("input_tokens", input_tokens)
    _check_count("output_tokens", output_tokens)
    _check_count("request_count", request_count)
    _check_count("turns_per_session", turns_per_session)
    _check_nonneg("arrival_interval_ms", arrival_interval_ms, "WL-17")
    _check_nonneg("inter_turn_delay_ms", inter_turn_delay_ms, "WL-17")
    if isinstance(shared_prefix_ratio, bool) or not isinstance(shared_prefix_ratio, (int, float)) \
            or not 0.0 <= shared_prefix_ratio <= 1.0:
        raise InvalidInput("shared_prefix_ratio", shared_prefix_ratio,
                           "shared_prefix_ratio must be between 0.0 and 1.0, got "
                           f"{rust_display(float(shared_prefix_ratio))}", rule="WL-17")
    if isinstance(num_prefix_groups, bool) or not isinstance(num_prefix_groups, int) or num_prefix_groups < 0:
        raise InvalidInput("num_prefix_groups", num_prefix_groups, "must be a non-negative integer", rule="WL-17")

    # Trace::synthetic reserves the session list (64-byte SessionTrace entries), then the
    # binding's qps of 1000 / interval must be finite (loadgen/trace.rs:484-486, 1196-1202)
    check_reservation("request_count", request_count, request_count, 64, "WL-17")
    interval = float(arrival_interval_ms)
    if interval != 0.0 and math.isinf(1000.0 / interval):
        raise InvalidInput("arrival_interval_ms", arrival_interval_ms,
                           "qps must be a finite positive number, got inf", rule="WL-17")
    gap = 0.0 if interval == 0.0 else 1000.0 / (1000.0 / interval)
    grouped = num_prefix_groups > 0 and shared_prefix_ratio > 0.0
    group = 0  # see the abstraction note above
    delay = float(inter_turn_delay_ms)

    sessions = []
    next_arrival = 0.0
    next_unique = 1
    for k in range(request_count):
        if k > 0:
            next_arrival += gap
        first = 0.0 if k == 0 else next_arrival
        turns = []
        for turn_idx in range(turns_per_session):
            num_blocks = -(-input_tokens // block_size)
            prefix_blocks = min(_round_half_away(float(num_blocks) * float(shared_prefix_ratio)), num_blocks)
            hash_ids: list[int] = []
            if grouped:
                hash_ids.extend(SYNTHETIC_PREFIX_TAG | (group << 32) | b for b in range(prefix_blocks))
            while len(hash_ids) < num_blocks:
                hash_ids.append(next_unique)
                next_unique += 1
            turns.append(
                TurnTrace(
                    input_length=input_tokens,
                    max_output_tokens=output_tokens,
                    hash_ids=tuple(hash_ids),
                    delay_after_previous_ms=0.0 if turn_idx == 0 else delay,
                )
            )
        sessions.append(SessionTrace(f"session_{k}", first, tuple(turns)))
    return Trace(block_size=block_size, sessions=tuple(sessions))


def synthetic_replay_workload(
    engine_block_size: int,
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    arrival_interval_ms: float = 1.0,
    turns_per_session: int = 1,
    shared_prefix_ratio: float = 0.0,
    num_prefix_groups: int = 0,
    inter_turn_delay_ms: float = 0.0,
    arrival_speedup_ratio: float = 1.0,
    replay_concurrency: int | None = None,
    *,
    normalize: bool = True,
) -> FlatWorkload | SessionWorkload:
    """WL-16/WL-17: what ``run_mocker_synthetic_trace_replay`` replays (offline).

    ``engine_block_size`` is the aggregated engine's block size, or the prefill
    engine's in disaggregated mode (floored at 1).  The workload path is taken
    when ``turns_per_session > 1``, ``shared_prefix_ratio > 0``,
    ``num_prefix_groups > 0`` or ``inter_turn_delay_ms > 0``; timing is sped up
    unless ``replay_concurrency`` is set.  The flat path normalizes arrivals with
    the real ratio (WL-15); in concurrency mode its arrivals stay None. Upstream normalizes them
    only after its mode checks (DRV-1); ``normalize=False`` leaves that step (and so the ratio's
    check) to the caller, :func:`normalize_trace_requests`.
    """
    if replay_concurrency is not None and (
        isinstance(replay_concurrency, bool) or not isinstance(replay_concurrency, int) or replay_concurrency < 1
    ):
        raise InvalidInput("replay_concurrency", replay_concurrency, "replay_concurrency must be at least 1", rule="WL-16")
    use_workload = (
        turns_per_session > 1 or shared_prefix_ratio > 0.0 or num_prefix_groups > 0 or inter_turn_delay_ms > 0.0
    )
    if use_workload:
        trace = synthetic_workload(
            max(engine_block_size, 1), input_tokens, output_tokens, request_count, arrival_interval_ms,
            turns_per_session, shared_prefix_ratio, num_prefix_groups, inter_turn_delay_ms,
        )
        if replay_concurrency is None:
            trace = speed_up_timing(trace, arrival_speedup_ratio)
        return SessionWorkload(trace)
    reqs = synthetic_requests(input_tokens, output_tokens, request_count, arrival_interval_ms,
                              include_arrival_timestamps=replay_concurrency is None)
    if replay_concurrency is None and normalize:
        reqs = normalize_trace_requests(reqs, arrival_speedup_ratio)
    return FlatWorkload(reqs)
