"""Step traces: the operations one engine core ran and the effects it observed (spec/step-trace.md).

A step trace is JSONL: a header line (engine arguments, worker role, model version), then one
line per step -- an operation on the core (one of the seven commands, a pass at ``now_ms``, a
hidden pass, a standalone retry) with its input, and the effects the engine observed.  This
module reads and validates traces (STEP-1..STEP-9), encodes model values in the trace's JSON
shapes (STEP-10..STEP-13), replays a trace on the model and reports the first divergence
(STEP-14..STEP-18), and records the model's own effects for a list of operations (STEP-19), which
is how conformance vectors are written (harness counterexamples carry the engine's effects, HARN-6).

Everything here is a function of its arguments except :func:`read_trace` and
:func:`write_trace`, which touch files.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import attrs

from model import core as C
from model.engine_args import EngineArgs, engine_args_from_json
from model.errors import InternalInvariantBroken, InvalidInput, ModelError
from model.rustlib import fields_once, no_json_constant
from model.kv_events import KvCacheEvent, KvRemoved, KvStored
from model.protocol import (
    ActivateDestination,
    Applied,
    CancelDestination,
    CancelSource,
    DestinationAccepted,
    DestinationReserved,
    DirectRequest,
    Noop,
    ReleaseSource,
    ReserveDestination,
    SourceHeld,
    Submit,
    Submitted,
    SubmitHandoffPrefill,
)

FORMAT = "mocker-spec/step-trace"
VERSION = 1
#: STEP-3: the scheduler version this model specifies
MODEL_VERSION = "1.3.0"

#: STEP-5: the seven commands, in upstream's declaration order, then the three driver operations
COMMAND_OPS = (
    "submit",
    "submit_prefill",
    "release_source",
    "cancel_source",
    "reserve_destination",
    "activate_destination",
    "cancel_destination",
)
DRIVER_OPS = ("pass", "hidden_pass", "retry")
OPS = COMMAND_OPS + DRIVER_OPS

#: STEP-7: the effect fields each kind of operation may record
COMMAND_EFFECTS = ("result", "error", "error_message", "lifecycle_events", "kv_events")
PASS_EFFECTS = (
    "error",
    "error_message",
    "end_ms",
    "token_ms",
    "completed_requests",
    "admissions",
    "output_signals",
    "lifecycle_events",
    "kv_events",
    "metrics",
    "fpm",
    "accept_length",
    "router_event_visibility",
)
RETRY_EFFECTS = ("error", "error_message", "lifecycle_events", "kv_events")

#: STEP-14: the order in which the fields of one step are compared
COMPARE_ORDER = (
    "lifecycle_events",
    "admissions",
    "output_signals",
    "completed_requests",
    "end_ms",
    "token_ms",
    "kv_events",
    "metrics",
    "fpm",
    "accept_length",
    "router_event_visibility",
)

_HEADER_KEYS = {"format", "version", "model_version", "engine_args", "worker_role", "dp_rank", "capture_kv_events",
                "recorded_by", "name", "description", "meta"}
_STEP_KEYS = {"step", "op", "request", "handoff_id", "allow_destination_admission", "now_ms", "effects", "note"}
_REQUEST_KEYS = {"uuid", "tokens", "max_output_tokens", "dp_rank", "arrival_timestamp_ms"}


class BadTrace(Exception):
    """STEP-9: the trace is malformed; the message is one line naming the line, field and value."""


# ---------------------------------------------------------------------------------------------
# parsed traces
# ---------------------------------------------------------------------------------------------


@attrs.frozen
class Header:
    """STEP-2: the header line, validated."""

    engine_args: Dict[str, Any]
    args: EngineArgs
    worker_role: str
    dp_rank: int = 0
    capture_kv_events: bool = False
    recorded_by: Optional[str] = None
    name: Optional[str] = None
    raw: Dict[str, Any] = attrs.field(factory=dict, eq=False, repr=False)


@attrs.frozen
class Step:
    """STEP-4: one step: its number, the line it came from, the operation and the observed effects."""

    number: int
    line: int
    op: str
    command: Any = None
    allow_destination_admission: bool = True
    now_ms: Optional[float] = None
    effects: Dict[str, Any] = attrs.field(factory=dict)
    raw: Dict[str, Any] = attrs.field(factory=dict, eq=False, repr=False)

    def label(self) -> str:
        """A short human label: ``submit r1``, ``pass at 12.5 ms``, ``retry``."""
        if self.op in ("pass", "hidden_pass"):
            return f"{self.op} at {self.now_ms!r} ms"
        if self.op == "retry":
            return "retry"
        parts = []
        h = getattr(self.command, "handoff_id", None)
        if h is not None:
            parts.append(h.value)
        req = getattr(self.command, "request", None)
        if req is not None:
            parts.append("?" if req.uuid is None else req.uuid.value)
        return f"{self.op}({', '.join(parts)})"


@attrs.frozen
class Trace:
    header: Header
    steps: Tuple[Step, ...]


# ---------------------------------------------------------------------------------------------
# parsing (STEP-1..STEP-9)
# ---------------------------------------------------------------------------------------------


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, sort_keys=False, allow_nan=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bad(line: int, field: str, value: Any, reason: str) -> BadTrace:
    return BadTrace(f"line {line}: {field}={_short(value)}: {reason}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _parse_header(obj: Any, line: int) -> Header:
    """STEP-2 / STEP-3."""
    if not isinstance(obj, dict):
        raise _bad(line, "header", obj, "the first line must be a JSON object (the header)")
    unknown = sorted(set(obj) - _HEADER_KEYS)
    if unknown:
        raise _bad(line, f"header.{unknown[0]}", obj[unknown[0]], "unknown header field")
    if obj.get("format") != FORMAT:
        raise _bad(line, "header.format", obj.get("format"), f"must be {FORMAT!r}")
    if obj.get("version") != VERSION:
        raise _bad(line, "header.version", obj.get("version"), f"must be {VERSION}")
    if obj.get("model_version") != MODEL_VERSION:
        raise _bad(line, "header.model_version", obj.get("model_version"),
                   f"this model specifies dynamo-mocker {MODEL_VERSION}")
    raw_args = obj.get("engine_args")
    if not isinstance(raw_args, dict):
        raise _bad(line, "header.engine_args", raw_args, "must be an engine-args JSON object")
    try:
        args = engine_args_from_json(raw_args)
    except InvalidInput as exc:
        raise _bad(line, f"header.engine_args.{exc.field}", exc.value, exc.reason) from None
    role = obj.get("worker_role")
    if role not in ("aggregated", "prefill", "decode"):
        raise _bad(line, "header.worker_role", role, "must be aggregated, prefill or decode")
    if role != args.worker_type.value:
        raise _bad(line, "header.worker_role", role,
                   f"disagrees with the engine args, whose worker type is {args.worker_type.value!r}")
    dp_rank = obj.get("dp_rank", 0)
    if not _is_int(dp_rank) or dp_rank < 0:
        raise _bad(line, "header.dp_rank", dp_rank, "must be an integer >= 0")
    capture = obj.get("capture_kv_events", False)
    if not isinstance(capture, bool):
        raise _bad(line, "header.capture_kv_events", capture, "must be true or false")
    for key in ("recorded_by", "name", "description"):
        if key in obj and obj[key] is not None and not isinstance(obj[key], str):
            raise _bad(line, f"header.{key}", obj[key], "must be a string")
    if "meta" in obj and not isinstance(obj["meta"], dict):
        raise _bad(line, "header.meta", obj["meta"], "must be an object")
    return Header(dict(raw_args), args, role, dp_rank, capture, obj.get("recorded_by"), obj.get("name"), dict(obj))


def _parse_request(value: Any, line: int) -> DirectRequest:
    """STEP-6: a request object."""
    if not isinstance(value, dict):
        raise _bad(line, "request", value, "must be an object")
    unknown = sorted(set(value) - _REQUEST_KEYS)
    if unknown:
        raise _bad(line, f"request.{unknown[0]}", value[unknown[0]], "unknown request field")
    if "uuid" not in value:  # required, though it may be null (step-trace.schema.json)
        raise _bad(line, "request.uuid", None, "missing (give a non-empty string or null)")
    uuid = value["uuid"]
    if uuid is not None and (not isinstance(uuid, str) or not uuid):
        raise _bad(line, "request.uuid", uuid, "must be a non-empty string or null")
    tokens = value.get("tokens")
    if not isinstance(tokens, list) or not all(_is_int(t) and 0 <= t < 2**32 for t in tokens):
        raise _bad(line, "request.tokens", tokens, "must be a list of u32 integers")
    mot = value.get("max_output_tokens")
    if not _is_int(mot) or mot < 0:
        raise _bad(line, "request.max_output_tokens", mot, "must be an integer >= 0")
    dp = value.get("dp_rank", 0)
    if not _is_int(dp) or dp < 0:
        raise _bad(line, "request.dp_rank", dp, "must be an integer >= 0")
    arrival = value.get("arrival_timestamp_ms")
    if arrival is not None and (not _is_number(arrival) or not math.isfinite(arrival)):
        raise _bad(line, "request.arrival_timestamp_ms", arrival, "must be a finite number or null")
    return DirectRequest(tuple(tokens), mot, uuid, dp, None if arrival is None else float(arrival))


def _parse_handoff(obj: Dict[str, Any], line: int) -> str:
    h = obj.get("handoff_id")
    if not isinstance(h, str) or not h:
        raise _bad(line, "handoff_id", h, "must be a non-empty string")
    return h


def _allowed_effects(op: str) -> Tuple[str, ...]:
    if op in COMMAND_OPS:
        return COMMAND_EFFECTS
    if op == "retry":
        return RETRY_EFFECTS
    return PASS_EFFECTS


def _parse_step(obj: Any, line: int, expected_number: int) -> Step:
    """STEP-4..STEP-7."""
    if not isinstance(obj, dict):
        raise _bad(line, "step", obj, "a step line must be a JSON object")
    unknown = sorted(set(obj) - _STEP_KEYS)
    if unknown:
        raise _bad(line, unknown[0], obj[unknown[0]], "unknown step field")
    number = obj.get("step")
    if number != expected_number or not _is_int(number):
        raise _bad(line, "step", number, f"steps are numbered 1, 2, 3, ... (expected {expected_number})")
    op = obj.get("op")
    if op not in OPS:
        raise _bad(line, "op", op, f"unknown operation (one of {', '.join(OPS)})")
    allow = obj.get("allow_destination_admission", True)
    if not isinstance(allow, bool):
        raise _bad(line, "allow_destination_admission", allow, "must be true or false")
    if op not in COMMAND_OPS and "allow_destination_admission" in obj:
        raise _bad(line, "allow_destination_admission", allow, f"only commands take it, not {op}")
    takes_request = op in ("submit", "submit_prefill", "reserve_destination")
    takes_handoff = op in COMMAND_OPS and op != "submit"
    if not takes_request and "request" in obj:
        raise _bad(line, "request", obj["request"], f"{op} takes no request")
    if not takes_handoff and "handoff_id" in obj:
        raise _bad(line, "handoff_id", obj["handoff_id"], f"{op} takes no handoff id")
    now_ms = obj.get("now_ms")
    if op in ("pass", "hidden_pass"):
        if not _is_number(now_ms) or not math.isfinite(now_ms) or now_ms < 0:
            raise _bad(line, "now_ms", now_ms, f"a {op} needs a finite now_ms >= 0")
        now_ms = float(now_ms)
    elif op == "retry":
        if now_ms is not None and (not _is_number(now_ms) or not math.isfinite(now_ms) or now_ms < 0):
            raise _bad(line, "now_ms", now_ms, "must be a finite number >= 0 or null")
        now_ms = None if now_ms is None else float(now_ms)
    elif "now_ms" in obj:
        raise _bad(line, "now_ms", now_ms, f"{op} takes no now_ms")
    command = None
    if op in COMMAND_OPS:
        req = _parse_request(obj.get("request"), line) if takes_request else None
        h = _parse_handoff(obj, line) if takes_handoff else None
        command = {
            "submit": lambda: Submit(req),
            "submit_prefill": lambda: SubmitHandoffPrefill(h, req),
            "release_source": lambda: ReleaseSource(h),
            "cancel_source": lambda: CancelSource(h),
            "reserve_destination": lambda: ReserveDestination(h, req),
            "activate_destination": lambda: ActivateDestination(h),
            "cancel_destination": lambda: CancelDestination(h),
        }[op]()
    effects = obj.get("effects", {})
    if not isinstance(effects, dict):
        raise _bad(line, "effects", effects, "must be an object")
    allowed = _allowed_effects(op)
    for key in effects:
        if key not in allowed:
            raise _bad(line, f"effects.{key}", effects[key], f"not an effect of {op} (one of {', '.join(allowed)})")
    if "result" in effects and "error" in effects:
        raise _bad(line, "effects.error", effects["error"], "a step has a result or an error, not both")
    if "error" in effects and (not isinstance(effects["error"], str) or not effects["error"]):
        raise _bad(line, "effects.error", effects["error"], "must be the error kind, a non-empty string")
    return Step(number, line, op, command, allow, now_ms, dict(effects), dict(obj))


def parse_header(obj: Any, line: int = 1) -> Header:
    """STEP-2 / STEP-3: validate one header object (``line`` names it in errors)."""
    return _parse_header(obj, line)


def parse_step(obj: Any, line: int, expected_number: int) -> Step:
    """STEP-4..STEP-7: validate one step object, which must be step ``expected_number``."""
    return _parse_step(obj, line, expected_number)


def parse_trace_objects(objs: Sequence[Tuple[int, Any]]) -> Trace:
    """STEP-1: ``(line number, decoded JSON)`` pairs -> a validated :class:`Trace`."""
    if not objs:
        raise BadTrace("line 1: header=None: the trace is empty (it needs a header line)")
    header = _parse_header(objs[0][1], objs[0][0])
    steps = []
    for n, (line, obj) in enumerate(objs[1:], start=1):
        steps.append(_parse_step(obj, line, n))
    return Trace(header, tuple(steps))


class _TwiceGiven(ValueError):
    pass


#: STEP-1: every key once per object (``json`` would keep the last one without a word)
_FIELDS_ONCE = fields_once(_TwiceGiven)


def parse_trace_text(text: str) -> Trace:
    """STEP-1: JSONL text -> :class:`Trace`; blank lines are skipped."""
    objs = []
    for i, raw in enumerate(text.split("\n"), start=1):
        s = raw.strip()
        if not s:
            continue
        try:
            objs.append((i, json.loads(s, parse_constant=no_json_constant,  # STEP-1
                                          object_pairs_hook=_FIELDS_ONCE)))
        except _TwiceGiven as exc:
            raise BadTrace(f"line {i}: key {exc.args[0]!r} is given twice in one object") from None
        except ValueError as exc:
            raise BadTrace(f"line {i}: json={_short(s, 60)}: not valid JSON ({getattr(exc, 'msg', exc)})") from None
    return parse_trace_objects(objs)


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """STEP-1: read and validate a trace file (:class:`BadTrace` on any problem)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise BadTrace(f"line 0: trace={str(path)!r}: cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise BadTrace(f"line {line}: trace={str(path)!r}: not UTF-8") from None
    return parse_trace_text(text)


# ---------------------------------------------------------------------------------------------
# encoding model values (STEP-10..STEP-13)
# ---------------------------------------------------------------------------------------------


def encode_request(req: DirectRequest) -> Dict[str, Any]:
    """STEP-6: a request as a trace object (defaults of ``dp_rank`` and the arrival left out)."""
    out: Dict[str, Any] = {
        "uuid": None if req.uuid is None else req.uuid.value,
        "tokens": list(req.tokens),
        "max_output_tokens": req.max_output_tokens,
    }
    if req.dp_rank:
        out["dp_rank"] = req.dp_rank
    if req.arrival_timestamp_ms is not None:
        out["arrival_timestamp_ms"] = req.arrival_timestamp_ms
    return out


def encode_command(command) -> Dict[str, Any]:
    """STEP-5: the op name and inputs of a protocol command."""
    for op, cls in zip(COMMAND_OPS, (Submit, SubmitHandoffPrefill, ReleaseSource, CancelSource, ReserveDestination,
                                     ActivateDestination, CancelDestination)):
        if isinstance(command, cls):
            out: Dict[str, Any] = {"op": op}
            h = getattr(command, "handoff_id", None)
            if h is not None:
                out["handoff_id"] = h.value
            req = getattr(command, "request", None)
            if req is not None:
                out["request"] = encode_request(req)
            return out
    raise TypeError(f"not a protocol command: {command!r}")


def encode_result(result) -> Dict[str, Any]:
    """STEP-10: a command result."""
    if isinstance(result, Submitted):
        return {"kind": "submitted", "request_id": result.request_id.value}
    if isinstance(result, DestinationAccepted):
        return {"kind": "destination_accepted", "request_id": result.request_id.value}
    if isinstance(result, Applied):
        return {"kind": "applied"}
    if isinstance(result, Noop):
        return {"kind": "noop"}
    raise TypeError(f"not a command result: {result!r}")


def encode_lifecycle(event) -> Dict[str, Any]:
    """STEP-11: a lifecycle event."""
    if isinstance(event, SourceHeld):
        t = event.transfer_timing
        timing = None if t is None else {
            "mode": t.mode.value,
            "full_prompt_tokens": t.full_prompt_tokens,
            "kv_bytes_per_token": t.kv_bytes_per_token,
            "bandwidth_gb_s": t.bandwidth_gb_s,
        }
        return {"kind": "source_held", "handoff_id": event.handoff_id.value, "request_id": event.request_id.value,
                "transfer_timing": timing}
    if isinstance(event, DestinationReserved):
        return {"kind": "destination_reserved", "handoff_id": event.handoff_id.value,
                "request_id": event.request_id.value, "transferable_prompt_tokens": event.transferable_prompt_tokens}
    raise TypeError(f"not a lifecycle event: {event!r}")


def encode_kv_event(event: KvCacheEvent) -> Dict[str, Any]:
    """STEP-12: a KV cache event."""
    data = event.data
    out: Dict[str, Any] = {"event_id": event.event_id, "dp_rank": event.dp_rank}
    if isinstance(data, KvStored):
        out.update(kind="stored", parent_hash=data.parent_hash,
                   blocks=[{"block_hash": b.block_hash, "tokens_hash": b.tokens_hash} for b in data.blocks],
                   token_ids=None if data.token_ids is None else [list(t) for t in data.token_ids])
    elif isinstance(data, KvRemoved):
        out.update(kind="removed", block_hashes=list(data.block_hashes))
    else:  # pragma: no cover - the two kinds are exhaustive
        raise TypeError(f"not a KV event: {event!r}")
    return out


def _asdict(value) -> Optional[Dict[str, Any]]:
    return None if value is None else attrs.asdict(value, recurse=False)


def encode_pass(res) -> Dict[str, Any]:
    """STEP-13: every effect of a pass (``PassResult``, CORE-3)."""
    return {
        "end_ms": res.end_ms,
        "token_ms": res.token_ms,
        "completed_requests": res.completed_requests,
        "admissions": [{"uuid": a.uuid.value, "reused_input_tokens": a.reused_input_tokens} for a in res.admissions],
        "output_signals": [
            {"uuid": s.uuid.value, "completed": s.completed, "rejected": s.rejected,
             "handoff_delay_ms": s.handoff_delay_ms}
            for s in res.output_signals
        ],
        "lifecycle_events": [encode_lifecycle(e) for e in res.lifecycle_events],
        "kv_events": [encode_kv_event(e) for e in res.kv_events],
        "metrics": _asdict(res.metrics),
        "fpm": _asdict(res.fpm),
        "accept_length": [res.accept_length_output_tokens, res.accept_length_decode_forwards],
        "router_event_visibility": res.router_event_visibility,
    }


# ---------------------------------------------------------------------------------------------
# running one operation on the model (STEP-5, STEP-8)
# ---------------------------------------------------------------------------------------------


def new_model_core(header: Header):
    """STEP-2: the empty model core a trace starts from."""
    return C.new_core(header.args, dp_rank=header.dp_rank, capture_kv_events=header.capture_kv_events)


def run_step(core, step: Step):
    """STEP-5 / STEP-8: run one operation on the model; ``(new core or None, effects)``.

    A rejected command returns the input core and ``{"error": kind, "error_message": text}``;
    an ``InternalInvariantBroken`` (an upstream panic) returns ``None`` as the core.
    """
    try:
        if step.op in COMMAND_OPS:
            new, eff = C.apply_command_effects(core, step.command, step.allow_destination_admission)
            return new, {
                "result": encode_result(eff.result),
                "lifecycle_events": [encode_lifecycle(e) for e in eff.lifecycle_events],
                "kv_events": [encode_kv_event(e) for e in eff.kv_events],
            }
        if step.op == "pass":
            new, res = C.execute_pass(core, step.now_ms)
            return new, encode_pass(res)
        if step.op == "hidden_pass":
            new, res = C.execute_hidden_pass(core, step.now_ms)
            return new, encode_pass(res)
        new, eff = C.retry_pending_destinations(core, step.now_ms)
        return new, {
            "lifecycle_events": [encode_lifecycle(e) for e in eff.lifecycle_events],
            "kv_events": [encode_kv_event(e) for e in eff.kv_events],
        }
    except InternalInvariantBroken as err:
        return None, {"error": "InternalInvariantBroken", "error_message": err.message}
    except ModelError as err:
        return core, {"error": type(err).__name__, "error_message": err.message}


# ---------------------------------------------------------------------------------------------
# comparison (STEP-14, STEP-15)
# ---------------------------------------------------------------------------------------------


@attrs.frozen
class Mismatch:
    """The first differing field of one step: a path such as ``output_signals[1].completed``."""

    field: str
    expected: Any
    observed: Any


_ABSENT = "(absent)"


def _num_equal(a, b, rel_tol: float) -> bool:
    fa, fb = float(a), float(b)
    if fa == fb:
        return True
    if math.isnan(fa) or math.isnan(fb):
        return math.isnan(fa) and math.isnan(fb)
    return rel_tol > 0 and abs(fa - fb) <= rel_tol * max(abs(fa), abs(fb))


def compare_values(expected: Any, observed: Any, path: str, rel_tol: float = 0.0) -> Optional[Mismatch]:
    """STEP-15: the first difference between the model's value and the observed one.

    Numbers compare by value (``1`` equals ``1.0``; floats exactly unless ``rel_tol``), booleans
    only with booleans; lists item by item after their lengths; in an observed object a key it
    omits is not compared and a key the model does not produce is a difference."""
    if isinstance(observed, bool) or isinstance(expected, bool):
        return None if type(observed) is type(expected) and observed == expected else Mismatch(path, expected, observed)
    if _is_number(observed) and _is_number(expected):
        return None if _num_equal(expected, observed, rel_tol) else Mismatch(path, expected, observed)
    if isinstance(observed, list) and isinstance(expected, list):
        if len(observed) != len(expected):
            return Mismatch(f"{path} (length)", len(expected), len(observed))
        for i, (e, o) in enumerate(zip(expected, observed)):
            m = compare_values(e, o, f"{path}[{i}]", rel_tol)
            if m is not None:
                return m
        return None
    if isinstance(observed, dict) and isinstance(expected, dict):
        for key in observed:
            if key not in expected:
                return Mismatch(f"{path}.{key}", _ABSENT, observed[key])
        for key in expected:
            if key in observed:
                m = compare_values(expected[key], observed[key], f"{path}.{key}", rel_tol)
                if m is not None:
                    return m
        return None
    return None if observed == expected and type(observed) is type(expected) else Mismatch(path, expected, observed)


def compare_effects(expected: Mapping[str, Any], observed: Mapping[str, Any], rel_tol: float = 0.0
                    ) -> Optional[Mismatch]:
    """STEP-14: compare the model's effects of one step with the observed ones.

    The outcome first: an error on either side must be the same error kind (the message is not
    compared); a result is compared when the trace records one.  Then every recorded field in
    ``COMPARE_ORDER``; a field the trace does not record is not compared."""
    exp_err = expected.get("error")
    obs_err = observed.get("error")
    if exp_err is not None or obs_err is not None:
        if exp_err is None and ("result" in observed or obs_err is not None):
            return Mismatch("error", "(no error)" if "result" not in expected else expected["result"], obs_err)
        if exp_err is not None and obs_err != exp_err:
            return Mismatch("error", exp_err, obs_err if obs_err is not None else observed.get("result", "(no error)"))
        if exp_err is not None:
            return None  # both sides failed the same way; nothing else exists to compare
    if "result" in observed:
        m = compare_values(expected.get("result"), observed["result"], "result", rel_tol)
        if m is not None:
            return m
    for key in COMPARE_ORDER:
        if key in observed:
            m = compare_values(expected.get(key, _ABSENT), observed[key], key, rel_tol)
            if m is not None:
                return m
    return None


# ---------------------------------------------------------------------------------------------
# checking a trace (STEP-16..STEP-18)
# ---------------------------------------------------------------------------------------------


@attrs.frozen
class Divergence:
    step: Step
    mismatch: Mismatch
    state_before: Tuple[str, ...]


@attrs.frozen
class CheckReport:
    """STEP-16: the verdict of :func:`check_trace`."""

    trace: Trace
    steps_checked: int
    divergence: Optional[Divergence] = None

    @property
    def conforms(self) -> bool:
        return self.divergence is None

    def lines(self) -> List[str]:
        """STEP-17: the report as text lines."""
        h = self.trace.header
        out = []
        name = f" {h.name}" if h.name else ""
        if self.divergence is None:
            out.append(f"conforms: {self.steps_checked} step(s) on the {h.args.engine_type.value} "
                       f"{h.worker_role} core{' (trace' + name + ')' if name else ''}")
        else:
            d = self.divergence
            out.append(f"diverges at step {d.step.number} of {len(self.trace.steps)} "
                       f"(line {d.step.line}, {d.step.label()}){' in trace' + name if name else ''}")
            out.append(f"  field: {d.mismatch.field}")
            out.append(f"  expected (model): {_short(d.mismatch.expected, 400)}")
            out.append(f"  observed (trace): {_short(d.mismatch.observed, 400)}")
        if h.recorded_by is not None:
            out.append(f"recorded by: {h.recorded_by}")
        if self.divergence is not None:
            out.append(f"model state before step {self.divergence.step.number}:")
            out.extend("  " + s for s in self.divergence.state_before)
        return out


def describe_state(core) -> Tuple[str, ...]:
    """STEP-17: the model state at a divergence -- queues, statuses, the handoff ledger, metrics."""
    waiting, running = C.queues(core)
    led = core.ledger
    src = led.source_holds
    pend = led.pending_destinations
    out = [
        "waiting: [" + ", ".join(u.value for u in waiting) + "]; running: [" + ", ".join(u.value for u in running) + "]",
    ]
    statuses = [f"{u.value}={C.request_status(core, u)}" for u in list(waiting) + list(running)]
    if statuses:
        out.append("request status: " + ", ".join(statuses))
    out.append("source holds: pending {" + ", ".join(f"{h.value}: {r.value}" for h, r in
                                                      sorted(src.pending_by_handoff.items()))
               + "}; held {" + ", ".join(f"{h.value}: {v[0].value}" for h, v in
                                          sorted(src.held_by_handoff.items(), key=lambda x: x[0])) + "}")
    marks = []
    for h in pend.fifo:
        e = pend.by_handoff.get(h)
        if e is None:
            marks.append(f"{h.value}(tombstone)")
        else:
            mark = "" if e.last_attempt_generation is None else f" tried@{e.last_attempt_generation}"
            marks.append(f"{h.value}:{e.request_id.value}{mark}")
    out.append("pending destinations (FIFO): [" + ", ".join(marks) + "]")
    out.append("reserved destinations: {" + ", ".join(f"{h.value}: {v[0].value}" for h, v in
                                                      sorted(led.destination_holds.by_handoff.items(),
                                                             key=lambda x: x[0])) + "}")
    out.append("active destinations: {" + ", ".join(f"{h.value}: {r.value}" for h, r in
                                                    sorted(led.active_destinations.by_handoff.items())) + "}")
    out.append(f"capacity generation: {led.capacity_generation}")
    m = C.metrics(core)
    out.append(f"metrics: active blocks {m.active_decode_blocks}/{m.total_blocks}, running {m.running_requests}, "
               f"waiting {m.waiting_requests}, preemptions {m.vllm_preemptions_total}")
    return tuple(out)


def check_trace(trace: Trace, rel_tol: float = 0.0) -> CheckReport:
    """STEP-16: replay the steps on the model; stop at the first divergence.

    :class:`BadTrace` if a step follows an engine panic both sides agree on (STEP-8)."""
    core = new_model_core(trace.header)
    for i, step in enumerate(trace.steps):
        if core is None:
            raise _bad(step.line, "op", step.op, "the trace goes on after an InternalInvariantBroken (a panic ends it)")
        new, expected = run_step(core, step)
        m = compare_effects(expected, step.effects, rel_tol)
        if m is not None:
            return CheckReport(trace, i, Divergence(step, m, describe_state(core)))
        core = new
    return CheckReport(trace, len(trace.steps))


# ---------------------------------------------------------------------------------------------
# recording (STEP-19)
# ---------------------------------------------------------------------------------------------


def make_header(engine_args: Mapping[str, Any], *, capture_kv_events: bool = True, dp_rank: int = 0,
                recorded_by: Optional[str] = None, name: Optional[str] = None,
                description: Optional[str] = None, meta: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """STEP-2: a header object for ``engine_args`` (the worker role is read from them)."""
    args = engine_args_from_json(dict(engine_args))
    out: Dict[str, Any] = {"format": FORMAT, "version": VERSION, "model_version": MODEL_VERSION}
    if name is not None:
        out["name"] = name
    if description is not None:
        out["description"] = description
    out.update(engine_args=dict(engine_args), worker_role=args.worker_type.value, dp_rank=dp_rank,
               capture_kv_events=capture_kv_events)
    if recorded_by is not None:
        out["recorded_by"] = recorded_by
    if meta is not None:
        out["meta"] = dict(meta)
    return out


def record(header: Mapping[str, Any], ops: Iterable[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """STEP-19: run ``ops`` on the model and return the trace objects with every effect filled in.

    Each op is a step object without ``step`` and ``effects``.  A ``pass`` / ``hidden_pass``
    whose ``now_ms`` is ``None`` runs at the recorder's clock: 0 at first, then the latest
    ``end_ms`` seen; the concrete value is written.  Recording stops after an
    ``InternalInvariantBroken`` (a panic ends a trace)."""
    hdr = _parse_header(dict(header), 1)
    core = new_model_core(hdr)
    clock = 0.0
    out: List[Dict[str, Any]] = [dict(header)]
    for n, op in enumerate(ops, start=1):
        obj = {k: v for k, v in op.items() if k not in ("step", "effects")}
        if obj.get("op") in ("pass", "hidden_pass") and obj.get("now_ms") is None:
            obj["now_ms"] = clock
        obj = {"step": n, **obj}
        step = _parse_step(obj, n + 1, n)
        core, effects = run_step(core, step)
        if "end_ms" in effects:
            clock = max(clock, effects["end_ms"])
        obj["effects"] = effects
        out.append(obj)
        if core is None:
            break
    return out


def dumps_trace(objs: Iterable[Mapping[str, Any]]) -> str:
    """STEP-1: trace objects as JSONL text (compact, key order kept, no NaN)."""
    return "".join(json.dumps(o, separators=(",", ":"), allow_nan=False) + "\n" for o in objs)


def write_trace(path: str | os.PathLike[str], objs: Iterable[Mapping[str, Any]]) -> Path:
    """Write trace objects atomically (temp file + rename)."""
    from .formats import atomic_write_text

    return atomic_write_text(path, dumps_trace(objs))
