"""The ack sets a compacted view gives batches it keeps in part: Pulsar's bit layout."""

from __future__ import annotations

import pytest

from core.format import ack_set


@pytest.mark.parametrize("indexes, size, words", [
    ({2}, 3, [0b100]),
    ({0, 2}, 3, [0b101]),
    ({63}, 64, [-(1 << 63)]),            # bit 63 is the int64's sign bit
    ({64}, 65, [0, 1]),                   # a second word from the 65th message on
    (set(), 130, [0, 0, 0]),
])
def test_ack_set_bits_are_the_messages_still_delivered(indexes, size, words):
    assert ack_set(indexes, size) == words
