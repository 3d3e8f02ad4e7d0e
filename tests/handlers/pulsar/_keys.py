"""The test-only RSA key pair for end-to-end encrypted messages."""

from __future__ import annotations

from pathlib import Path

import pulsar

KEYS = Path(__file__).parent / "keys"


def key_reader() -> pulsar.CryptoKeyReader:
    """A reader of the test key pair (the producer encrypts with the public key, a
    consumer decrypts with the private one)."""
    return pulsar.CryptoKeyReader(str(KEYS / "test-public.pem"), str(KEYS / "test-private.pem"))
