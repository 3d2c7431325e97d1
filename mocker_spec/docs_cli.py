"""``mocker-spec docs``: regenerate docs/generated/ from the model, or check that it is current.

Exit status: 0 up to date (or regenerated), 1 ``--check`` found stale files (listed), 2 bad
arguments.
"""

from __future__ import annotations

import argparse
import pathlib

from rich.console import Console


def cmd_docs(args: argparse.Namespace, console: Console) -> int:
    """Regenerate the generated documentation (docs/generated/); with --check, only compare."""
    from . import docs_gen, messages

    root = pathlib.Path(args.root) if args.root else docs_gen.ROOT
    if not (root / "spec").is_dir() or not (root / "model").is_dir():
        messages.error(f"--root={str(root)!r}: not a project root (no spec/ and model/)")
        return 2
    parts = None
    if args.only:
        parts = set(args.only)
        bad = sorted(p for p in parts if p not in docs_gen.PARTS and not p.startswith("lifecycle:"))
        if bad:
            messages.error(f"--only={bad[0]!r}: unknown part (choose from {', '.join(docs_gen.PARTS)}, "
                           "lifecycle:<scenario>)")
            return 2
    if args.check:
        stale = docs_gen.check(root, parts)
        if not stale:
            console.print("docs/generated is up to date", highlight=False)
            return 0
        console.print(f"[red]{len(stale)} stale file(s)[/]; run `mocker-spec docs` to regenerate:", highlight=False)
        for path, reason in stale:
            console.print(f"  {path}: {reason}", highlight=False, markup=False)
        return 1
    written, removed, drew = docs_gen.write(root, parts)
    for path in written:
        console.print(f"wrote {path}", highlight=False, markup=False)
    for path in removed:
        console.print(f"removed {path}", highlight=False, markup=False)
    if not written and not removed:
        console.print("docs/generated is up to date", highlight=False)
    if not drew:
        console.print("graphviz `dot` not found: SVG drawings not made (Mermaid and DOT are)", highlight=False)
    return 0


def add_parsers(sub) -> None:
    """Register the ``docs`` subcommand on the CLI's subparsers."""
    p = sub.add_parser("docs", help="regenerate the design documentation generated from the model (docs/generated)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 listing the stale files if anything would change")
    p.add_argument("--only", action="append", metavar="PART",
                   help="only this part (index, transitions, commands, invariants, lifecycle, counterexamples, "
                        "cli, rules, or lifecycle:<scenario>); repeatable")
    p.add_argument("--root", help="project root (default: the one this package belongs to)")
    p.set_defaults(func=cmd_docs)
