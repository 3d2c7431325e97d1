"""The ``mocker-spec`` command line.

Exit status: 0 ok, 1 a check found a problem, 2 bad input (bad arguments included).
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from rich.console import Console
from rich.table import Table


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
    """Print the invariant registry."""
    import invariants

    table = Table(title="mocker-spec invariants")
    for col in ("name", "rule", "applies to", "quirk", "statement"):
        table.add_column(col)
    for inv in invariants.REGISTRY:
        applies = inv.applies_to if isinstance(inv.applies_to, tuple) else (inv.applies_to,)
        table.add_row(inv.name, inv.rule, ", ".join(c.__name__ for c in applies), inv.quirk or "",
                      " ".join((inv.doc or "").split()))
    console.print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    try:
        return int(args.func(args, console) or 0)
    except KeyboardInterrupt:  # pragma: no cover
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
