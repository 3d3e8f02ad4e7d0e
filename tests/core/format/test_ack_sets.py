"""Ack sets (Pulsar's batch-index bitmaps): the one-message form equals the general one."""

from __future__ import annotations

import pytest

from core.format import ack_set, ack_set_but


@pytest.mark.parametrize("size", [1, 2, 63, 64, 65, 127, 128, 129, 1000])
def test_all_but_one_is_the_general_ack_set(size: int) -> None:
    for index in {0, size // 2, size - 1}:
        assert ack_set_but(index, size) == ack_set(set(range(size)) - {index}, size)


def test_words_are_signed_int64_least_significant_bit_first() -> None:
    assert ack_set_but(0, 64) == [-2]           # every bit but bit 0
    assert ack_set_but(63, 64) == [(1 << 63) - 1]
    assert ack_set_but(1, 3) == [0b101]
