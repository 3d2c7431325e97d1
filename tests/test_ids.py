"""ID-1: request and handoff ids are opaque, hashable, typed, ordered and immutable."""

import copy
import pickle

import attrs
import pytest

from model.ids import HandoffId, RequestId, hid, rid


def test_ids_equal_by_kind_and_value():
    assert RequestId("a") == RequestId("a") == rid("a") == rid(RequestId("a"))
    assert hash(RequestId("a")) == hash(rid("a"))
    assert RequestId("a") != HandoffId("a") and HandoffId("a") == hid("a")
    assert len({RequestId("a"), HandoffId("a"), RequestId("b")}) == 3
    assert RequestId("a") != "a" and HandoffId("a") != "a"


def test_ids_order_by_value_within_a_kind():
    values = ["b", "a", "ab", "B", "0", "a-1", "a:b", "zz", "\u00e9"]
    assert [r.value for r in sorted(RequestId(v) for v in values)] == sorted(values)
    assert [h.value for h in sorted(HandoffId(v) for v in values)] == sorted(values)


def test_id_text_and_value():
    r, h = RequestId("x-1"), HandoffId("x-1")
    assert (repr(r), str(r), f"{r}", "%s" % r) == ("r:x-1",) * 4
    assert (repr(h), str(h)) == ("h:x-1", "h:x-1")
    assert r.value == "x-1" and h.value == "x-1" and RequestId(h).value == "x-1"
    assert type(r.value) is str


def test_ids_are_immutable_and_round_trip():
    r = RequestId("q")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        r.value = "z"
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        del r.value
    for clone in (pickle.loads(pickle.dumps(r)), copy.copy(r), copy.deepcopy(r)):
        assert type(clone) is RequestId and clone == r and clone.value == "q"


@pytest.mark.parametrize("bad", ["", None, 3, b"x"])
def test_ids_reject_non_strings(bad):
    with pytest.raises(TypeError):
        RequestId(bad)
    with pytest.raises(TypeError):
        HandoffId(bad)
