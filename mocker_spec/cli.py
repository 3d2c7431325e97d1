"""The ``mocker-spec`` command line.

Exit status: 0 ok, 1 a check found a problem (``diff``: the outputs differ) or the replay failed
where upstream fails (an upstream error such as TIME-14's, or a state where upstream panics), 2 bad input (bad
arguments and output paths included: one line on standard error naming the flag or field and its
value, checked before anything runs; nothing is written; also a file that could not be written or
read after those checks, such as on a full disk), 3 the replay reached a dead end, 4 the replay entered a
livelock (where the compiled engine spins forever; a diagnosis is printed).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from rich.console import Console
from rich.table import Table

from model.workload import DEFAULT_TRACE_BLOCK_SIZE

from . import messages


def _transition_tables():
    from model import active_handoffs, destination_holds, ledger, pending_destinations, source_holds

    return (
        source_holds.TRANSITIONS
        + destination_holds.TRANSITIONS
        + active_handoffs.TRANSITIONS
        + pending_destinations.TRANSITIONS
        + ledger.TRANSITIONS
    )


def cmd_transitions(args: argparse.Namespace, console: Console) -> int:
    """Print every state machine's transitions (rule, guard, change, result) from the model's tables."""
    table = Table(title="mocker-spec transitions", show_lines=True)
    for col in ("machine", "operation", "rule", "guard", "change", "result", "errors / quirks"):
        table.add_column(col)
    for t in _transition_tables():
        if args.machine and t.machine != args.machine:
            continue
        table.add_row(t.machine, t.name, t.rule, t.guard, t.change, t.result, "\n".join(t.errors + t.quirks))
    console.print(table)
    return 0


def cmd_invariants(args: argparse.Namespace, console: Console) -> int:
    """Print the invariant registry: one entry per invariant, name and rule id first (never wrapped,
    they are what people search for), then what it applies to and its statement."""
    import textwrap

    import invariants

    console.print(f"[bold]mocker-spec invariants[/] ({len(invariants.REGISTRY)})", highlight=False)
    width = max(console.width - 4, 40)
    for inv in invariants.REGISTRY:
        applies = inv.applies_to if isinstance(inv.applies_to, tuple) else (inv.applies_to,)
        head = f"[bold]{inv.name}[/]  {inv.rule}"
        if inv.quirk:
            head += f"  quirk {inv.quirk}"
        head += "  on " + ", ".join(c.__name__ for c in applies)
        console.print(head, highlight=False, no_wrap=True, overflow="ignore", crop=False)
        for line in textwrap.wrap(" ".join((inv.doc or "").split()), width):
            console.print("    " + line, highlight=False, markup=False)
    return 0


EXIT_OK, EXIT_DIFF, EXIT_BAD_INPUT, EXIT_DEAD_END, EXIT_LIVELOCK = 0, 1, 2, 3, 4

#: runs with more requests than this show a progress bar
PROGRESS_MIN_REQUESTS = 200


class _BadInput(Exception):
    """A one-line input error: ``field=value: reason``."""


def _load_engine_args_text(flag: str, text: Optional[str]):
    """``--*-engine-args``: JSON object text, or the path of a file holding it."""
    import json
    import os

    if text is None:
        return None
    raw = text
    if not text.lstrip().startswith("{"):
        if not os.path.isfile(text):
            raise _BadInput(f"{flag}={text!r}: neither a JSON object nor a readable file")
        try:
            with open(text, encoding="utf-8") as fh:
                raw = fh.read()
        except OSError as exc:
            raise _BadInput(f"{flag}={text!r}: cannot read: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise _BadInput(f"{flag}={text!r}: not UTF-8") from None
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise _BadInput(f"{flag}={text!r}: invalid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise _BadInput(f"{flag}={text!r}: engine args must be a JSON object")
    return obj


def _job_from_args(args: argparse.Namespace) -> dict:
    """The replay job (``mocker_spec.reference`` layout) described by the command line."""
    synthetic = (args.input_tokens, args.output_tokens, args.num_requests)
    using_synthetic = any(v is not None for v in synthetic)
    if (args.trace_file is not None) == using_synthetic:
        raise _BadInput("trace_file: provide either a trace file or all of --input-tokens/--output-tokens/--num-requests")
    if using_synthetic and not all(v is not None for v in synthetic):
        missing = [n for n, v in zip(("--input-tokens", "--output-tokens", "--num-requests"), synthetic) if v is None]
        raise _BadInput(f"{missing[0]}=None: synthetic replay requires --input-tokens, --output-tokens and --num-requests")
    if args.report_jsonl is not None and args.trace_file is None:
        raise _BadInput(f"--report-jsonl={args.report_jsonl!r}: the per-request report only supports trace-file replay")
    outputs = (("--report-jsonl", args.report_jsonl), ("--summary-json", getattr(args, "summary_json", None)))
    for flag, path in outputs:
        problem = None if path is None else messages.output_file_problem(path)
        if problem:
            raise _BadInput(f"{flag}={path!r}: {problem}")
    if all(path is not None for _, path in outputs) and os.path.realpath(outputs[0][1]) == os.path.realpath(outputs[1][1]):
        raise _BadInput(f"--summary-json={outputs[1][1]!r}: the same file as --report-jsonl (one would overwrite the other)")
    if args.trace_file is not None:
        for flag, path in outputs:
            if path is not None and os.path.realpath(path) == os.path.realpath(args.trace_file):
                raise _BadInput(f"{flag}={path!r}: the trace file itself (it would be overwritten)")
    extra = _load_engine_args_text("--extra-engine-args", args.extra_engine_args)
    prefill = _load_engine_args_text("--prefill-engine-args", args.prefill_engine_args)
    decode = _load_engine_args_text("--decode-engine-args", args.decode_engine_args)
    job: dict = {
        "from_cli": True,  # JSON-dialect engine args, every worker count passed (DRV-19)
        "router_mode": args.router_mode,
        "arrival_speedup_ratio": args.arrival_speedup_ratio,
        "trace_block_size": args.trace_block_size,
        "replay_concurrency": args.replay_concurrency,
    }
    for name in ("ttft", "itl", "e2e"):
        if getattr(args, f"sla_{name}_ms") is not None:
            job[f"sla_{name}_ms"] = getattr(args, f"sla_{name}_ms")
    if args.trace_format != "mooncake":
        if args.trace_file is None:
            raise _BadInput(f"--trace-format={args.trace_format!r}: only used with a trace file")
        job["trace_format"] = args.trace_format
    if args.max_sim_time_ms is not None:
        if args.trace_file is None:
            raise _BadInput(f"--max-sim-time-ms={args.max_sim_time_ms}: only supported for trace-file replay")
        job["max_sim_time_ms"] = args.max_sim_time_ms
    if prefill is not None or decode is not None:
        if extra is not None:
            raise _BadInput("--extra-engine-args: cannot be combined with --prefill-engine-args/--decode-engine-args")
        if prefill is None or decode is None:
            flag = "--prefill-engine-args" if prefill is None else "--decode-engine-args"
            raise _BadInput(f"{flag}=None: prefill and decode engine args must be provided together")
        job.update(mode="disagg", prefill_engine_args=prefill, decode_engine_args=decode,
                   num_prefill_workers=args.num_prefill_workers, num_decode_workers=args.num_decode_workers,
                   num_workers=args.num_workers)
    else:
        job.update(mode="agg", engine_args=extra, num_workers=args.num_workers,
                   num_prefill_workers=args.num_prefill_workers, num_decode_workers=args.num_decode_workers)
    if args.trace_file is not None:
        job["trace_file"] = args.trace_file
    else:
        job["synthetic"] = {
            "input_tokens": args.input_tokens,
            "output_tokens": args.output_tokens,
            "request_count": args.num_requests,
            "arrival_interval_ms": args.arrival_interval_ms,
        }
    return job


def _check_numbers(args: argparse.Namespace) -> None:
    import math

    if args.trace_block_size is not None and args.trace_block_size <= 0:
        raise _BadInput(f"--trace-block-size={args.trace_block_size}: must be greater than 0")
    r = args.arrival_speedup_ratio
    # in concurrency mode upstream neither applies nor checks the ratio (spec/replay.md WL-20)
    if args.replay_concurrency is None and (not math.isfinite(r) or r <= 0):
        raise _BadInput(f"--arrival-speedup-ratio={r}: must be finite and greater than 0")
    if args.replay_concurrency is not None and args.replay_concurrency < 1:
        raise _BadInput(f"--replay-concurrency={args.replay_concurrency}: must be at least 1")
    timeout = getattr(args, "timeout", None)
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise _BadInput(f"--timeout={timeout}: must be finite and greater than 0")
    if args.router_mode == "kv_router":
        raise _BadInput("--router-mode='kv_router': not supported yet (the model has no KV router); use round_robin")


def _prepare(args: argparse.Namespace):
    """Parse and validate everything before anything runs: ``(job, setup, workload)``."""
    from model.errors import InvalidInput

    from .reference import check_job_setup, setup_from_job, workload_from_job

    _check_numbers(args)
    job = _job_from_args(args)
    try:
        setup = setup_from_job(job)
        check_job_setup(job, setup)
        workload = workload_from_job(job, setup)
    except InvalidInput as exc:
        if exc.field == "trace" and exc.value is None and job.get("trace_file") is not None:
            # the model never sees the file's name; the whole file is the offending value
            raise _BadInput(f"trace_file={job['trace_file']!r}: {exc.reason}") from None
        raise _BadInput(str(exc)) from None
    return job, setup, workload


def _summary_table(summary, title: str) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("requests", "num_requests", "{:d}"),
        ("completed", "completed_requests", "{:d}"),
        ("input tokens", "total_input_tokens", "{:d}"),
        ("output tokens", "total_output_tokens", "{:d}"),
        ("duration (ms)", "duration_ms", "{:.3f}"),
        ("request throughput (req/s)", "request_throughput_rps", "{:.3f}"),
        ("output throughput (tok/s)", "output_throughput_tok_s", "{:.3f}"),
        ("mean TTFT (ms)", "mean_ttft_ms", "{:.3f}"),
        ("p99 TTFT (ms)", "p99_ttft_ms", "{:.3f}"),
        ("mean ITL (ms)", "mean_itl_ms", "{:.3f}"),
        ("p99 ITL (ms)", "p99_itl_ms", "{:.3f}"),
        ("mean E2E (ms)", "mean_e2e_latency_ms", "{:.3f}"),
        ("p99 E2E (ms)", "p99_e2e_latency_ms", "{:.3f}"),
        ("prefix-cache reuse", "prefix_cache_reused_ratio", "{:.4f}"),
        ("prefill worker-seconds", "prefill_worker_seconds", "{:.6f}"),
        ("decode worker-seconds", "decode_worker_seconds", "{:.6f}"),
    ]
    for label, key, fmt in rows:
        if key in summary:
            table.add_row(label, fmt.format(summary[key]))
    return table


def cmd_replay(args: argparse.Namespace, console: Console) -> int:
    """Run the oracle on a trace file or synthetic requests; print the summary; write the outputs."""
    import gc
    import time

    from model.errors import InternalInvariantBroken, InvalidInput, UpstreamPanic
    from model.report import finish
    from model.replay import ReplayDeadEnd, ReplayError, ReplayLivelock, run_replay

    from .formats import write_report_jsonl, write_summary_json

    err = Console(stderr=True)
    try:
        job, setup, workload = _prepare(args)
    except _BadInput as exc:
        messages.error(str(exc))
        return EXIT_BAD_INPUT
    from model.workload import SessionWorkload

    if isinstance(workload, SessionWorkload):  # DRV-17: every turn of every session is a request
        total = sum(len(s.turns) for s in workload.trace.sessions)
    else:
        total = len(workload.requests)
    started = time.perf_counter()
    # the replay allocates many short-lived frozen values and creates no reference cycles worth
    # collecting mid-run: a higher first-generation threshold saves ~15% of the wall time
    gc_thresholds = gc.get_threshold()
    gc.freeze()  # what is alive now (modules, the workload) is never collected during the run
    gc.set_threshold(20000, 20, 20)
    try:
        if total >= PROGRESS_MIN_REQUESTS and not args.no_progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=err, transient=True) as progress:
                task = progress.add_task("replay", total=total)
                col = run_replay(setup, workload, on_progress=lambda done, _t: progress.update(task, completed=done))
        else:
            col = run_replay(setup, workload)
    except ReplayLivelock as exc:
        messages.error(str(exc))
        return EXIT_LIVELOCK
    except ReplayDeadEnd as exc:
        from model.replay.dead_end import diagnose_dead_end

        messages.error(exc.message)
        for d in diagnose_dead_end(exc.stuck):  # LIVE-6
            messages.say(err, f"  why: {d.text}")
        return EXIT_DEAD_END
    except ReplayError as exc:
        messages.error(exc.message)
        return 1
    except InvalidInput as exc:
        # an input only the running core refuses (vLLM with block_size 1: upstream panics there)
        messages.error(str(exc))
        return EXIT_BAD_INPUT
    except UpstreamPanic as exc:  # an input that makes upstream panic (a duration overflow, TIME-1)
        messages.error(f"upstream panics on this input ({exc.rule}): {exc.message}")
        return EXIT_BAD_INPUT
    except InternalInvariantBroken as exc:
        messages.error(f"upstream would panic here ({exc.rule}): {exc.message}")
        return 1
    finally:
        gc.set_threshold(*gc_thresholds)
        gc.unfreeze()
    wall_ms = (time.perf_counter() - started) * 1000.0
    summary, records = finish(col, wall_ms)
    if args.report_jsonl is not None:
        write_report_jsonl(args.report_jsonl, records)
    if args.summary_json is not None:
        write_summary_json(args.summary_json, summary)
    console.print(_summary_table(summary, "mocker-spec replay"))
    return EXIT_OK


def cmd_diff(args: argparse.Namespace, console: Console) -> int:
    """Compare the oracle with the compiled reference (live, or the recorded corpus)."""
    from .reference import case_dirs, compare, fid7_signature, model_outcome, run_reference, synthetic_as_trace_rows

    if args.corpus is not None:
        import os

        if not os.path.isdir(args.corpus):
            messages.error(f"--corpus={args.corpus!r}: not a directory")
            return EXIT_BAD_INPUT
        dirs = case_dirs(args.corpus)
        if not dirs:
            messages.error(f"--corpus={args.corpus!r}: no case directories (case.json) found")
            return EXIT_BAD_INPUT
        from .reference import CaseError, load_case

        if args.jobs < 1:
            messages.error(f"--jobs={args.jobs}: must be at least 1")
            return EXIT_BAD_INPUT
        try:  # every case read once, before any runs
            loaded = [(d, load_case(d)) for d in dirs]
        except CaseError as exc:
            messages.error(f"--corpus={args.corpus!r}: {exc}")
            return EXIT_BAD_INPUT
        results = _map_cases(_check_one_case, [cr for _, cr in loaded], args.jobs, "diff", not args.no_progress)
        table = Table(title=messages.literal(f"mocker-spec diff --corpus {args.corpus}"))
        for c in ("case", "mode", "engine", "result", "detail"):
            table.add_column(c)
        same = 0
        fid7 = 0
        for (d, (case, _)), (ours, ref, div) in zip(loaded, results):
            engine = (case.get("engine_args") or case.get("prefill_engine_args") or {}).get("engine_type", "vllm")
            if div is None:
                same += 1
                table.add_row(*map(messages.literal, (d.name, str(case.get("mode", "?")), str(engine), "identical",
                                                      "" if ref.status == "ok" else ref.status)))
            else:
                hint = fid7_signature(case, ours, ref)
                fid7 += hint is not None
                table.add_row(*map(messages.literal, (d.name, str(case.get("mode", "?")), str(engine))),
                              messages.literal("differs", "red"),
                              messages.literal(div.describe() + ("" if hint is None else f" ({hint})")))
        console.print(table)
        console.print(f"{same}/{len(dirs)} identical")
        if fid7:
            console.print(f"{fid7} of the {len(dirs) - same} difference(s) carry FID-7's signature (a request reusing "
                          "more tokens in the model; spec/fidelity.md FID-7)", highlight=False)
        return EXIT_OK if same == len(dirs) else EXIT_DIFF

    try:
        job, setup, workload = _prepare(args)
    except _BadInput as exc:
        messages.error(str(exc))
        return EXIT_BAD_INPUT
    import json
    import os
    import tempfile

    ours = model_outcome(job)  # a refusal during the replay is an outcome to compare, not a crash
    ref_job = dict(job)
    note = ""
    with tempfile.TemporaryDirectory(prefix="mocker-spec-diff-") as tmp:
        if "synthetic" in job and job.get("replay_concurrency") is None:
            path = os.path.join(tmp, "synthetic.jsonl")
            with open(path, "w", encoding="utf-8") as fh:
                for row in synthetic_as_trace_rows(workload):
                    fh.write(json.dumps(row) + "\n")
            ref_job.pop("synthetic")
            ref_job.update(trace_file=path, trace_block_size=1, arrival_speedup_ratio=1.0)
            note = " (synthetic requests replayed as an equivalent trace with trace_block_size 1)"
        ref = run_reference(ref_job, timeout_s=args.timeout)
    messages.say(console, f"model: {ours.label()}")
    messages.say(console, f"reference{note}: {ref.label()}")
    if ref.status == "error" and ref.message.startswith("compiled reference not installed"):
        return EXIT_BAD_INPUT
    div = compare(ours, ref)
    if div is None:
        messages.say(console, "identical" if ours.status == "ok" else f"agree: model {ours.status}, reference {ref.status}")
        return EXIT_OK
    messages.say(console, div.describe())
    hint = fid7_signature(job, ours, ref)
    if hint is not None:
        messages.say(console, f"{hint} (spec/fidelity.md FID-7)")
    return EXIT_DIFF


def _check_one_case(item):
    """One corpus case on the model (a worker process's task for ``diff --corpus --jobs``)."""
    from .reference import check_loaded_case

    case, ref = item
    return check_loaded_case(dict(case), ref)


def _map_cases(fn, items: list, jobs: int, label: str, progress: bool) -> list:
    """``fn`` on every item, the results in the items' order, with ``jobs`` worker processes (1: in
    this process) and a transient progress bar on standard error when it is a terminal.  ``fn``
    must be picklable (a module-level function or a ``functools.partial`` of one)."""
    from contextlib import ExitStack

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    results: list = [None] * len(items)
    with ExitStack() as stack:
        advance = lambda: None  # noqa: E731
        err = Console(stderr=True)
        if progress and len(items) > 1 and err.is_terminal:  # no bar (and no stray newline) when redirected
            bar = stack.enter_context(Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(),
                                               TimeElapsedColumn(), console=err, transient=True))
            task = bar.add_task(label, total=len(items))
            advance = lambda: bar.advance(task)  # noqa: E731
        if jobs == 1 or len(items) == 1:
            for i, item in enumerate(items):
                results[i] = fn(item)
                advance()
            return results
        from concurrent.futures import ProcessPoolExecutor, as_completed

        pool = stack.enter_context(ProcessPoolExecutor(max_workers=min(jobs, len(items))))
        futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
        for fut in as_completed(futures):
            results[futures[fut]] = fut.result()
            advance()
    return results


def _add_replay_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace_file", nargs="?", help="mooncake JSONL trace")
    p.add_argument("--extra-engine-args", help="aggregated engine args: JSON object text or a file path")
    p.add_argument("--prefill-engine-args", help="prefill engine args (disaggregated): JSON text or a file path")
    p.add_argument("--decode-engine-args", help="decode engine args (disaggregated): JSON text or a file path")
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--num-prefill-workers", type=int, default=1)
    p.add_argument("--num-decode-workers", type=int, default=1)
    p.add_argument("--replay-concurrency", type=int, help="closed loop: keep this many requests in flight")
    p.add_argument("--router-mode", choices=("round_robin", "kv_router"), default="round_robin")
    p.add_argument("--arrival-speedup-ratio", type=float, default=1.0)
    p.add_argument("--trace-block-size", type=int, default=DEFAULT_TRACE_BLOCK_SIZE,
                   help=f"tokens per hash id in the trace (default {DEFAULT_TRACE_BLOCK_SIZE})")
    p.add_argument("--trace-format", default="mooncake",
                   help="mooncake (default) or mooncake-delta: a session's turns append to its prompt (WL-18)")
    p.add_argument("--input-tokens", type=int, help="synthetic: prompt length")
    p.add_argument("--output-tokens", type=int, help="synthetic: output length")
    p.add_argument("--num-requests", "--request-count", dest="num_requests", type=int, help="synthetic: request count")
    p.add_argument("--arrival-interval-ms", type=float, default=1.0, help="synthetic: arrival spacing")
    p.add_argument("--max-sim-time-ms", type=float,
                   help="stop once the next simulated timestamp passes this (trace files; spec/replay.md DRV-18)")
    for name in ("ttft", "itl", "e2e"):
        p.add_argument(f"--sla-{name}-ms", type=float,
                       help=f"goodput: a completed request is good only if its {name.upper()} is at most this (REP-12)")


def cmd_gen_cases(args: argparse.Namespace, console: Console) -> int:
    """Write seeded cases; with --record, run the compiled reference on each (progress bar)."""
    from pathlib import Path

    from .casegen import write_cases

    import math

    if args.count < 1:
        messages.error(f"--count={args.count}: must be at least 1")
        return 2
    if args.start < 0:
        messages.error(f"--start={args.start}: must be >= 0")
        return 2
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        messages.error(f"--timeout={args.timeout}: must be finite and greater than 0")
        return 2
    problem = messages.output_dir_problem(args.out)
    if problem:
        messages.error(f"--out={args.out!r}: {problem}")
        return 2
    if args.jobs < 1:
        messages.error(f"--jobs={args.jobs}: must be at least 1")
        return 2
    if args.tiny and (args.large or args.tight):
        other = "--large" if args.large else "--tight"
        messages.error(f"--tiny and {other}: cannot be combined (tiny cases draw their own pools)")
        return 2
    from .reference import reference_available, record_case

    if args.record and not reference_available():  # before anything is written
        messages.error("the compiled reference is not installed (pip install -e '.[reference]')")
        return 2
    dirs = write_cases(Path(args.out), args.seed, args.count, args.start, args.concurrency, args.extra_args,
                       args.sessions, args.large, args.tiny, args.tight)
    messages.say(console, f"wrote {len(dirs)} cases under {args.out}")
    if not args.record:
        return 0
    import functools

    counts: dict = {}
    record = functools.partial(record_case, timeout_s=args.timeout)
    for status in _map_cases(record, dirs, args.jobs, "recording the reference", not args.no_progress):
        key = status if not status.startswith("error") else "error"
        counts[key] = counts.get(key, 0) + 1
    console.print("recorded: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line naming the option and value (exit status 2), not the usage dump;
    ``--help`` still shows the usage.  Subcommand parsers are of this class too."""

    def error(self, message: str):  # type: ignore[override]
        messages.error(f"{self.prog}: {message} (see {self.prog} --help)")
        self.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mocker-spec",
        description="Executable reference model of the dynamo-mocker 1.3.0 scheduler.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("transitions", help="print the state machines' transition tables")
    p.add_argument("--machine", help="only this machine (e.g. PendingDestinations)")
    p.set_defaults(func=cmd_transitions)
    p = sub.add_parser("invariants", help="print the registered invariants")
    p.set_defaults(func=cmd_invariants)
    p = sub.add_parser("replay", help="run an offline replay on the model (like python -m dynamo.replay)")
    _add_replay_flags(p)
    p.add_argument("--report-jsonl", help="write the per-request report here (trace-file replay only)")
    p.add_argument("--summary-json", help="write the summary here")
    p.add_argument("--no-progress", action="store_true", help="never show the progress bar")
    p.set_defaults(func=cmd_replay)
    p = sub.add_parser("diff", help="compare the model with the compiled reference (or a recorded corpus)")
    _add_replay_flags(p)
    p.add_argument("--corpus", help="compare every case directory under this path with its recorded outputs")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before the reference counts as hung")
    p.add_argument("--jobs", type=int, default=1,
                   help="with --corpus: run the cases in this many worker processes (default 1)")
    p.add_argument("--no-progress", action="store_true", help="with --corpus: never show the progress bar")
    p.set_defaults(func=cmd_diff, report_jsonl=None)
    p = sub.add_parser("gen-cases", help="write seeded random replay cases (refcases layout), optionally recorded")
    p.add_argument("--out", required=True, help="directory to write the case directories into")
    p.add_argument("--seed", type=int, default=1, help="case family (default 1)")
    p.add_argument("--count", type=int, default=200, help="number of cases (default 200)")
    p.add_argument("--start", type=int, default=0, help="index of the first case (default 0)")
    p.add_argument("--concurrency", action="store_true",
                   help="also draw replay_concurrency and shuffled row orders (genc-* cases; spec/replay.md WL-20)")
    p.add_argument("--extra-args", action="store_true",
                   help="also draw transfer, start-up, GPU-count and router-queue engine args (genx-* cases)")
    p.add_argument("--sessions", action="store_true",
                   help="group the rows into multi-turn sessions (gen*s-* cases; spec/replay.md DRV-17)")
    p.add_argument("--large", action="store_true",
                   help="longer traces (about 50-250 requests) on up to 8 workers (gen*l-* cases)")
    p.add_argument("--tiny", action="store_true",
                   help="edge cases: pools of 1-8 blocks, 1-4 requests, output lengths from 0 (gen*t-* cases)")
    p.add_argument("--tight", action="store_true",
                   help="cut every pool to what the largest request needs plus 0-50%% (gen*p-* cases)")
    p.add_argument("--record", action="store_true", help="record the compiled reference's outputs too")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before the reference counts as hung")
    p.add_argument("--jobs", type=int, default=1, help="with --record: record in this many processes (default 1)")
    p.add_argument("--no-progress", action="store_true", help="with --record: never show the progress bar")
    p.set_defaults(func=cmd_gen_cases)
    _add_plugin_parsers(sub)
    return parser


#: modules that contribute subcommands; each defines ``add_parsers(sub)``
_PLUGINS = ("explore_cli", "oracle_cli", "docs_cli")


def _add_plugin_parsers(sub) -> None:
    import importlib
    import importlib.util

    for name in _PLUGINS:
        if importlib.util.find_spec(f"{__package__}.{name}") is not None:
            importlib.import_module(f".{name}", __package__).add_parsers(sub)


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    try:
        return int(args.func(args, console) or 0)
    except OSError as exc:
        # a file the command had to write or read failed after the up-front checks (a full disk, a
        # path that became unwritable, a mount that refuses what os.access allowed): one line, not
        # a traceback; the writers are atomic, so nothing half-written stays
        where = f"{exc.filename!r}: " if exc.filename is not None else ""
        messages.error(f"{where}{exc.strerror or exc}")
        return 2
    except KeyboardInterrupt:  # pragma: no cover
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
