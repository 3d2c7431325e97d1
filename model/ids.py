"""Request and handoff identifiers (spec/handoff-lifecycle.md §1, rule ID-1).

Upstream uses UUIDs for both.  The model treats ids as opaque, hashable,
totally ordered values: replay uses UUID strings, scenarios use short names
such as ``"X"``.  Ordering exists only so that canonical states and reports are
deterministic; no rule of the scheduler depends on it.

An id is an immutable string whose text is its kind's prefix and its value
(``"r:X"``, ``"h:X"``): hashing, equality and ordering are the string's own
(so ids are cheap dictionary keys), ids of different kinds never compare equal
(their prefixes differ), and ids of one kind order as their values do.  The
value is ``.value``; ``repr`` and ``str`` give the prefixed text.
"""

from __future__ import annotations

import attrs


def _as_str(value: object) -> str:
    if isinstance(value, _Id):
        return value.value
    if not isinstance(value, str) or not value:
        raise TypeError(f"an id must be a non-empty string, got {value!r}")
    return value


class _Id(str):
    """An opaque id: the text ``prefix + value``; ``value`` is kept alongside, read-only."""

    _prefix = ""

    def __new__(cls, value: "str | _Id"):
        v = _as_str(value)
        self = str.__new__(cls, cls._prefix + v)
        self.__dict__["value"] = v
        return self

    # the string's own C-level slots (also restated so no subclass hook replaces them)
    __hash__ = str.__hash__
    __repr__ = str.__str__

    def __setattr__(self, name, value):
        raise attrs.exceptions.FrozenInstanceError()

    def __delattr__(self, name):
        raise attrs.exceptions.FrozenInstanceError()

    def __reduce__(self):
        return (type(self), (self.__dict__["value"],))

    def __reduce_ex__(self, protocol):
        return self.__reduce__()


class RequestId(_Id):
    """ID-1: an opaque request id (upstream: the request UUID)."""

    _prefix = "r:"


class HandoffId(_Id):
    """ID-1: an opaque handoff id (upstream: ``HandoffId``, a wrapped UUID).

    The source and destination namespaces are independent: the same handoff id
    may name a source hold and a destination on one core (LEDGER-3).
    """

    _prefix = "h:"


def rid(value: "str | RequestId") -> RequestId:
    """Coerce a string (or id) to a :class:`RequestId`."""
    return value if isinstance(value, RequestId) else RequestId(value)


def hid(value: "str | HandoffId") -> HandoffId:
    """Coerce a string (or id) to a :class:`HandoffId`."""
    return value if isinstance(value, HandoffId) else HandoffId(value)
