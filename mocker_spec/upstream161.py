"""Behaviour diff: the 1.3.0 model against the newest upstream build, ai-dynamo-runtime 1.6.1
(spec/oracle-kit.md §4, DIFF161-n).

``mocker-spec diff-161 --corpus DIR --out REPORT --python PY`` runs every replay case of the
corpus (refcases layout: ``case.json`` + ``trace.jsonl``) twice: on the model (the 1.3.0 spec)
and on the 1.6.1 build, in a subprocess of ``PY`` (an interpreter of a separate environment
where ``ai-dynamo-runtime==1.6.1`` is installed; the project's own environment keeps 1.3.0),
under a timeout.  Each case is classified by the kind of divergence (DIFF161-6) and the
Markdown report groups the cases by kind.  It is not part of the test suite.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import attrs

#: DIFF161-6: the kinds of divergence, in report order
KINDS = (
    "hang",
    "dead end vs completion",
    "error",
    "admission order",
    "timing",
    "other",
    "identical",
)
#: DIFF161-5: per-request floats agree within this relative tolerance
REL_TOL = 1e-9

#: DIFF161-2: engine-args keys of the 1.3.0 JSON that move out of ``engine`` in the canonical form
_TOP_LEVEL = {"dp_size": "dp_size", "startup_time": "startup_time"}
_DYNAMO = {"handoff_session_timeout_ms", "zmq_kv_events_port", "router_queue_policy"}
_RENAMED = {"kv_bytes_per_token": "kv_transfer_bytes_per_token", "engine_type": "backend"}
_DROPPED_WORKER_FLAGS = ("is_prefill", "is_decode")


def canonical_engine_args(args: Mapping[str, Any]) -> Dict[str, Any]:
    """DIFF161-2: a 1.3.0 engine-args object (``--extra-engine-args`` keys) in the 1.6.1 canonical
    form ``{"engine": {"backend": ..., ...}, "dp_size": ..., "dynamo": {...}}``.

    ``engine_type`` becomes ``engine.backend`` (default ``vllm``), ``kv_bytes_per_token``
    becomes ``engine.kv_transfer_bytes_per_token``; ``dp_size`` and ``startup_time`` stay at the
    top level; the handoff timeout, ZMQ port and router queue policy go under ``dynamo``; the
    legacy ``is_prefill`` / ``is_decode`` flags become ``engine.worker_type``; everything else
    (block and slot sizes, prefix caching, chunking, speed-ups, preemption, transfer timing,
    ``sglang`` and ``trtllm`` sub-objects) keeps its name under ``engine``."""
    eng: Dict[str, Any] = {"backend": "vllm"}
    out: Dict[str, Any] = {"engine": eng}
    dyn: Dict[str, Any] = {}
    for key, value in args.items():
        if key in _TOP_LEVEL:
            out[_TOP_LEVEL[key]] = value
        elif key in _DYNAMO:
            dyn[key] = value
        elif key in _RENAMED:
            eng[_RENAMED[key]] = value
        elif key in _DROPPED_WORKER_FLAGS:
            continue
        else:
            eng[key] = value
    if "worker_type" not in eng:
        if args.get("is_prefill"):
            eng["worker_type"] = "prefill"
        elif args.get("is_decode"):
            eng["worker_type"] = "decode"
    if dyn:
        out["dynamo"] = dyn
    return out


_RUNNER = r"""
import json, sys, traceback
job = json.loads(sys.stdin.read())
def emit(obj):
    with open(job["out_path"], "w") as fh:
        json.dump(obj, fh)
try:
    import dynamo._core as c
    from importlib import metadata
    version = metadata.version("ai-dynamo-runtime")
except Exception as exc:
    emit({"status": "missing", "message": "ai-dynamo-runtime is not importable: %r" % (exc,)}); sys.exit(0)
kw = dict(router_mode=job.get("router_mode", "round_robin"), arrival_speedup_ratio=job.get("arrival_speedup_ratio", 1.0),
          report_jsonl_path=job["report_path"])
if job.get("trace_block_size") is not None:  # else the binding's own default
    kw["trace_block_size"] = job["trace_block_size"]
if job.get("replay_concurrency"):  # 0 and false mean no cap, as in the corpus runner (DRV-19)
    kw["replay_concurrency"] = job["replay_concurrency"]
if job["mode"] == "agg":
    if job.get("engine_args") is not None:
        kw["extra_engine_args"] = job["engine_args"]
    kw["num_workers"] = job.get("num_workers", 1)
else:
    kw.update(prefill_engine_args=job["prefill_engine_args"], decode_engine_args=job["decode_engine_args"],
              num_prefill_workers=job.get("num_prefill_workers", 1), num_decode_workers=job.get("num_decode_workers", 1))
try:
    res = c.run_mocker_trace_replay([job["trace_file"]], **kw)
    summary = dict(res.summary if hasattr(res, "summary") else res)
    rows = [json.loads(l) for l in open(job["report_path"]) if l.strip()]
    emit({"status": "ok", "version": version, "summary": summary, "records": rows})
except Exception as exc:
    emit({"status": "error", "version": version, "message": "%s: %s" % (type(exc).__name__, exc)})
"""


@attrs.frozen
class Side:
    """One side's outcome: ``ok``, ``hang`` (timeout or model livelock), ``dead_end``, ``error``."""

    status: str
    message: str = ""
    records: Optional[List[Dict[str, Any]]] = None
    summary: Optional[Dict[str, Any]] = None
    seconds: float = 0.0


def run_161(job: Mapping[str, Any], python: str, timeout_s: float) -> Tuple[Side, Optional[str]]:
    """DIFF161-3: the 1.6.1 build on ``job`` (engine args converted, DIFF161-2) in a subprocess;
    a run longer than ``timeout_s`` is a hang.  Also returns the installed version."""
    payload = dict(job)
    for key in ("engine_args", "prefill_engine_args", "decode_engine_args"):
        if payload.get(key) is not None:
            payload[key] = canonical_engine_args(payload[key])
    with tempfile.TemporaryDirectory(prefix="mocker-spec-161-") as tmp:
        payload["out_path"] = os.path.join(tmp, "out.json")
        payload["report_path"] = os.path.join(tmp, "report.jsonl")
        t0 = time.perf_counter()
        from .reference import run_script

        timed_out, code, err = run_script(_RUNNER, payload, timeout_s, python)
        if timed_out:
            return Side("hang", f"no result within {timeout_s:g} s", seconds=timeout_s), None
        dt = time.perf_counter() - t0
        try:
            data = json.loads(Path(payload["out_path"]).read_text())
        except (OSError, ValueError):
            tail = err.strip().splitlines()[-1:] or [f"exit status {code}"]
            return Side("error", f"crashed: {tail[0]}", seconds=dt), None
    if data["status"] == "missing":
        return Side("missing", data["message"]), None
    if data["status"] == "error":
        msg = data.get("message", "")
        status = "dead_end" if _looks_like_dead_end(msg) else "error"
        return Side(status, msg, seconds=dt), data.get("version")
    return Side("ok", "", data.get("records"), data.get("summary"), dt), data.get("version")


def _looks_like_dead_end(message: str) -> bool:
    """DIFF161-3: 1.6.1 reports a stuck replay as an invariant violation ("an effect-free
    zero-duration pass with N in-flight requests remaining"); 1.3.0 as "reached a dead end"."""
    m = message.lower()
    return any(k in m for k in ("in-flight requests remaining", "in flight", "effect-free zero-duration",
                                "dead end", "no progress", "cannot make progress"))


def run_model_side(job: Mapping[str, Any]) -> Side:
    """DIFF161-4: the model (the 1.3.0 spec) on ``job``: livelock is a hang, DRV-8/DIS-12 a dead end."""
    from model.errors import InvalidInput
    from model.replay import ReplayDeadEnd, ReplayError, ReplayLivelock, run_replay
    from model.report import finish

    from .reference import setup_from_job, workload_from_job

    t0 = time.perf_counter()
    try:
        setup = setup_from_job(job)
        workload = workload_from_job(job, setup)
        col = run_replay(setup, workload)
    except ReplayLivelock as exc:
        return Side("hang", str(exc).splitlines()[0], seconds=time.perf_counter() - t0)
    except ReplayDeadEnd as exc:
        return Side("dead_end", exc.message, seconds=time.perf_counter() - t0)
    except (ReplayError, InvalidInput) as exc:
        return Side("error", str(exc), seconds=time.perf_counter() - t0)
    summary, records = finish(col, 0.0)
    return Side("ok", "", [r.to_dict() for r in records], summary, time.perf_counter() - t0)


@attrs.frozen
class CaseDiff:
    case: str
    corpus: str
    mode: str
    engine: str
    requests: int
    kind: str
    detail: str
    model_status: str
    upstream_status: str
    #: DIFF161-7: 1.6.1 duration / 1.3.0 duration (simulated ms) when both complete
    duration_ratio: Optional[float] = None
    #: DIFF161-4: the model reproduces the case's recorded 1.3.0 build outputs (None: not recorded)
    model_matches_130: Optional[bool] = None


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _same(a: Any, b: Any) -> bool:
    if _num(a) and _num(b):
        fa, fb = float(a), float(b)
        return fa == fb or abs(fa - fb) <= REL_TOL * max(abs(fa), abs(fb))
    return a == b


def _requested(row: Mapping[str, Any]) -> Any:
    return row.get("requested_output_length", row.get("output_length"))


def pair_rows(ours: Sequence[Mapping[str, Any]], theirs: Sequence[Mapping[str, Any]]):
    """DIFF161-5: requests of the two reports matched by arrival, input length and requested
    output length (uuids are random upstream), ties kept in report order."""
    def key(r):
        return (float(r.get("arrival_time_ms") or 0.0), int(r.get("input_length") or 0), int(_requested(r) or 0))

    a = sorted(range(len(ours)), key=lambda i: (key(ours[i]), i))
    b = sorted(range(len(theirs)), key=lambda i: (key(theirs[i]), i))
    return [(ours[i], theirs[j]) for i, j in zip(a, b)], [key(ours[i]) == key(theirs[j]) for i, j in zip(a, b)]


#: DIFF161-5: the per-request fields compared (when both reports have them)
COMPARED_FIELDS = (
    "first_admit_ms", "first_token_ms", "last_token_ms", "ttft_ms", "ttst_ms", "e2e_latency_ms", "itl_ms",
    "output_length", "reused_input_tokens", "prefill_worker_idx", "decode_worker_idx", "prefill_admit_ms",
    "source_held_ms", "destination_reserved_ms", "destination_activated_ms", "decode_admit_ms",
    "source_released_ms", "decode_reused_input_tokens",
)


def _inversion(pairs, field: str) -> Optional[str]:
    vals = [(p[0].get(field), p[1].get(field)) for p in pairs]
    for i in range(len(vals)):
        for j in range(i + 1, len(vals)):
            (a1, b1), (a2, b2) = vals[i], vals[j]
            if not all(_num(x) for x in (a1, b1, a2, b2)):
                continue
            if (a1 < a2 and b1 > b2) or (a1 > a2 and b1 < b2):
                return (f"{field}: requests arriving at {pairs[i][0].get('arrival_time_ms')} ms and "
                        f"{pairs[j][0].get('arrival_time_ms')} ms are admitted in opposite orders "
                        f"(1.3.0: {a1:.6g} / {a2:.6g} ms; 1.6.1: {b1:.6g} / {b2:.6g} ms)")
    return None


def classify(ours: Side, theirs: Side) -> Tuple[str, str]:
    """DIFF161-6: the kind of divergence between the model (1.3.0) and 1.6.1, and a one-line detail."""
    if ours.status != "ok" or theirs.status != "ok":
        if ours.status == theirs.status:
            return "identical", f"both {ours.status.replace('_', ' ')}"
        statuses = {ours.status, theirs.status}
        pair = f"1.3.0 {ours.status.replace('_', ' ')}, 1.6.1 {theirs.status.replace('_', ' ')}"
        if "hang" in statuses:
            return "hang", pair + _msg(ours, theirs)
        if "dead_end" in statuses and "ok" in statuses:
            return "dead end vs completion", pair + _msg(ours, theirs)
        return "error", pair + _msg(ours, theirs)
    a = ours.records or []
    b = theirs.records or []
    if len(a) != len(b):
        return "other", f"report rows: 1.3.0 {len(a)}, 1.6.1 {len(b)}"
    pairs, matched = pair_rows(a, b)
    if not all(matched):
        return "other", "the two reports hold different requests (arrival / input / requested output)"
    done_a = sum(1 for r in a if r.get("terminal_status", "completed") == "completed")
    done_b = sum(1 for r in b if r.get("terminal_status", "completed") == "completed")
    if done_a != done_b:
        return "dead end vs completion", f"completed requests: 1.3.0 {done_a}, 1.6.1 {done_b}"
    for field in ("first_admit_ms", "prefill_admit_ms", "decode_admit_ms"):
        inv = _inversion(pairs, field)
        if inv:
            return "admission order", inv
    for x, y in pairs:
        for field in COMPARED_FIELDS:
            if field in x and field in y and not _same(x[field], y[field]):
                kind = "timing" if field.endswith("_ms") else "other"
                return kind, (f"request arriving at {x.get('arrival_time_ms')} ms (input {x.get('input_length')}): "
                              f"{field} 1.3.0 {x[field]!r}, 1.6.1 {y[field]!r}")
    return "identical", "every compared per-request field agrees"


def _msg(ours: Side, theirs: Side) -> str:
    parts = []
    if ours.message:
        parts.append("1.3.0: " + ours.message.splitlines()[0][:160])
    if theirs.message:
        parts.append("1.6.1: " + theirs.message.splitlines()[0][:160])
    return (" (" + "; ".join(parts) + ")") if parts else ""


def _case_engine(case: Mapping[str, Any]) -> str:
    args = case.get("engine_args") or case.get("prefill_engine_args") or {}
    return str(args.get("engine_type", "vllm"))


def diff_case(case_dir: Path, corpus_label: str, python: str, timeout_s: float) -> Tuple[CaseDiff, Optional[str]]:
    case = json.loads((case_dir / "case.json").read_text())
    job = dict(case)
    job["trace_file"] = str(case_dir / "trace.jsonl")
    nreq = sum(1 for line in (case_dir / "trace.jsonl").read_text().splitlines() if line.strip())
    ours = run_model_side(job)
    theirs, version = run_161(job, python, timeout_s)
    if theirs.status == "missing":
        raise RuntimeError(theirs.message)
    kind, detail = classify(ours, theirs)
    ratio = None
    if ours.status == "ok" and theirs.status == "ok":
        a = (ours.summary or {}).get("duration_ms")
        b = (theirs.summary or {}).get("duration_ms")
        if _num(a) and _num(b) and a > 0:
            ratio = float(b) / float(a)
    return CaseDiff(case_dir.name, corpus_label, case.get("mode", "agg"), _case_engine(case), nreq, kind, detail,
                    ours.status, theirs.status, ratio, recorded_agreement(case_dir, ours)), version


def recorded_agreement(case_dir: Path, ours: Side) -> Optional[bool]:
    """DIFF161-4: whether the model's outcome equals the compiled 1.3.0 build's recorded one
    (``expected.*`` of the case, compared as ``mocker-spec diff --corpus`` does); None when the
    case holds no recording."""
    if not (case_dir / "expected.status").exists():
        return None
    from .reference import Outcome, compare, load_case

    _, ref = load_case(case_dir)
    if ours.status == "ok":
        summary = {k: v for k, v in (ours.summary or {}).items() if k != "wall_time_ms"}
        mine = Outcome("ok", "", summary, ours.records)
    elif ours.status == "hang":
        mine = Outcome("livelock", ours.message)
    else:
        mine = Outcome("error", ours.message)
    return compare(mine, ref) is None


def render(diffs: Sequence[CaseDiff], corpora: Sequence[Tuple[str, int]], version: Optional[str],
           timeout_s: float) -> str:
    """DIFF161-7: the Markdown report (no machine paths: corpora are named by label)."""
    counts = {k: sum(1 for d in diffs if d.kind == k) for k in KINDS}
    lines = [
        "# Behaviour diff: dynamo-mocker 1.3.0 (this model) vs ai-dynamo-runtime 1.6.1",
        "",
        "Written by `mocker-spec diff-161` (spec/oracle-kit.md §4, DIFF161-1..DIFF161-7; how to run it: "
        "docs/oracle-kit.md). Each replay case runs on the executable model of the 1.3.0 scheduler and on the "
        f"compiled offline replay of PyPI `ai-dynamo-runtime=={version or '1.6.1'}` "
        f"(engine args in its canonical `{{\"engine\": {{\"backend\": ...}}}}` form, DIFF161-2; "
        f"a run over {timeout_s:g} s counts as a hang). The dead-end detection of the two differs in wording "
        "(1.3.0: \"reached a dead end\"; 1.6.1: \"replay invariant violated: ... effect-free zero-duration "
        "pass with N in-flight requests remaining\"); both count as a dead end here.",
        "",
        "## Corpus",
        "",
        "| corpus | cases |",
        "|---|---|",
    ]
    lines += [f"| {label} | {n} |" for label, n in corpora]
    recorded = [d for d in diffs if d.model_matches_130 is not None]
    agree = sum(1 for d in recorded if d.model_matches_130)
    lines += [f"| total | {len(diffs)} |", ""]
    if recorded:
        lines += [f"{len(recorded)} cases carry the compiled 1.3.0 build's recorded outputs; the model reproduces "
                  f"{agree} of them exactly (column *model = 1.3.0 build* below), so on those a 1.3.0 / 1.6.1 "
                  "difference is a change between the two builds, not a model error.", ""]
    lines += ["## Cases by kind of divergence", "",
              "| kind | cases | meaning |", "|---|---|---|"]
    meaning = {
        "hang": "one side never finishes (1.3.0: a detected zero-time livelock, LIVE-3; 1.6.1: no result "
                "within the timeout), the other finishes or fails",
        "dead end vs completion": "one side stops with requests still in flight (a dead end) or leaves "
                                  "requests uncompleted, the other completes them",
        "error": "one side rejects or fails the run, for another reason than a dead end or hang",
        "admission order": "both complete every request, but two requests are admitted in opposite orders",
        "timing": "same admission order, but some per-request time differs (first divergent field shown)",
        "other": "a non-time per-request field differs (output length, reused tokens, worker), or the "
                 "reports do not match up",
        "identical": "every compared per-request field agrees (or both sides fail the same way)",
    }
    for k in KINDS:
        lines.append(f"| {k} | {counts[k]} | {meaning[k]} |")
    by_mode: Dict[str, Dict[str, int]] = {}
    for d in diffs:
        key = f"{d.mode} {d.engine}"
        by_mode.setdefault(key, {k: 0 for k in KINDS})[d.kind] += 1
    lines += ["", "## By mode and engine", "", "| mode / engine | " + " | ".join(KINDS) + " |",
              "|---|" + "---|" * len(KINDS)]
    for key in sorted(by_mode):
        lines.append(f"| {key} | " + " | ".join(str(by_mode[key][k]) for k in KINDS) + " |")
    ratios = sorted(d.duration_ratio for d in diffs if d.duration_ratio is not None)
    if ratios:
        mid = ratios[len(ratios) // 2]
        lines += ["", "## Simulated duration, 1.6.1 / 1.3.0", "",
                  f"Over the {len(ratios)} cases both sides complete: min {ratios[0]:.3f}, median {mid:.3f}, "
                  f"max {ratios[-1]:.3f}; {sum(1 for r in ratios if r < 1)} faster in 1.6.1, "
                  f"{sum(1 for r in ratios if r > 1)} slower, {sum(1 for r in ratios if r == 1)} equal."]
    for k in KINDS:
        group = [d for d in diffs if d.kind == k]
        if not group:
            continue
        lines += ["", f"## {k} ({len(group)})", "",
                  "| case | corpus | mode | engine | requests | 1.3.0 | model = 1.3.0 build | 1.6.1 | detail |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for d in group:
            detail = d.detail.replace("|", "\\|")
            same = {None: "not recorded", True: "yes", False: "no"}[d.model_matches_130]
            lines.append(f"| {d.case} | {d.corpus} | {d.mode} | {d.engine} | {d.requests} | {d.model_status} | "
                         f"{same} | {d.upstream_status} | {detail} |")
    lines.append("")
    return "\n".join(lines)


def main(args, console) -> int:
    """DIFF161-1: validate, run every case, write the report (atomically) and the optional JSON."""
    from .formats import atomic_write_text, read_input_file
    from .reference import CaseError, case_dirs

    def err(text: str) -> int:
        from .messages import error

        error(text)
        return 2

    if args.timeout <= 0 or not math.isfinite(args.timeout):
        return err(f"--timeout={args.timeout}: must be a positive number of seconds")
    corpora: List[Tuple[str, List[Path]]] = []
    for c in args.corpus:
        p = Path(c)
        if not p.is_dir():
            return err(f"--corpus={c!r}: not a directory")
        dirs = case_dirs(p)
        if not dirs:
            return err(f"--corpus={c!r}: no case directories (case.json) found")
        for d in dirs:  # every case.json readable before any runs
            try:
                read_input_file(d / "case.json", parse_json=True)
            except CaseError as exc:
                return err(f"--corpus={c!r}: {exc}")
        corpora.append((p.name, dirs))
    from .messages import output_file_problem

    for flag, path in (("--out", args.out), ("--json", args.json)):
        problem = None if path is None else output_file_problem(path)
        if problem:  # before the corpus runs, not after
            return err(f"{flag}={path!r}: {problem}")
    if args.json is not None and os.path.realpath(args.json) == os.path.realpath(args.out):
        return err(f"--json={args.json!r}: the same file as --out (one would overwrite the other)")
    if not Path(args.python).exists():
        return err(f"--python={args.python!r}: no such interpreter")
    probe, _ = run_161({"mode": "agg", "engine_args": {}, "trace_file": os.devnull}, args.python, 60.0)
    if probe.status == "missing":
        return err(f"--python={args.python!r}: {probe.message}")
    diffs: List[CaseDiff] = []
    version = None
    total = sum(len(d) for _, d in corpora)
    done = 0
    for label, dirs in corpora:
        for d in dirs:
            diff, v = diff_case(d, label, args.python, args.timeout)
            version = version or v
            diffs.append(diff)
            done += 1
            console.print(f"[{done}/{total}] {label}/{d.name}: {diff.kind}", highlight=False, markup=False)
    text = render(diffs, [(label, len(d)) for label, d in corpora], version, args.timeout)
    atomic_write_text(args.out, text)
    if args.json:
        atomic_write_text(args.json, json.dumps([attrs.asdict(d) for d in diffs], indent=1) + "\n")
    counts = ", ".join(f"{k} {sum(1 for d in diffs if d.kind == k)}" for k in KINDS)
    console.print(f"wrote {args.out}: {len(diffs)} cases ({counts})", highlight=False, markup=False)
    return 0
