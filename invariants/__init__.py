"""Named invariants over model states, each tied to a spec rule id.

The registry is a constant tuple collected from the modules in ``_MODULES``;
later layers (engine cores, replay, explorer) add a module there.  Checking a
state also checks every attrs-valued field of it, recursively, so an invariant
written for a machine is enforced wherever that machine is embedded.
"""

from __future__ import annotations

from typing import Callable, Iterator, List, Optional, Tuple, Type, Union

import attrs

from model.errors import ModelError


@attrs.frozen
class Invariant:
    """A named predicate: ``check(state)`` returns ``None`` when it holds, else a message."""

    name: str
    rule: str
    applies_to: Union[Type, Tuple[Type, ...]]
    check: Callable[[object], Optional[str]]
    doc: str
    #: the upstream quirk this invariant is written around, if any
    quirk: Optional[str] = None


@attrs.frozen
class Violation:
    invariant: Invariant
    message: str
    path: str

    def __str__(self) -> str:
        where = f" at {self.path}" if self.path else ""
        return f"{self.invariant.name} ({self.invariant.rule}){where}: {self.message}"


class InvariantViolation(ModelError):
    """Raised by :func:`assert_holds` with every violation found."""

    def __init__(self, violations: List[Violation]) -> None:
        self.violations = violations
        super().__init__("; ".join(str(v) for v in violations))


from . import handoff as _handoff  # noqa: E402
from . import sglang_core as _sglang_core  # noqa: E402
from . import vllm_core as _vllm_core  # noqa: E402

_MODULES = (_handoff, _vllm_core, _sglang_core)

#: every registered invariant
REGISTRY: Tuple[Invariant, ...] = tuple(inv for mod in _MODULES for inv in mod.INVARIANTS)


def by_name(name: str) -> Invariant:
    for inv in REGISTRY:
        if inv.name == name:
            return inv
    raise KeyError(name)


def applicable(state: object) -> Tuple[Invariant, ...]:
    return applicable_to_type(type(state))


def applicable_to_type(cls: type) -> Tuple[Invariant, ...]:
    """The invariants that apply to instances of ``cls``."""
    return tuple(inv for inv in REGISTRY if issubclass(cls, inv.applies_to))


def _walk(state: object, path: str) -> Iterator[Tuple[object, str]]:
    yield state, path
    if attrs.has(type(state)):
        for field in attrs.fields(type(state)):
            value = getattr(state, field.name)
            if attrs.has(type(value)):
                yield from _walk(value, f"{path}.{field.name}" if path else field.name)


def violations(state: object) -> List[Violation]:
    """Every violated invariant of ``state`` and of its nested machine states."""
    out: List[Violation] = []
    for sub, path in _walk(state, ""):
        for inv in applicable(sub):
            message = inv.check(sub)
            if message is not None:
                out.append(Violation(inv, message, path))
    return out


def assert_holds(state: object) -> None:
    found = violations(state)
    if found:
        raise InvariantViolation(found)
