"""What every admin resource module shares: Pulsar's error shape, JSON bodies, names
from path parameters, and the mapping of core exceptions onto HTTP statuses.

Pulsar answers a failed admin call with a 4xx (or 5xx for a broker fault) and the body
``{"reason": "..."}``; a bad request is never a 500. ``endpoint`` wraps a handler so that
it may simply return a JSON-able value (``None`` means 204 No Content) and raise core
exceptions.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from core.broker import NamespaceNotFoundError, TopicExistsError, TopicNotFoundError
from core.naming import InvalidNameError, NamespaceName, TopicName
from core.nonpersistent import NotAllowedError
from core.policies import ConflictError, NotFoundError, PreconditionError
from core.schema import IncompatibleSchemaError
from core.subscription import ConsumerBusyError
from core.topic import ProducerBusyError, TopicClosedError, TopicTerminatedError

__all__ = [
    "RestError",
    "endpoint",
    "json_body",
    "namespace_of",
    "topic_of",
    "query_bool",
    "query_int",
    "error_response",
    "body_int",
    "body_object",
    "path_int",
]

log = logging.getLogger("magnetar.admin")

Handler = Callable[[Request], Awaitable[Any]]


class RestError(Exception):
    """An admin call's failure: HTTP status and Pulsar's ``reason``."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def existing_clusters(policies: Any, value: Any, field: str, missing_reason: str) -> list[str]:
    """``value`` as a list of names of existing clusters: 400 when it is not a list of
    strings, 412 with ``missing_reason`` and the unknown names when one does not exist."""
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise RestError(400, f"{field} must be a list of strings")
    known = set(policies.clusters())
    missing = [c for c in value if c not in known]
    if missing:
        raise RestError(412, f"{missing_reason}: {', '.join(missing)}")
    return value


def replication_clusters(policies: Any, tenant: str, clusters: Any) -> list[str]:
    """``clusters`` as a namespace's or topic's replication clusters: a list of names of
    clusters that exist (412 otherwise) and that the tenant may use (403 otherwise, with
    Pulsar's reason)."""
    clusters = existing_clusters(policies, clusters, "Clusters", "Invalid cluster id")
    allowed = set((policies.get_tenant(tenant) or {}).get("allowedClusters") or [])
    for cluster in clusters:
        if cluster not in allowed:
            raise RestError(
                403, f"Cluster [{cluster}] is not in the list of allowed clusters list for tenant [{tenant}]")
    return clusters


def error_response(status: int, reason: str) -> JSONResponse:
    return JSONResponse({"reason": reason}, status_code=status)


def _status_of(exc: BaseException) -> int | None:
    match exc:
        case RestError():
            return exc.status
        case InvalidNameError():
            return 412
        case NamespaceNotFoundError() | TopicNotFoundError() | NotFoundError():
            return 404
        case ConflictError() | TopicExistsError():
            return 409
        case NotAllowedError():
            # Pulsar answers 405 for operations a non-persistent topic cannot support.
            return 405
        case PreconditionError() | ProducerBusyError() | ConsumerBusyError() | TopicTerminatedError():
            return 412
        case IncompatibleSchemaError():
            return 409
        case TopicClosedError():
            return 503
    return None


def endpoint(fn: Handler) -> Callable[[Request], Awaitable[Response]]:
    @functools.wraps(fn)
    async def wrapped(request: Request) -> Response:
        try:
            result = await fn(request)
        except Exception as exc:
            status = _status_of(exc)
            if status is None:
                log.exception("admin %s %s failed", request.method, request.url.path)
                return error_response(500, f"Internal error: {exc}")
            return error_response(status, str(exc))
        if isinstance(result, Response):
            return result
        if result is None:
            return Response(status_code=204)
        return JSONResponse(result)

    return wrapped


async def json_body(request: Request, *, required: bool = True) -> Any:
    """The request's JSON body; a missing (when required) or malformed one is a 400."""
    raw = await request.body()
    if not raw.strip():
        if required:
            raise RestError(400, "Request body is required")
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise RestError(400, f"Invalid JSON body: {exc}") from None


def body_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RestError(400, f"{what} must be an integer")
    return value


def body_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RestError(400, f"{what} must be a JSON object")
    return value


def _param(request: Request, key: str) -> str:
    return unquote(str(request.path_params[key]))


def namespace_of(request: Request) -> NamespaceName:
    return NamespaceName.parse(f"{_param(request, 'tenant')}/{_param(request, 'namespace')}")


def topic_of(request: Request) -> TopicName:
    """The topic named by the path: ``.../{persistent|non-persistent}/{tenant}/{namespace}/{topic}``."""
    segments = request.url.path.split("/")
    domain = next((s for s in segments if s in ("persistent", "non-persistent")), "persistent")
    return TopicName.parse(f"{domain}://{_param(request, 'tenant')}/{_param(request, 'namespace')}/"
                           f"{_param(request, 'topic')}")


def query_bool(request: Request, key: str, default: bool = False) -> bool:
    value = request.query_params.get(key)
    if value is None:
        return default
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise RestError(400, f"Query parameter {key} must be true or false")


def query_int(request: Request, key: str, default: int | None = None) -> int | None:
    value = request.query_params.get(key)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise RestError(400, f"Query parameter {key} must be an integer") from None


def path_int(request: Request, key: str) -> int:
    try:
        return int(request.path_params[key])
    except ValueError:
        raise RestError(400, f"{key} must be an integer") from None
