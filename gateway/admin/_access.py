"""Who may call the web service: Pulsar's authentication filter and its admin access rules.

With ``authenticationEnabled``, every request but ``/metrics`` (unless
``authenticateMetricsEndpoint``) must carry ``Authorization: Bearer <token>``; a missing or
invalid one is answered 401 ``Authentication required``, as Pulsar's
``AuthenticationFilter`` answers it (the reason is logged, not told). With
``authorizationEnabled`` the authenticated role must also be allowed the call, by Pulsar's
rules (``PulsarWebResource``), else 401 with Pulsar's reason:

* a tenant's resources (its namespaces, their topics and schemas, the tenant itself to
  read) need the tenant's admin (one of its ``adminRoles``) or a super-user, but for a
  topic's stats, partitions, last message id and subscriptions, which a role that may
  produce or consume the topic may read too (Pulsar's LOOKUP, GET_STATS and
  GET_SUBSCRIPTIONS topic operations);
* creating, changing or deleting tenants, listing them, and the broker-wide resources
  (brokers, bookies, clusters but to read them, /metrics) need a super-user;
* reading clusters and asking whether the broker is ready need only authentication.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import unquote

from starlette.datastructures import Headers

from core.auth import AuthenticationError
from core.naming import DOMAINS, InvalidNameError, TopicName

from ._common import error_response

__all__ = ["guard"]

log = logging.getLogger("magnetar.admin")

AUTHENTICATION_REQUIRED = "Authentication required"
SUPER_USER_REQUIRED = "This operation requires super-user access"
TENANT_ADMIN_REQUIRED = "Don't have permission to administrate resources on this tenant"

#: Path segments after /admin/v2 whose next segment names a tenant.
_TENANT_SCOPED = frozenset({"namespaces", "persistent", "non-persistent", "schemas"})
#: What a role that may look a topic up may read of it: the path's segment after the topic.
_TOPIC_READS = frozenset({"stats", "partitioned-stats", "internalStats", "partitions",
                          "lastMessageId", "subscriptions"})


def _path_topic(domain: str, tenant: str, namespace: str, local: str) -> TopicName | None:
    """The topic a path's segments name, or None where they name none (the route answers)."""
    if domain not in DOMAINS:
        return None
    try:
        return TopicName.parse(f"{domain}://{tenant}/{namespace}/{local}")
    except InvalidNameError:
        return None


def _topic_read(auth: Any, method: str, resource: str, rest: list[str], role: str) -> bool:
    """Whether this is a read of a topic (:data:`_TOPIC_READS`) that ``role`` may look up."""
    if method != "GET" or len(rest) != 4 or rest[3] not in _TOPIC_READS:
        return False
    topic = _path_topic(resource, *rest[:3])
    return topic is not None and bool(auth.can_lookup(topic, role))


def _lookup_allowed(auth: Any, rest: list[str], role: str) -> bool:
    """Whether ``role`` may look up the topic ``rest`` names (domain, tenant, namespace,
    topic); a path that names none is answered 404 by the route."""
    topic = _path_topic(*rest) if len(rest) == 4 else None
    return topic is None or bool(auth.can_lookup(topic, role))


def _refusal(auth: Any, method: str, path: str, role: str) -> str | None:
    """Why ``role`` may not make this call (Pulsar's reason), or None when it may."""
    segments = [unquote(s) for s in path.strip("/").split("/")]
    if path.rstrip("/") == "/metrics":
        return None if auth.is_super_user(role) else SUPER_USER_REQUIRED
    if segments[:3] == ["lookup", "v2", "topic"]:
        # an HTTP lookup needs what a binary one does: produce or consume on the topic
        return None if _lookup_allowed(auth, segments[3:], role) else "Client is not authorized to Lookup"
    if segments[:2] != ["admin", "v2"] or len(segments) < 3:
        return None  # not a resource (answered 404)
    resource, rest = segments[2], segments[3:]
    if resource in _TENANT_SCOPED and rest or resource == "tenants" and rest and method == "GET":
        if auth.is_tenant_admin(rest[0], role) or _topic_read(auth, method, resource, rest, role):
            return None
        return TENANT_ADMIN_REQUIRED
    if resource == "clusters" and method == "GET" or resource == "brokers" and rest == ["ready"]:
        return None
    return None if auth.is_super_user(role) else SUPER_USER_REQUIRED


def guard(broker: Any, app: Any) -> Any:
    """Wrap the web service's ASGI ``app`` with authentication and authorization (see the
    module docs); a no-op while ``authenticationEnabled`` is off."""
    auth = broker.auth

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not auth.authentication_enabled:
            await app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path.rstrip("/") == "/metrics" and not broker.config.get("authenticateMetricsEndpoint"):
            await app(scope, receive, send)
            return
        try:
            identity = auth.authenticate_http(Headers(scope=scope).get("authorization"))
        except AuthenticationError as exc:
            log.warning("admin %s %s: %s: %s", scope.get("method"), path, AUTHENTICATION_REQUIRED, exc)
            await error_response(401, AUTHENTICATION_REQUIRED)(scope, receive, send)
            return
        if auth.authorization_enabled:
            reason = _refusal(auth, scope.get("method", "GET"), path, identity.role)
            if reason is not None:
                log.warning("admin %s %s: role %s refused: %s", scope.get("method"), path,
                            identity.role, reason)
                await error_response(401, reason)(scope, receive, send)
                return
        await app(scope, receive, send)

    return wrapped
