"""The oracle kit's subcommands: ``check`` (spec/step-trace.md).

Exit status: ``check`` 0 every trace conforms, 1 a trace diverges, 2 a trace is malformed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import List

from rich.console import Console


def _say(console: Console, text: str) -> None:
    console.print(text, highlight=False, soft_wrap=True, markup=False)


def _error(text: str) -> None:
    Console(stderr=True).print(f"error: {text}", highlight=False, soft_wrap=True, markup=False)


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

    if args.rel_tol < 0:
        _error(f"--rel-tol={args.rel_tol}: must be >= 0")
        return 2
    try:
        files = _trace_files(args.trace)
    except ValueError as exc:
        _error(str(exc))
        return 2
    single = len(files) == 1
    diverged = bad = 0
    for f in files:
        try:
            report = S.check_trace(S.read_trace(f), rel_tol=args.rel_tol)
        except S.BadTrace as exc:
            bad += 1
            _error(f"bad trace {f}: {exc}" if not single else f"bad trace: {exc}")
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


def add_parsers(sub) -> None:
    """Register ``check`` on the CLI's subparsers."""
    p = sub.add_parser("check", help="replay step traces on the model: conforms, or the first divergence")
    p.add_argument("trace", nargs="+", metavar="TRACE", help="step-trace JSONL file(s) or directories of them")
    p.add_argument("--rel-tol", type=float, default=0.0, help="relative tolerance for floats (default 0: exact)")
    p.add_argument("--verbose", action="store_true", help="with several traces, also list the conforming ones")
    p.set_defaults(func=cmd_check)
