"""Permissions, as ``namespaces grant-permission`` and ``topics grant-permission`` store
them in the namespace's policies (Pulsar's ``auth_policies``): ``namespace_auth`` maps a
role to its actions in the whole namespace, ``destination_auth`` a topic's name to such a
map for that topic alone. :class:`core.auth.AuthService` reads them."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from ._common import RestError, endpoint, json_body, topic_of

__all__ = ["ACTIONS", "actions_of", "auth_policies", "topic_routes"]

#: Pulsar's AuthAction values.
ACTIONS = ("produce", "consume", "functions", "sources", "sinks", "packages")


async def actions_of(request: Request) -> list[str]:
    """The request body as a list of actions (400 otherwise), sorted, each once."""
    actions = await json_body(request)
    if not isinstance(actions, list) or not all(a in ACTIONS for a in actions):
        raise RestError(400, f"Actions must be a list of: {', '.join(ACTIONS)}")
    return sorted(set(actions))


def auth_policies(policies: dict[str, Any]) -> dict[str, Any]:
    """The namespace ``policies``' auth_policies, created empty where missing."""
    auth = policies.setdefault("auth_policies", {})
    for key in ("namespace_auth", "destination_auth", "subscription_auth_roles"):
        auth.setdefault(key, {})
    return auth  # type: ignore[no-any-return]


def topic_routes(broker: Any, base: str) -> list[Route]:
    """``topics permissions|grant-permission|revoke-permission`` under ``base``."""
    policies = broker.policies

    def namespace_policies(request: Request) -> tuple[Any, dict[str, Any]]:
        name = topic_of(request)
        if policies.get_tenant(name.tenant) is None:
            raise RestError(404, "Tenant does not exist")
        pol = policies.get_namespace(name.namespace_name)
        if pol is None:
            raise RestError(404, "Namespace does not exist")
        return name, pol

    @endpoint
    async def get_permissions(request: Request) -> Any:
        # As Pulsar: the namespace's grants, with the topic's own added.
        name, pol = namespace_policies(request)
        auth = pol.get("auth_policies") or {}
        out = {role: sorted(actions) for role, actions in (auth.get("namespace_auth") or {}).items()}
        for role, actions in ((auth.get("destination_auth") or {}).get(str(name)) or {}).items():
            out[role] = sorted(set(out.get(role, [])) | set(actions))
        return out

    @endpoint
    async def grant(request: Request) -> Any:
        name, _ = namespace_policies(request)
        role, actions = str(request.path_params["role"]), await actions_of(request)

        def apply(p: dict[str, Any]) -> None:
            auth_policies(p)["destination_auth"].setdefault(str(name), {})[role] = actions

        policies.update_namespace(name.namespace_name, apply)

    @endpoint
    async def revoke(request: Request) -> Any:
        name, pol = namespace_policies(request)
        role = str(request.path_params["role"])
        granted = ((pol.get("auth_policies") or {}).get("destination_auth") or {}).get(str(name)) or {}
        if role not in granted:
            raise RestError(412, f"Permissions are not set at the topic level for role {role}")

        def apply(p: dict[str, Any]) -> None:
            per_topic = auth_policies(p)["destination_auth"]
            per_topic.get(str(name), {}).pop(role, None)
            if not per_topic.get(str(name)):
                per_topic.pop(str(name), None)

        policies.update_namespace(name.namespace_name, apply)

    return [
        Route(f"{base}/{{topic}}/permissions", get_permissions, methods=["GET"]),
        Route(f"{base}/{{topic}}/permissions/{{role}}", grant, methods=["POST"]),
        Route(f"{base}/{{topic}}/permissions/{{role}}", revoke, methods=["DELETE"]),
    ]
