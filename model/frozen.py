"""An immutable, hashable dict for hot model state.

pyrsistent's ``PMap`` is implemented in Python and costs microseconds per
lookup; the engine cores read their request maps thousands of times per pass.
``FrozenDict`` is a ``dict`` subclass whose mutating methods raise, with a
cached hash: reads run at dict speed and a transaction copies it in C
(:func:`draft`) and freezes the copy in place (:func:`adopt`).  It is used where
a whole map is rebuilt per operation anyway; pyrsistent stays where structural
sharing pays.
"""

from __future__ import annotations

from typing import Any


def _immutable(self, *args: Any, **kwargs: Any):
    raise TypeError("FrozenDict is immutable")


class FrozenDict(dict):
    __slots__ = ("_hash",)

    def __hash__(self) -> int:  # type: ignore[override]
        try:
            return self._hash
        except AttributeError:
            h = hash(frozenset(dict.items(self)))
            object.__setattr__(self, "_hash", h)
            return h

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"

    def __reduce__(self):
        return (FrozenDict, (dict(self),))

    __setitem__ = __delitem__ = _immutable
    clear = pop = popitem = setdefault = update = _immutable
    __ior__ = _immutable

    def set(self, key: Any, value: Any) -> "FrozenDict":
        """A copy with ``key`` set (for occasional use; transactions copy once instead)."""
        d = dict(self)
        d[key] = value
        return FrozenDict(d)


EMPTY = FrozenDict()


class _Draft(dict):
    """A transaction's working copy of a map: a mutable dict with the layout of :class:`FrozenDict`."""

    __slots__ = ("_hash",)


def draft(src: Any = ()) -> dict:
    """A mutable working copy of ``src`` for one transaction, to be frozen with :func:`adopt`."""
    return _Draft(src)


def adopt(d: dict) -> FrozenDict:
    """Freeze a transaction's draft without copying it (the draft becomes the frozen map; the
    transaction must not touch it afterwards).  Any other mapping is copied."""
    if type(d) is _Draft:
        d.__class__ = FrozenDict
        return d  # type: ignore[return-value]
    return d if type(d) is FrozenDict else FrozenDict(d)
