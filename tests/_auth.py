"""Token authentication for tests: a secret key written as Pulsar writes one, the broker
configuration that verifies tokens with it, and tokens for roles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.auth import TOKEN_PROVIDER, create_secret_key, create_token

SUPER_USER = "admin"


class Tokens:
    """A secret key in ``directory`` and the tokens it signs."""

    def __init__(self, directory: Path):
        self.key = create_secret_key()
        self.key_file = directory / "secret.key"
        self.key_file.write_bytes(self.key)

    def conf(self, *, authorization: bool = True, **extra: Any) -> dict[str, Any]:
        """A standalone's configuration with token authentication (and authorization)."""
        return {"authenticationEnabled": True, "authenticationProviders": TOKEN_PROVIDER,
                "tokenSecretKey": f"file://{self.key_file}", "authorizationEnabled": authorization,
                "superUserRoles": SUPER_USER, **extra}

    def token(self, role: str, expires_in: float | None = None) -> str:
        return create_token(self.key, role, expires_in=expires_in)
