"""``mocker-spec explore``: exhaustive exploration of a handoff scenario (spec/model-checking.md MC-50).

Exit status: 0 no violation, 1 a violation was found, 2 the scenario is invalid.
"""

from __future__ import annotations

import argparse

from rich.console import Console

FORMATS = ("dot", "graphml", "json", "itf", "mermaid")


def cmd_explore(args: argparse.Namespace, console: Console) -> int:
    """MC-50: explore SCENARIO; print the summary and each violation's shortest counterexample."""
    from explorer import ScenarioError, explore, load_scenario
    from explorer import outputs

    from . import messages

    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as err:
        messages.error(str(err), label="bad scenario")
        return 2
    formats = [f.strip() for f in (args.format or "").split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        messages.error(f"--format={unknown[0]!r}: unknown format (choose from {', '.join(FORMATS)})")
        return 2
    for flag, value in (("--max-states", args.max_states), ("--max-depth", args.max_depth)):
        if value is not None and value < 1:
            messages.error(f"{flag}={value}: must be at least 1")
            return 2
    problem = None if args.out is None else messages.output_dir_problem(args.out)
    if problem:
        messages.error(f"--out={args.out!r}: {problem}")
        return 2
    try:
        exp = explore(
            scenario,
            max_states=args.max_states,
            max_depth=args.max_depth,
            symmetry=args.symmetry,
            stop_at_first=args.stop_at_first,
            progress=not args.no_progress and console.is_terminal,
        )
    except ImportError as err:
        messages.error(f"no {scenario.engine_type} core in this model yet: {err}")
        return 2
    outputs.print_report(exp, console)
    if args.out:
        written = outputs.write_outputs(exp, args.out, formats or list(FORMATS))
        for path in written:
            messages.say(console, f"wrote {path}")
    return 1 if exp.violations else 0


def add_parsers(sub) -> None:
    """Register the ``explore`` subcommand on the CLI's subparsers."""
    p = sub.add_parser("explore", help="explore every reachable state of a handoff scenario (model checking)")
    p.add_argument("scenario", help="scenario file (.json or .toml; spec/scenarios.md)")
    p.add_argument("--max-states", type=int, help="stop after this many distinct states (default: the scenario's bound)")
    p.add_argument("--max-depth", type=int, help="do not expand states deeper than this (default: the scenario's bound)")
    p.add_argument("--stop-at-first", action="store_true",
                   help="stop at the first safety violation (still a shortest one; liveness and eventually goals "
                        "are then not checked)")
    p.add_argument("--symmetry", action=argparse.BooleanOptionalAction, default=None,
                   help="reduce interchangeable request ids (safety checks only; default: the scenario's setting)")
    p.add_argument("--out", help="write counterexamples, goal witnesses, exports and the summary into this directory")
    p.add_argument("--format", default=",".join(FORMATS),
                   help=f"comma-separated export formats ({', '.join(FORMATS)}); default all")
    p.add_argument("--no-progress", action="store_true", help="never show the progress bar")
    p.set_defaults(func=cmd_explore)
