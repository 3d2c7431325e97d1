"""Differential harness: the compiled reference (ai-dynamo-runtime 1.3.0.post1) versus the model.

* :func:`run_reference` runs ``dynamo._core.run_mocker_trace_replay`` (or the
  synthetic entry point) in a **subprocess with a timeout** -- the compiled
  engine can spin forever (spec/replay.md LIVE-5) -- and returns its status,
  summary and per-request rows.
* :func:`run_model` runs the oracle on the same job.
* :func:`compare` finds the first divergent request and field.
* :func:`load_case` / :func:`check_case` read the reference-corpus layout
  (``case.json``, ``trace.jsonl``, ``expected.*``) and compare against the
  recorded files, no wheel needed.

A *job* is a plain dict (the ``case.json`` layout): ``mode`` (``agg`` or
``disagg``), ``engine_args`` / ``prefill_engine_args`` + ``decode_engine_args``
(dicts of ``MockEngineArgs`` keyword arguments), ``num_workers`` /
``num_prefill_workers`` / ``num_decode_workers``, ``trace_block_size``,
``router_mode``, ``arrival_speedup_ratio``, ``replay_concurrency``, and either
``trace_file`` (path) or ``synthetic`` (``input_tokens``, ``output_tokens``,
``request_count``, ``arrival_interval_ms``).  Its values are what the corpus runner hands the
binding, which converts them (:func:`binding_arguments`, spec/replay.md DRV-19); a job built by the
CLI carries ``from_cli`` (JSON-dialect engine args, every worker count passed).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import attrs

from model.engine_args import engine_args_from_json, pyo3_conversion_text
from model.errors import InvalidInput, UpstreamPanic
from model.report import SUMMARY_WALL_CLOCK_KEYS, SlaThresholds, finish
from model.replay import (ReplayError, ReplayLivelock, ReplaySetup, check_binding_arguments,
                          check_mode_arguments, check_setup, run_replay)
from model.workload import (DEFAULT_TRACE_BLOCK_SIZE, FlatWorkload, canonical_trace_format, normalize_trace_requests,
                            synthetic_replay_workload)

from .formats import InputFileError, load_concurrency_trace_file, load_trace_file, read_input_file

__all__ = [
    "Outcome",
    "Divergence",
    "run_reference",
    "run_model",
    "compare",
    "load_case",
    "check_case",
    "synthetic_as_trace_rows",
    "setup_from_job",
    "workload_from_job",
    "binding_arguments",
    "binding_value",
    "REL_TOL_RECORD",
    "REL_TOL_SUMMARY",
]

#: per-request floats agree within this relative tolerance
REL_TOL_RECORD = 1e-12
#: summary values agree within this relative tolerance (upstream sums in hash-map order)
REL_TOL_SUMMARY = 1e-9
#: ... or within this absolute difference: a standard deviation of equal samples is summation
#: noise (about 1e-14) whose relative error is meaningless
ABS_TOL_SUMMARY = 1e-9
#: summary keys that depend on the real elapsed time
WALL_CLOCK_KEYS = frozenset(SUMMARY_WALL_CLOCK_KEYS)


@attrs.frozen
class Outcome:
    """What one side produced: ``status`` is ``ok``, ``timeout`` (hang), ``livelock``, ``error``."""

    status: str
    message: str = ""
    summary: Optional[Dict[str, Any]] = None
    records: Optional[List[Dict[str, Any]]] = None
    refused: Optional[str] = None  # the model's side: the input field it refused (InvalidInput.field)
    refused_value: Any = None  # ... and the value it refused

    def label(self) -> str:
        if not self.message:
            return self.status
        first = self.message.splitlines()[0]
        return first if first.startswith(self.status) or self.status == "livelock" else f"{self.status}: {first}"


@attrs.frozen
class Divergence:
    """The first difference: ``where`` is ``record``, ``summary``, ``count`` or ``status``."""

    where: str
    field: str
    ours: Any
    reference: Any
    request: Optional[Dict[str, Any]] = None  # the reference row (identifying fields)

    def describe(self) -> str:
        if self.where == "record":
            r = self.request or {}
            who = (f"request arriving at {r.get('arrival_time_ms')!r} ms "
                   f"(input {r.get('input_length')}, output {r.get('output_length')})")
            return f"first divergence: {who}, field {self.field}: model {self.ours!r}, reference {self.reference!r}"
        if self.where == "summary":
            return f"first divergence: summary key {self.field}: model {self.ours!r}, reference {self.reference!r}"
        if self.where == "count":
            return f"first divergence: {self.field}: model {self.ours!r}, reference {self.reference!r}"
        return f"outcomes differ: model {self.ours}, reference {self.reference}"


# ---------------------------------------------------------------------------------------------
# the compiled reference, in a subprocess
# ---------------------------------------------------------------------------------------------

_REFERENCE_SCRIPT = r"""
import json, sys, os
job = json.loads(sys.stdin.read())
out_path = job["out_path"]
def emit(obj):
    with open(out_path, "w") as fh:
        json.dump(obj, fh)
try:
    import dynamo._core as c
except Exception as exc:
    emit({"status": "error", "message": "compiled reference not installed: %r" % (exc,)}); sys.exit(0)
def mk(a):
    if job.get("from_cli"):  # the --*-engine-args JSON objects, read as upstream's CLI reads them
        return c.MockEngineArgs.from_json(json.dumps(a))
    # nested sub-arguments are keyword arguments of their own constructors (ARGS-11)
    a = dict(a)
    for key, cls in (("reasoning", "ReasoningConfig"), ("sglang", "SglangArgs"), ("trtllm", "TrtllmArgs")):
        if isinstance(a.get(key), dict):
            a[key] = getattr(c, cls)(**a[key])
    return c.MockEngineArgs(**a)
kw = dict(router_mode=job.get("router_mode", "round_robin"),
          arrival_speedup_ratio=job.get("arrival_speedup_ratio", 1.0))
if job.get("replay_concurrency"):  # as the corpus's own runner: 0 and false mean no cap (DRV-19)
    kw["replay_concurrency"] = job["replay_concurrency"]
for key in ("sla_ttft_ms", "sla_itl_ms", "sla_e2e_ms"):
    if job.get(key) is not None:
        kw[key] = job[key]
try:
    # building the engine args is where the binding refuses them (FID-10): an error, not a crash
    if job["mode"] == "agg":
        if job.get("engine_args") is not None:
            kw["extra_engine_args"] = mk(job["engine_args"])
        kw["num_workers"] = job.get("num_workers", 1)
    else:
        kw.update(prefill_engine_args=mk(job["prefill_engine_args"]), decode_engine_args=mk(job["decode_engine_args"]),
                  num_prefill_workers=job.get("num_prefill_workers", 1),
                  num_decode_workers=job.get("num_decode_workers", 1))
    if job.get("from_cli"):  # the CLI passes every worker count, as upstream's CLI does (DRV-19)
        for key in ("num_workers", "num_prefill_workers", "num_decode_workers"):
            kw[key] = job.get(key, 1)
    if job.get("trace_file") is not None:
        if job.get("trace_block_size") is not None:  # else the binding's own default
            kw["trace_block_size"] = job["trace_block_size"]
        kw["report_jsonl_path"] = job["report_path"]
        if job.get("trace_format") is not None:
            kw["trace_format"] = job["trace_format"]
        if job.get("max_sim_time_ms") is not None:
            kw["max_sim_time_ms"] = job["max_sim_time_ms"]
        summary = c.run_mocker_trace_replay([job["trace_file"]], **kw)
        rows = [json.loads(l) for l in open(job["report_path"]) if l.strip()]
    else:
        s = job["synthetic"]
        for key in ("turns_per_session", "shared_prefix_ratio", "num_prefix_groups", "inter_turn_delay_ms"):
            if key in s:
                kw[key] = s[key]
        summary = c.run_mocker_synthetic_trace_replay(
            input_tokens=s["input_tokens"], output_tokens=s["output_tokens"], request_count=s["request_count"],
            arrival_interval_ms=s.get("arrival_interval_ms", 1.0), **kw)
        rows = None
    emit({"status": "ok", "summary": dict(summary), "records": rows})
except Exception as exc:
    emit({"status": "error", "message": str(exc)})
"""


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the child and anything it started (it leads its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


class _StderrTail:
    """Drains a child's stderr on a thread, keeping only the last ``limit`` bytes."""

    def __init__(self, stream, limit: int = 64 * 1024) -> None:
        self._stream = stream
        self._limit = limit
        self._buf = bytearray()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        for chunk in iter(lambda: self._stream.read1(1 << 16), b""):
            self._buf += chunk
            if len(self._buf) > 2 * self._limit:
                del self._buf[: len(self._buf) - self._limit]

    def finish(self, proc: subprocess.Popen) -> str:
        """Wait for end of stream and return the kept tail as text.  The child has exited; anything
        it started that still holds the stream open is killed with its process group."""
        self._thread.join(timeout=5.0)
        if self._thread.is_alive():
            _kill_group(proc)
            self._thread.join()
        self._stream.close()
        return bytes(self._buf[-self._limit:]).decode("utf-8", "replace")


def run_script(script: str, payload: Mapping[str, Any], timeout_s: float,
               python: str = sys.executable) -> Tuple[bool, Optional[int], str]:
    """Run ``python -c script`` with ``payload`` as JSON on its stdin, in its own session.

    Returns ``(timed_out, exit status, last lines of its stderr)``.  The child's log goes through a
    bounded tail (:class:`_StderrTail`): a hanging engine can log a warning per pass (hundreds of
    megabytes a minute) and must not fill this process's memory; on a timeout its whole process
    group is killed."""
    proc = subprocess.Popen(
        [python, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    tail = _StderrTail(proc.stderr)
    try:
        try:
            proc.stdin.write(json.dumps(payload).encode())
            proc.stdin.close()
        except BrokenPipeError:  # the child died before reading its job; its status says why
            pass
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return True, None, tail.finish(proc)
    return False, proc.returncode, tail.finish(proc)


def reference_problem(python: str = sys.executable) -> Optional[str]:
    """Why ``python`` cannot import the compiled reference, or None when it can (checked in a
    child process, so this process never loads the compiled library)."""
    import subprocess

    try:
        proc = subprocess.run([python, "-c", "import dynamo._core"], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "importing the compiled reference (dynamo._core) did not finish within 120 s"
    except OSError as exc:
        return f"cannot run {python!r}: {exc.strerror or exc}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return f"the compiled reference ai-dynamo-runtime==1.3.0.post1 is not importable ({last})"
    return None


def reference_available(python: str = sys.executable) -> bool:
    """Whether ``python`` can import the compiled reference (:func:`reference_problem`)."""
    return reference_problem(python) is None


def run_reference(job: Mapping[str, Any], timeout_s: float = 60.0, python: str = sys.executable) -> Outcome:
    """Run the compiled reference on ``job`` in a subprocess (:func:`run_script`); a run over
    ``timeout_s`` is a hang."""
    with tempfile.TemporaryDirectory(prefix="mocker-spec-ref-") as tmp:
        payload = dict(job)
        payload["out_path"] = os.path.join(tmp, "out.json")
        payload["report_path"] = os.path.join(tmp, "report.jsonl")
        timed_out, code, err = run_script(_REFERENCE_SCRIPT, payload, timeout_s, python)
        if timed_out:
            return Outcome("timeout", f"the reference did not finish within {timeout_s:g} s (it hangs)")
        try:
            data = json.loads(Path(payload["out_path"]).read_text())
        except (OSError, ValueError):
            last = err.strip().splitlines()[-1:] or [f"exit status {code}"]
            return Outcome("error", f"the reference crashed: {last[0]}")
    summary = data.get("summary")
    if summary is not None:
        summary = {k: v for k, v in summary.items() if k != "wall_time_ms"}
    return Outcome(data["status"], data.get("message", ""), summary, data.get("records"))


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------


#: DRV-19: the Rust type the binding declares for each replay argument it converts
#: (lib/bindings/python/rust/llm/replay.rs:847-875 trace files, 1098-1125 synthetic workloads)
_ARG_KINDS = {
    "input_tokens": "usize", "output_tokens": "usize", "request_count": "usize",
    "num_workers": "usize", "num_prefill_workers": "usize", "num_decode_workers": "usize",
    "replay_concurrency": "isize", "router_mode": "str", "arrival_speedup_ratio": "f64",
    "arrival_interval_ms": "f64", "turns_per_session": "usize", "shared_prefix_ratio": "f64",
    "num_prefix_groups": "usize", "inter_turn_delay_ms": "f64",
    "trace_block_size": "usize", "trace_format": "str", "max_sim_time_ms": "f64",
    "sla_ttft_ms": "f64", "sla_itl_ms": "f64", "sla_e2e_ms": "f64",
}
_USIZE_MAX = 2**64 - 1
_ISIZE_MIN, _ISIZE_MAX = -(2**63), 2**63 - 1


def binding_value(name: str, value: Any) -> Any:
    """DRV-19: the value the binding receives for replay argument ``name`` (PyO3's conversion of
    a JSON value), or :class:`InvalidInput` carrying the binding's own text.

    A boolean is an integer to PyO3 (``True`` is 1, or 1.0 where a float is due); an integer is
    accepted where a float is due; nothing else converts.
    """
    kind = _ARG_KINDS[name]
    if kind in ("usize", "isize"):
        if isinstance(value, bool):
            return int(value)
        low, high = (_ISIZE_MIN, _ISIZE_MAX) if kind == "isize" else (0, _USIZE_MAX)
        if isinstance(value, int) and low <= value <= high:
            return value
    elif kind == "f64":
        if isinstance(value, (bool, int)):
            try:
                return float(value)
            except OverflowError:
                pass
        elif isinstance(value, float):
            return value
    elif isinstance(value, str):
        return value
    raise InvalidInput(name, value, pyo3_conversion_text(name, value, kind), rule="DRV-19")


def binding_arguments(job: Mapping[str, Any]) -> Dict[str, Any]:
    """DRV-19: the replay arguments a job hands the binding, converted, in the binding's order.

    A case (the refcases layout) passes what its runner passes: the worker counts of its mode
    only, ``router_mode`` and ``arrival_speedup_ratio`` always (defaults ``round_robin`` and 1.0),
    ``replay_concurrency`` only when truthy (0 and ``false`` mean no cap), the trace's
    ``trace_block_size``, ``trace_format`` and ``max_sim_time_ms`` and the SLA thresholds when
    not null, a synthetic workload's ``arrival_interval_ms`` always (default 1.0) and its other
    settings when present.  A job built by the CLI (``from_cli``) passes every worker count.
    Raises :class:`InvalidInput` for the first argument the binding cannot convert.
    """
    given: Dict[str, Any] = {}
    synthetic = job.get("trace_file") is None and isinstance(job.get("synthetic"), Mapping)
    if synthetic:
        s = job["synthetic"]
        for key in ("input_tokens", "output_tokens", "request_count"):
            given[key] = s.get(key)
    agg = job.get("mode", "agg") == "agg"
    if agg or job.get("from_cli"):
        given["num_workers"] = job.get("num_workers", 1)
    if not agg or job.get("from_cli"):
        given["num_prefill_workers"] = job.get("num_prefill_workers", 1)
        given["num_decode_workers"] = job.get("num_decode_workers", 1)
    if job.get("replay_concurrency"):
        given["replay_concurrency"] = job["replay_concurrency"]
    given["router_mode"] = job.get("router_mode", "round_robin")
    given["arrival_speedup_ratio"] = job.get("arrival_speedup_ratio", 1.0)
    if synthetic:
        s = job["synthetic"]
        given["arrival_interval_ms"] = s.get("arrival_interval_ms", 1.0)
        for key in ("turns_per_session", "shared_prefix_ratio", "num_prefix_groups", "inter_turn_delay_ms"):
            if key in s:
                given[key] = s[key]
    else:
        for key in ("trace_block_size", "trace_format", "max_sim_time_ms"):
            if job.get(key) is not None:
                given[key] = job[key]
    for key in ("sla_ttft_ms", "sla_itl_ms", "sla_e2e_ms"):
        if job.get(key) is not None:
            given[key] = job[key]
    return {name: binding_value(name, value) for name, value in given.items()}


def setup_from_job(job: Mapping[str, Any]) -> ReplaySetup:
    """The replay setup of a job.

    Engine-args dicts are ``MockEngineArgs`` keyword arguments (ARGS-13's ``kwargs`` dialect), as
    the corpus runners pass them; a job built by the CLI (``from_cli``) holds the JSON objects of
    ``--*-engine-args`` (the ``json`` dialect).  The engine args are built first, then the replay
    arguments are converted (DRV-19), as the runners do.
    """
    dialect = "json" if job.get("from_cli") else "kwargs"
    if job.get("mode", "agg") not in ("agg", "disagg"):
        raise InvalidInput("mode", job["mode"], "must be 'agg' or 'disagg'", rule="DRV-19")

    def parse(name: str):
        raw = job.get(name)
        if raw is None:
            return None
        try:
            return engine_args_from_json(raw, dialect=dialect)
        except InvalidInput as exc:
            raise InvalidInput(f"{name}.{exc.field}", exc.value, exc.reason, rule=exc.rule) from None

    if job.get("mode", "agg") == "agg":
        engines = dict(engine_args=parse("engine_args"))
    else:
        engines = dict(prefill_args=parse("prefill_engine_args"), decode_args=parse("decode_engine_args"))
    a = binding_arguments(job)
    return ReplaySetup(
        num_workers=a.get("num_workers", 1),
        num_prefill_workers=a.get("num_prefill_workers", 1),
        num_decode_workers=a.get("num_decode_workers", 1),
        replay_concurrency=a.get("replay_concurrency"),
        router_mode=a["router_mode"],
        max_sim_time_ms=a.get("max_sim_time_ms"),
        sla=SlaThresholds(a.get("sla_ttft_ms"), a.get("sla_itl_ms"), a.get("sla_e2e_ms")),
        **engines,
    )


def check_job_setup(job: Mapping[str, Any], setup: ReplaySetup) -> None:
    """DRV-1: the argument checks for ``job`` that come before its workload: for a trace file all
    of them (the binding's, then the mode checks); for a synthetic workload the binding's only, as
    its entry point builds the workload before the mode checks (:func:`workload_from_job` runs
    them)."""
    if job.get("trace_file") is not None:
        check_setup(setup, trace_format=binding_arguments(job).get("trace_format", "mooncake"))
    else:
        check_binding_arguments(setup, synthetic=True)


def workload_from_job(job: Mapping[str, Any], setup: ReplaySetup):
    """The workload of a job: a trace file (WL-14) or synthetic requests (WL-16/WL-17), from the
    converted replay arguments (DRV-19)."""
    a = binding_arguments(job)
    ratio = a["arrival_speedup_ratio"]
    conc = a.get("replay_concurrency")
    if job.get("trace_file") is not None:
        fmt = canonical_trace_format(a.get("trace_format", "mooncake"))
        if fmt == "mooncake-delta" and setup.is_disagg:  # WL-18 (entrypoints.rs:308-310, 726-728)
            raise InvalidInput("trace_format", fmt, "mooncake-delta trace format is not supported for disaggregated "
                               "replay", rule="WL-18")
        tbs = a.get("trace_block_size", DEFAULT_TRACE_BLOCK_SIZE)  # WL-5
        if conc is not None:  # WL-20: the concurrency workload driver
            return load_concurrency_trace_file(job["trace_file"], tbs, validate=not setup.is_disagg,
                                               accumulate_deltas=fmt == "mooncake-delta")
        # WL-9: the disaggregated replay does not validate a multi-turn trace (WL-14)
        return load_trace_file(job["trace_file"], tbs, ratio, fmt, validate_sessions=not setup.is_disagg)
    args = setup.prefill_args if setup.is_disagg else setup.engine_args
    block_size = args.block_size if args is not None else 64
    # DRV-1: the binding builds the workload (WL-16/WL-17, the workload path's speed-up included),
    # then the entry point makes its mode checks, then it normalizes flat requests (WL-15)
    workload = synthetic_replay_workload(
        block_size,
        a["input_tokens"],
        a["output_tokens"],
        a["request_count"],
        a["arrival_interval_ms"],
        turns_per_session=a.get("turns_per_session", 1),
        shared_prefix_ratio=a.get("shared_prefix_ratio", 0.0),
        num_prefix_groups=a.get("num_prefix_groups", 0),
        inter_turn_delay_ms=a.get("inter_turn_delay_ms", 0.0),
        arrival_speedup_ratio=ratio,
        replay_concurrency=conc,
        normalize=False,
    )
    check_mode_arguments(setup)
    if isinstance(workload, FlatWorkload) and conc is None:
        workload = FlatWorkload(normalize_trace_requests(workload.requests, ratio))
    return workload


def run_model(job: Mapping[str, Any]) -> Outcome:
    """Run the oracle on ``job``; bad input propagates as :class:`InvalidInput`."""
    setup = setup_from_job(job)
    check_job_setup(job, setup)  # before the workload, as upstream checks its arguments before the trace
    workload = workload_from_job(job, setup)
    try:
        col = run_replay(setup, workload)
    except ReplayLivelock as exc:
        return Outcome("livelock", str(exc))
    except ReplayError as exc:
        return Outcome("error", exc.message)
    summary, records = finish(col, 0.0)
    summary = {k: v for k, v in summary.items() if k != "wall_time_ms"}
    return Outcome("ok", "", summary, [_as_written(r.to_dict()) for r in records])


def _as_written(record: Dict[str, Any]) -> Dict[str, Any]:
    """REP-3: a record as its JSONL line reads back: serde_json writes a non-finite float as
    ``null`` (an unvalidated disaggregated trace can make times infinite, WL-9), and so does the
    model's writer (``format_json_float``)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}


def synthetic_as_trace_rows(workload: FlatWorkload) -> List[Dict[str, Any]]:
    """Flat synthetic requests as mooncake rows replayed with ``trace_block_size`` 1.

    With one token per hash id the trace path (WL-10, WL-13) rebuilds exactly
    the synthetic tokens, lengths and arrivals, so the reference can write its
    per-request report (its synthetic entry point has none).
    """
    return [
        {
            "timestamp": r.arrival_timestamp_ms,
            "input_length": len(r.tokens),
            "output_length": r.max_output_tokens,
            "hash_ids": list(r.tokens),
        }
        for r in workload.requests
    ]


# ---------------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------------


def _close(a: Any, b: Any, tol: float, abs_tol: float = 0.0) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        fa, fb = float(a), float(b)
        if fa == fb:
            return True
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        return abs(fa - fb) <= max(tol * max(abs(fa), abs(fb)), abs_tol)
    return a == b


def _bucket(v: Any) -> Any:
    if isinstance(v, float) and math.isfinite(v) and v != 0.0:
        return float(f"{v:.9g}")
    return v


def _row_key(r: Mapping[str, Any]) -> Tuple:
    """Rows are matched by arrival, then by every other field (uuids are random upstream)."""
    from model.report import REPORT_FIELDS

    return tuple(
        (0, "") if r.get(k) is None else (1, str(_bucket(r.get(k))) if not isinstance(r.get(k), (int, float)) else _bucket(r.get(k)))
        for k in ("arrival_time_ms",) + tuple(f for f in REPORT_FIELDS if f not in ("uuid", "arrival_time_ms"))
    )


#: FID-10: the ways the compiled build words a refusal of its engine arguments (raised while
#: ``MockEngineArgs(...)`` is built, before any replay), each capturing the argument it names:
#: the validator's ranges and cross-field rules (``__all__``; common/protocols.rs:1307-1309,
#: bindings replay.rs:317-323), the JSON dialect's serde and validator errors (a CLI job, DRV-19),
#: the binding's argument conversion, an unknown keyword, an unknown engine type; a negative count
#: names none
_ARG_REFUSALS = tuple(re.compile(p) for p in (
    r"^Failed to (?:normalize|build) MockEngineArgs: (?:Failed to validate MockEngineArgs: )?(\w+): ",
    r"^argument '(\w+)': ",
    r"^Failed to parse MockEngineArgs JSON: [\w.\[\]]+: missing field `(\w+)`",
    r"^Failed to parse MockEngineArgs JSON: (?:Failed to validate MockEngineArgs: )?(?:\w+[.\[])*?([\w\[\]]+): ",
    r"^Failed to parse MockEngineArgs JSON: Invalid (\w+):? '",
    r"unexpected keyword argument '(\w+)'",
    r"^(engine_type) must be one of ",
    r"^(worker_type) must be one of ",
    r"^(preemption_mode) must be either ",
    r"^Invalid (kv_transfer_timing_mode) ",
    r"^invalid (router_queue_policy) ",
    r"^Failed to load (planner_profile_data) from ",
    r"^()can't convert negative int to unsigned$",
    r"^()out of range integral type conversion attempted$",
    r"^()int too big to convert$",
    r"^()Python int too large to convert to C long$",
    r"__new__\(\) missing \d+ required positional arguments?: '(\w+)'",
    r"^Failed to parse MockEngineArgs JSON: (\w+) must not be null$",
))
#: FID-10: refusals whose text names no argument but only one argument can give
_UNNAMED_ARG_REFUSALS = (
    (re.compile(r"^Failed to parse MockEngineArgs JSON: unknown queue policy: "), "router_queue_policy"),
)
_ENGINE_ARGS_KEYS = ("engine_args", "prefill_engine_args", "decode_engine_args")
#: FID-10: the further arguments of a validation error, one line each after the first
_MORE_INVALID = re.compile(r"\n(\w+): ")


def refused_argument(message: str) -> Optional[str]:
    """FID-10: the engine argument a reference error message refuses (``""`` when it names none,
    ``"__all__"`` for a cross-field rule), or None when the message is not an argument refusal.
    A runner's crash prefix and the exception's class name are skipped."""
    text = message[len("the reference crashed: "):] if message.startswith("the reference crashed: ") else message
    text = re.sub(r"^(?:Exception|TypeError|ValueError|OverflowError): ", "", text, count=1)
    for pattern in _ARG_REFUSALS:
        m = pattern.search(text)
        if m:
            return m.group(1)
    for pattern, name in _UNNAMED_ARG_REFUSALS:
        if pattern.search(text):
            return name
    return None


#: FID-10: a trace line the reference could not parse, or could not read (invalid UTF-8, WL-3); the
#: texts quote the file's path, which is where the case was recorded (loadgen/trace.rs:181-199)
_TRACE_LINE_REFUSAL = re.compile(r"^failed to (?:parse line (\d+) from .+ as JSON|read line (\d+) from .+)$")
#: FID-10: a panic on a validation failure names the field (a vLLM ``block_size`` of 1: the
#: sequence's validator, sequence.rs:58,109; the model refuses it, SEQ-3)
_VALIDATION_PANIC = re.compile(r'^the reference crashed: pyo3_runtime\.PanicException: .*ValidationErrors\(\{"(\w+)"')
#: an upstream panic: the model repeats its text as a refusal or an ``UpstreamPanic`` (_same_panic)
_PANIC = re.compile(r"^the reference crashed: pyo3_runtime\.PanicException: (.*)$", re.S)
_EMPTY_TRACE = re.compile(r"^trace file .+ did not contain any requests$")
#: FID-11: the compiled build lists one more trace format than the pin, so the refusal's text
#: differs; the refused value is compared instead
_TRACE_FORMAT_REFUSAL = re.compile(r"^trace_format must be .+, got '(.*)'$")


def _same_panic(ours: Outcome, ref_message: str) -> bool:
    """An upstream panic the model mirrors with the same text: as a refusal (a vLLM block size
    that is not a power of two, KV-1; an output length too large to reserve, REP-1) or as an
    :class:`~model.errors.UpstreamPanic` (a duration overflow, TIME-1)."""
    panic = _PANIC.match(ref_message)
    return panic is not None and panic.group(1).strip() == ours.message.strip()


def _same_refusal(ours: Outcome, ref_message: str) -> bool:
    """FID-10: the model refused ``ours.refused`` and the reference refused the same input: the same
    engine argument (its range-error text lists the range's keys in hash-map order, so texts are
    not compared), the same trace line, or an empty trace file (texts that quote the file's path);
    the binding's text for a negative count names no argument and agrees with a refusal of a
    negative integer anywhere."""
    field = ours.refused
    if field is None:
        return False
    named = refused_argument(ref_message)
    if named == "":  # a conversion of an integer that fits no unsigned type, or not this one
        value = ours.refused_value
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        if ref_message.endswith("too big to convert"):
            return value >= 2 ** 64
        if ref_message.endswith("to C long"):  # a u16 or u32 parameter, through a C long
            return value >= 2 ** 63
        if ref_message.endswith("conversion attempted"):  # a u16 or u32 parameter
            return value < 0 or value > 0xFFFF
        return value < 0
    panic = _VALIDATION_PANIC.match(ref_message)
    if panic:
        return field.split(".")[-1] == panic.group(1)
    line = _TRACE_LINE_REFUSAL.match(ref_message)
    if line:
        return field.startswith(f"trace line {line.group(1) or line.group(2)}:")
    if _EMPTY_TRACE.match(ref_message):
        return _EMPTY_TRACE.match(ours.message) is not None or ours.message == "trace file did not contain any requests"
    fmt = _TRACE_FORMAT_REFUSAL.match(ref_message)
    if fmt:
        return field == "trace_format" and ours.refused_value == fmt.group(1)
    if field.split(".")[0] not in _ENGINE_ARGS_KEYS:
        return False
    last = field.split(".")[-1]
    # a validation error lists every failing argument, one per line, in hash-map order (which
    # changes between runs): the model's refusal agrees with any of them
    listed = {named} | set(_MORE_INVALID.findall(ref_message))
    return last in listed or ("__all__" in listed and last in ref_message)


def compare(ours: Outcome, ref: Outcome) -> Optional[Divergence]:
    """None when the outcomes agree (a model livelock agrees with a reference hang; a model
    refusal agrees with the reference's refusal of the same input, FID-10)."""
    if ours.status != "ok" or ref.status != "ok":
        agree = (
            (ours.status == "livelock" and ref.status == "timeout")
            or (ours.status == "error" and ref.status == "error"
                # a recorded expected.status loses the text's trailing blanks (an empty session id
                # ends upstream's WL-7 message with one), so the ends are not compared
                and (ours.message.strip() == ref.message.strip() or _same_panic(ours, ref.message)
                     or _same_refusal(ours, ref.message)))
        )
        return None if agree else Divergence("status", "status", ours.label(), ref.label())
    if ref.records is not None and ours.records is not None:
        if len(ours.records) != len(ref.records):
            return Divergence("count", "report rows", len(ours.records), len(ref.records))
        for a, b in zip(sorted(ours.records, key=_row_key), sorted(ref.records, key=_row_key)):
            for k, v in b.items():
                if k == "uuid":
                    continue
                if not _close(a.get(k), v, REL_TOL_RECORD):
                    ident = {f: b.get(f) for f in ("arrival_time_ms", "input_length", "output_length")}
                    return Divergence("record", k, a.get(k), v, ident)
    if ref.summary is not None and ours.summary is not None:
        for k, v in ref.summary.items():
            if k in WALL_CLOCK_KEYS or k == "wall_time_ms":
                continue
            if not _close(ours.summary.get(k), v, REL_TOL_SUMMARY, ABS_TOL_SUMMARY):
                return Divergence("summary", k, ours.summary.get(k), v)
    return None


@attrs.frozen
class Fid7Evidence:
    """The request (or group of requests) that carries FID-7's signature: the reference's rows, the
    reuse field, and the tokens it sums to in the model and in the reference."""

    field: str
    model: int
    reference: int
    rows: Tuple[Dict[str, Any], ...]  # the reference's rows, in arrival order

    def describe(self) -> str:
        where = " on its decode worker" if self.field == "decode_reused_input_tokens" else ""
        b = self.rows[0]
        if len(self.rows) == 1:
            return (f"FID-7 signature: the request arriving at {b.get('arrival_time_ms')!r} ms (input "
                    f"{b.get('input_length')}) reuses {self.model} tokens{where} in the model, "
                    f"{self.reference} in the reference")
        return (f"FID-7 signature: the {len(self.rows)} requests of input {b.get('input_length')} and output "
                f"{b.get('output_length')} arriving from {b.get('arrival_time_ms')!r} ms reuse {self.model} "
                f"tokens{where} in all in the model, {self.reference} in the reference")


def fid7_evidence(case: Mapping[str, Any], ours: Outcome, ref: Outcome) -> Optional[Fid7Evidence]:
    """FID-7's signature in a difference, as a hint (not a verdict): both runs complete with the
    same requests, a vLLM or TRT-LLM worker is involved, and some request reuses more prompt tokens
    in the model than in the reference (the pinned source keeps the blocks a failing prefill chunk
    got; the compiled build's newer all-or-nothing Use does not), on its aggregated or prefill
    worker (``reused_input_tokens``) or on its decode worker (``decode_reused_input_tokens``). The
    first such request in the reference's arrival order, or None.

    A request is known by its arrival, lengths, session and turn. Rows that share all of them, or
    whose arrival moved (a later turn of a session arrives when the turn before it ends, so the
    difference itself can shift it), are matched only as a group of equal lengths, session and
    turn: the group carries the signature when its rows reuse more in all in the model, which holds
    for some request of it however its rows pair up."""
    if ours.status != "ok" or ref.status != "ok" or ours.records is None or ref.records is None:
        return None
    engines = {(case.get(k) or {}).get("engine_type", "vllm")
               for k in ("engine_args", "prefill_engine_args", "decode_engine_args") if k in case}
    if not engines & {"vllm", "trtllm"} or len(ours.records) != len(ref.records):
        return None
    ident = ("arrival_time_ms", "input_length", "output_length", "session_id", "turn_index")

    def group(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> Dict[Tuple, List[Dict[str, Any]]]:
        out: Dict[Tuple, List[Dict[str, Any]]] = {}
        for r in rows:
            out.setdefault(tuple(r.get(f) for f in fields), []).append(dict(r))
        return out

    mine, theirs = group(ours.records, ident), group(ref.records, ident)
    # one row on each side: matched as one request; the others by lengths, session and turn
    single = {k for k, rows in theirs.items() if len(rows) == 1 and len(mine.get(k, ())) == 1}
    loose_mine = group([r for k, rows in mine.items() if k not in single for r in rows], ident[1:])
    loose_theirs = group([r for k, rows in theirs.items() if k not in single for r in rows], ident[1:])
    if {k: len(v) for k, v in loose_mine.items()} != {k: len(v) for k, v in loose_theirs.items()}:
        return None  # not the same requests
    pairs = [(mine[k], theirs[k]) for k in single]
    pairs += [(loose_mine[k], sorted(rows, key=_row_key)) for k, rows in loose_theirs.items()]
    for a_rows, b_rows in sorted(pairs, key=lambda p: _row_key(p[1][0])):
        for field in ("reused_input_tokens", "decode_reused_input_tokens"):
            m = [r.get(field) for r in a_rows]
            t = [r.get(field) for r in b_rows]
            if all(isinstance(x, int) and not isinstance(x, bool) for x in m + t) and sum(m) > sum(t):
                return Fid7Evidence(field, sum(m), sum(t), tuple(b_rows))
    return None


def fid7_signature(case: Mapping[str, Any], ours: Outcome, ref: Outcome) -> Optional[str]:
    """:func:`fid7_evidence` as the line ``mocker-spec diff`` prints, or None."""
    found = fid7_evidence(case, ours, ref)
    return found.describe() if found else None


# ---------------------------------------------------------------------------------------------
# the corpus layout
# ---------------------------------------------------------------------------------------------


#: a corpus case directory that cannot be read (the file and why, in one line)
CaseError = InputFileError


def load_case(case_dir: str | os.PathLike[str]) -> Tuple[Dict[str, Any], Outcome]:
    """A corpus case as ``(job, recorded reference outcome)``; :class:`CaseError` if a file of it
    cannot be read."""
    d = Path(case_dir)
    job = read_input_file(d / "case.json", parse_json=True)
    if not isinstance(job, dict):
        raise CaseError(f"{d / 'case.json'}: not a JSON object")
    # the layout's two modes; a disaggregated case names both pools' engine args (the runners
    # index them and would fail on a missing one before the reference runs)
    mode = job.get("mode")
    if mode not in ("agg", "disagg"):
        raise CaseError(f"{d / 'case.json'}: mode={mode!r}: must be 'agg' or 'disagg'")
    if mode == "disagg":
        for key in ("prefill_engine_args", "decode_engine_args"):
            if not isinstance(job.get(key), dict):
                raise CaseError(f"{d / 'case.json'}: {key}={job.get(key)!r}: a disagg case needs it as an object")
    job["trace_file"] = str(d / "trace.jsonl")
    status = read_input_file(d / "expected.status").strip() if (d / "expected.status").exists() else "ok"
    if status == "ok":
        summary = read_input_file(d / "expected.summary.json", parse_json=True)
        if not isinstance(summary, dict):
            raise CaseError(f"{d / 'expected.summary.json'}: not a JSON object")
        report = d / "expected.report.jsonl"
        rows = read_input_file(report, lines=True)
        for n, row in enumerate(rows, 1):
            if not isinstance(row, dict):
                raise CaseError(f"{report}: row {n} is not a JSON object")
        return job, Outcome("ok", "", summary, rows)
    if status == "timeout":
        return job, Outcome("timeout", "the reference never finished")
    if not status.startswith("error:"):
        raise CaseError(f"{d / 'expected.status'}: {status[:60]!r} is not 'ok', 'timeout' or 'error: <message>'")
    return job, Outcome("error", status[len("error:"):].strip())


def check_case(case_dir: str | os.PathLike[str]) -> Tuple[Outcome, Outcome, Optional[Divergence]]:
    """Run the model on one corpus case and compare with the recorded reference outcome."""
    return check_loaded_case(*load_case(case_dir))


def model_outcome(job: Mapping[str, Any]) -> Outcome:
    """:func:`run_model` as an outcome: a refusal (``InvalidInput``, raised before or during the
    replay) is an error carrying upstream's text and what was refused; any other exception (a
    missing core, a model bug) an error naming it."""
    try:
        return run_model(job)
    except InvalidInput as exc:  # upstream's text is the reason; the field=value prefix is the CLI's
        return Outcome("error", exc.reason, refused=exc.field, refused_value=exc.value)
    except UpstreamPanic as exc:  # upstream's panic text, word for word
        return Outcome("error", exc.message)
    except Exception as exc:
        return Outcome("error", f"{type(exc).__name__}: {exc}")


def check_loaded_case(job: Dict[str, Any], ref: Outcome) -> Tuple[Outcome, Outcome, Optional[Divergence]]:
    """:func:`check_case` on a case already read by :func:`load_case`."""
    ours = model_outcome(job)
    return ours, ref, compare(ours, ref)


def case_dirs(root: str | os.PathLike[str]) -> List[Path]:
    return sorted(p for p in Path(root).iterdir() if p.is_dir() and (p / "case.json").exists())


def record_case(case_dir: str | os.PathLike[str], timeout_s: float = 120.0) -> str:
    """Run the compiled reference on a case directory and write its expected.* files.

    Returns the status written to ``expected.status``: ``ok``, ``timeout`` or ``error: <message>``.
    """
    from .formats import atomic_write_text, dumps_compact

    d = Path(case_dir)
    job = json.loads((d / "case.json").read_text())
    job["trace_file"] = str(d / "trace.jsonl")
    out = run_reference(job, timeout_s=timeout_s)
    if out.status == "ok":
        atomic_write_text(d / "expected.report.jsonl", "".join(dumps_compact(r) + "\n" for r in out.records or []))
        atomic_write_text(d / "expected.summary.json", json.dumps(out.summary, indent=1, sort_keys=True))
        status = "ok"
    elif out.status == "timeout":
        status = "timeout"
    else:
        status = f"error: {out.message}"
    atomic_write_text(d / "expected.status", status + "\n")
    return status
