"""Permissions, as ``namespaces grant-permission`` and ``topics grant-permission`` store
them in the namespace's policies (Pulsar's ``auth_policies``): ``namespace_auth`` maps a
role to its actions in the whole namespace, ``destination_auth`` a topic's name to such a
map for that topic alone, ``subscription_auth_roles`` a subscription's name to the only
roles that may consume with it (``grant-subscription-permission``); with the namespace's
``subscription_auth_mode`` Prefix, a role may only use subscriptions named after it.
:class:`core.auth.AuthService` reads them."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ._common import RestError, endpoint, json_body, topic_of

__all__ = ["ACTIONS", "SUBSCRIPTION_AUTH_MODES", "actions_of", "auth_policies", "namespace_routes",
           "topic_routes"]

#: Pulsar's AuthAction values.
ACTIONS = ("produce", "consume", "functions", "sources", "sinks", "packages")
#: Pulsar's SubscriptionAuthMode values.
SUBSCRIPTION_AUTH_MODES = ("None", "Prefix")


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


def namespace_routes(broker: Any, base: str, existing: Any) -> list[Route]:
    """A namespace's subscription permissions and subscription auth mode under ``base``;
    ``existing(request)`` gives the namespace and its policies (404 otherwise)."""
    policies = broker.policies

    @endpoint
    async def get_subscription_permissions(request: Request) -> Any:
        _, pol = existing(request)
        return (pol.get("auth_policies") or {}).get("subscription_auth_roles") or {}

    @endpoint
    async def grant_subscription(request: Request) -> Any:
        ns, _ = existing(request)
        subscription = str(request.path_params["subscription"])
        roles = await json_body(request)
        if not isinstance(roles, list) or not all(isinstance(r, str) and r for r in roles):
            raise RestError(400, "Roles must be a list of role names")

        def apply(p: dict[str, Any]) -> None:
            granted = auth_policies(p)["subscription_auth_roles"]
            granted[subscription] = sorted(set(granted.get(subscription, [])) | set(roles))

        policies.update_namespace(ns, apply)

    @endpoint
    async def revoke_subscription(request: Request) -> Any:
        ns, _ = existing(request)
        subscription, role = str(request.path_params["subscription"]), str(request.path_params["role"])

        def apply(p: dict[str, Any]) -> None:
            granted = auth_policies(p)["subscription_auth_roles"]
            roles = [r for r in granted.get(subscription, []) if r != role]
            if roles:
                granted[subscription] = roles
            else:
                granted.pop(subscription, None)

        policies.update_namespace(ns, apply)

    @endpoint
    async def get_mode(request: Request) -> Any:
        _, pol = existing(request)
        return JSONResponse(pol.get("subscription_auth_mode") or "None")

    @endpoint
    async def set_mode(request: Request) -> Any:
        ns, _ = existing(request)
        mode = await json_body(request)
        if mode not in SUBSCRIPTION_AUTH_MODES:
            raise RestError(400, f"Subscription auth mode must be one of: {', '.join(SUBSCRIPTION_AUTH_MODES)}")
        policies.update_namespace(ns, lambda p: p.__setitem__("subscription_auth_mode", mode))

    return [
        Route(f"{base}/permissions/subscription", get_subscription_permissions, methods=["GET"]),
        Route(f"{base}/permissions/subscription/{{subscription}}", grant_subscription, methods=["POST"]),
        Route(f"{base}/permissions/{{subscription}}/{{role}}", revoke_subscription, methods=["DELETE"]),
        Route(f"{base}/subscriptionAuthMode", get_mode, methods=["GET"]),
        Route(f"{base}/subscriptionAuthMode", set_mode, methods=["POST"]),
    ]
