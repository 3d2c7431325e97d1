"""The oracle kit's subcommands: ``check``, ``vectors`` and ``diff-161`` (spec/step-trace.md,
spec/oracle-kit.md).

Exit status: ``check`` 0 every trace conforms, 1 a trace diverges, 2 a trace is malformed;
``vectors`` 0, or 2 for bad arguments (nothing is written); ``diff-161`` 0 report written, 2 bad
arguments or the 1.6.1 build is missing (nothing is written).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import List

from rich.console import Console

from . import messages
from .messages import say as _say


def _trace_files(paths: List[str]) -> List[Path]:
    out: List[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(path.rglob("*.jsonl"))
            if not found:
                raise ValueError(f"TRACE={p!r}: the directory holds no .jsonl trace")
            out.extend(found)
        else:
            out.append(path)
    return out


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    """STEP-16..STEP-18: replay each trace on the model; report ``conforms`` or the first divergence."""
    from . import steptrace as S

    if not args.rel_tol >= 0:  # NaN too: it was taken and silently meant 0
        messages.error(f"--rel-tol={args.rel_tol}: must be a number >= 0")
        return 2
    try:
        files = _trace_files(args.trace)
    except ValueError as exc:
        messages.error(str(exc))
        return 2
    single = len(files) == 1
    diverged = bad = 0
    for f in files:
        try:
            report = S.check_trace(S.read_trace(f), rel_tol=args.rel_tol)
        except S.BadTrace as exc:
            bad += 1
            messages.error(f"bad trace {f}: {exc}" if not single else f"bad trace: {exc}")
            continue
        if report.conforms:
            if single or args.verbose:
                for line in report.lines():
                    _say(console, line if single else f"{f}: {line}")
            continue
        diverged += 1
        lines = report.lines()
        if not single:
            _say(console, f"{f}:")
            lines = ["  " + x for x in lines]
        for line in lines:
            _say(console, line)
    if not single:
        _say(console, f"{len(files) - diverged - bad}/{len(files)} traces conform"
                      + (f", {diverged} diverge" if diverged else "") + (f", {bad} malformed" if bad else ""))
    if bad:
        return 2
    return 1 if diverged else 0


def cmd_vectors(args: argparse.Namespace, console: Console) -> int:
    """VEC-1: write the conformance-vector corpus."""
    from . import vectors as V

    engines = [e.strip() for e in args.engine.split(",") if e.strip()]
    unknown = [e for e in engines if e not in V.ENGINES]
    if not engines or unknown:
        messages.error(f"--engine={args.engine!r}: choose from {', '.join(V.ENGINES)} (comma-separated)")
        return 2
    if args.max_states < 1:
        messages.error(f"--max-states={args.max_states}: must be at least 1")
        return 2
    if args.sequences < 0:
        messages.error(f"--sequences={args.sequences}: must be >= 0")
        return 2
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        messages.error(f"--out={args.out!r}: exists and is not an empty directory")
        return 2
    problem = messages.output_dir_problem(args.out)
    if problem:
        messages.error(f"--out={args.out!r}: {problem}")
        return 2
    root = Path(args.scenarios) if args.scenarios else V.default_scenario_root()
    if not root.is_dir():
        messages.error(f"--scenarios={str(root)!r}: not a directory")
        return 2
    try:
        lib = V.library(root)
    except ValueError as exc:
        messages.error(f"--scenarios={str(root)!r}: {exc}")
        return 2
    names = None
    if args.scenario:
        names = [s.strip() for s in args.scenario.split(",") if s.strip()]
        known = {obj.get("name") for _, obj in lib}
        missing = [n for n in names if n not in known]
        if missing:
            messages.error(f"--scenario={missing[0]!r}: no such scenario in the library")
            return 2
    progress = None
    if console.is_terminal and not args.no_progress:
        err = Console(stderr=True)
        progress = lambda label: err.print(f"  {label}", highlight=False, markup=False)  # noqa: E731
    corpus = V.build_corpus(engines, scenario_root=root, scenarios=names, max_states=args.max_states,
                            sequences=args.sequences, seed=args.seed, progress=progress)
    n = V.write_corpus(out, corpus)
    vecs = sum(1 for p in corpus.files if p.endswith(".jsonl"))
    pairs = sum(c.pairs for c in corpus.coverage)
    covered = sum(c.covered for c in corpus.coverage)
    _say(console, f"wrote {vecs} vectors ({n} files) under {args.out}: "
                  f"{covered}/{pairs} (phase, action) pairs covered on {', '.join(engines)}")
    return 0


def cmd_diff161(args: argparse.Namespace, console: Console) -> int:
    """DIFF161-1: run the 1.6.1 build and the 1.3.0 model over a corpus; write the diff report."""
    from . import upstream161 as U

    return U.main(args, console)


def add_parsers(sub) -> None:
    """Register ``check``, ``vectors`` and ``diff-161`` on the CLI's subparsers."""
    p = sub.add_parser("check", help="replay step traces on the model: conforms, or the first divergence")
    p.add_argument("trace", nargs="+", metavar="TRACE", help="step-trace JSONL file(s) or directories of them")
    p.add_argument("--rel-tol", type=float, default=0.0, help="relative tolerance for floats (default 0: exact)")
    p.add_argument("--verbose", action="store_true", help="with several traces, also list the conforming ones")
    p.set_defaults(func=cmd_check)

    from .vectors import DEFAULT_MAX_STATES, DEFAULT_SEED, DEFAULT_SEQUENCES, ENGINES

    p = sub.add_parser("vectors", help="write the conformance-vector corpus (step traces with the model's effects)")
    p.add_argument("--out", required=True, help="directory to create (must be absent or empty)")
    p.add_argument("--engine", default=",".join(ENGINES), help=f"comma-separated engines (default {','.join(ENGINES)})")
    p.add_argument("--scenarios", help="scenario library directory (default: the repository's spec/scenarios)")
    p.add_argument("--scenario", help="only these library scenarios (comma-separated names)")
    p.add_argument("--max-states", type=int, default=DEFAULT_MAX_STATES,
                   help=f"explored states per scenario and engine (default {DEFAULT_MAX_STATES})")
    p.add_argument("--sequences", type=int, default=DEFAULT_SEQUENCES,
                   help=f"Hypothesis sequences per engine (default {DEFAULT_SEQUENCES})")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"seed of the sequences (default {DEFAULT_SEED})")
    p.add_argument("--no-progress", action="store_true", help="print no progress lines")
    p.set_defaults(func=cmd_vectors)

    p = sub.add_parser("diff-161", help="behaviour diff of the 1.3.0 model against the ai-dynamo-runtime 1.6.1 build")
    p.add_argument("--corpus", action="append", required=True,
                   help="a directory of replay cases (case.json + trace.jsonl); repeat for several")
    p.add_argument("--out", required=True, help="the Markdown report to write")
    p.add_argument("--python", required=True,
                   help="the Python interpreter of an environment with ai-dynamo-runtime==1.6.1 installed")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a 1.6.1 run counts as hung")
    p.add_argument("--json", help="also write the per-case results as JSON here")
    p.set_defaults(func=cmd_diff161)
