"""The replay set of a subscription (core.subscription.ReplaySet): positions in order, and
the key hashes and message counts of what waits in it."""

from __future__ import annotations

import pytest

from core.storage import Position
from core.subscription import ReplaySet


def test_it_knows_the_keys_and_messages_of_what_waits_until_it_leaves() -> None:
    r = ReplaySet()
    r.add(Position(1, 5), 7, 10)
    r.add(Position(1, 2), 7, 1)
    r.add(Position(1, 9), -1, 3)  # key unknown
    r.add(Position(1, 2), 9, 50)  # already there: unchanged
    assert list(r) == [Position(1, 2), Position(1, 5), Position(1, 9)]
    assert r.holds_key(7) and not r.holds_key(9) and r.messages == 14
    r.discard(Position(1, 5))
    assert r.holds_key(7) and r.messages == 4  # one entry of key 7 still waits
    r.difference_update([Position(1, 2), Position(3, 3)])
    assert not r.holds_key(7) and r.messages == 3 and list(r) == [Position(1, 9)]
    r.discard(Position(1, 9))
    r.discard(Position(1, 9))
    assert not r and r.messages == 0
    r.add(Position(2, 0), 4, 2)
    r.clear()
    assert not r and not r.holds_key(4) and r.messages == 0


def test_every_way_out_keeps_the_counts() -> None:
    r = ReplaySet()
    for e in range(4):
        r.add(Position(1, e), 5, 2)
    assert r.pop() == Position(1, 3) and r.pop(0) == Position(1, 0)
    r.remove(Position(1, 1))
    assert list(r) == [Position(1, 2)] and r.messages == 2 and r.holds_key(5)
    r.remove(Position(1, 2))
    assert not r.holds_key(5) and r.messages == 0
    with pytest.raises(KeyError):
        r.remove(Position(1, 2))
