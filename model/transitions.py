"""Transitions as data: every state machine lists its operations in a ``TRANSITIONS`` table.

The table is what the spec, the docs generator and the coverage checks read; the
functions it names are the executable definitions.  Each entry names its spec
rule id, so ``rule id -> function -> invariant -> test`` can be followed both ways.
"""

from __future__ import annotations

from typing import Tuple

import attrs


@attrs.frozen
class Transition:
    """One operation of one state machine, written as guard -> change -> result."""

    machine: str
    name: str
    rule: str
    guard: str
    change: str
    result: str
    errors: Tuple[str, ...] = ()
    quirks: Tuple[str, ...] = ()
