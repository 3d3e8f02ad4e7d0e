"""Murmur3 (32-bit, x86 variant), the hash Pulsar uses to place keys in Key_Shared ranges."""

from __future__ import annotations

__all__ = ["murmur3_32", "key_hash", "KEY_HASH_RANGE"]

KEY_HASH_RANGE = 65536
_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_MASK = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def murmur3_32(data: bytes, seed: int = 0) -> int:
    h = seed & _MASK
    n = len(data)
    tail_start = n - (n & 3)
    for i in range(0, tail_start, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _C1) & _MASK
        k = _rotl(k, 15)
        k = (k * _C2) & _MASK
        h ^= k
        h = _rotl(h, 13)
        h = (h * 5 + 0xE6546B64) & _MASK
    k = 0
    tail = data[tail_start:]
    if len(tail) >= 3:
        k ^= tail[2] << 16
    if len(tail) >= 2:
        k ^= tail[1] << 8
    if tail:
        k ^= tail[0]
        k = (k * _C1) & _MASK
        k = _rotl(k, 15)
        k = (k * _C2) & _MASK
        h ^= k
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    return h


def key_hash(key: bytes) -> int:
    """The slot of `key` in the Key_Shared hash space [0, 65536)."""
    return (murmur3_32(key) & 0x7FFFFFFF) % KEY_HASH_RANGE
