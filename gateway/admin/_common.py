"""What every admin resource module shares: Pulsar's error shape, JSON bodies, names
and numbers from path and query parameters, and the mapping of core exceptions onto HTTP
statuses.

Pulsar answers a failed admin call with a 4xx (or 5xx for a broker fault) and the body
``{"reason": "..."}``; a bad request is never a 500. ``endpoint`` wraps a handler so that
it may simply return a JSON-able value (``None`` means 204 No Content) and raise core
exceptions. ``limit_body`` wraps a route so that its request body is bounded in size
(``httpMaxRequestSize``, 413) and in the time it may take to arrive
(``httpRequestBodyTimeoutInSeconds``, 408): the handlers run on the broker's one event
loop, which must not hold an unbounded body or wait forever for one.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import trio
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
    "json_list",
    "limit_body",
    "namespace_of",
    "topic_of",
    "tenant_of",
    "cluster_of",
    "query_bool",
    "query_int",
    "error_response",
    "body_int",
    "body_object",
    "path_int",
    "LONG_MIN",
    "LONG_MAX",
]

log = logging.getLogger("magnetar.admin")

Handler = Callable[[Request], Awaitable[Any]]

#: The range of a Java ``long``, the type of Pulsar's numeric path and query parameters
#: (ledger and entry ids, timestamps, counts): a number outside it is a 400, never a
#: conversion error deeper down.
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
_INTEGER = re.compile(r"-?[0-9]+")

#: Items of a JSON list encoded between two yields to the event loop (:func:`json_list`).
_ITEMS_PER_YIELD = 4096


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
    """The request's JSON body; a missing (when required), malformed or too deeply nested
    one is a 400."""
    raw = await request.body()
    if not raw.strip():
        if required:
            raise RestError(400, "Request body is required")
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise RestError(400, f"Invalid JSON body: {exc}") from None
    except RecursionError:
        raise RestError(400, "Invalid JSON body: nested too deeply") from None


async def json_list(items: list[Any]) -> Response:
    """``items`` as a JSON array, encoded as :class:`JSONResponse` encodes it but yielding
    to the event loop every :data:`_ITEMS_PER_YIELD` items: a namespace's topic list may
    hold millions of partition names, and the loop serves every client."""
    parts = []
    for start in range(0, len(items), _ITEMS_PER_YIELD):
        chunk = json.dumps(items[start:start + _ITEMS_PER_YIELD], ensure_ascii=False,
                           allow_nan=False, separators=(",", ":"))
        parts.append(chunk[1:-1].encode("utf-8"))
        await trio.lowlevel.checkpoint()
    return Response(b"[" + b",".join(parts) + b"]", media_type="application/json")


def limit_body(app: Any, broker: Any) -> Any:
    """Wrap a route's ASGI `app` so that its request body is bounded: a body whose
    ``Content-Length`` exceeds ``httpMaxRequestSize`` is refused with 413 before any of it
    is read; one that grows past it while being read (chunked) fails the read with 413;
    one that has not fully arrived ``httpRequestBodyTimeoutInSeconds`` after its headers
    fails the read with 408. A handler that answers without reading the body leaves it
    unread: the server then closes the connection instead of reading on."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        config = broker.config
        limit = int(config.get("httpMaxRequestSize"))
        timeout = float(config.get("httpRequestBodyTimeoutInSeconds")) or float("inf")
        length = _content_length(scope)
        if limit >= 0 and length is not None and length > limit:
            response = error_response(413, f"Request body of {length} bytes is larger than the "
                                           f"{limit} bytes allowed (httpMaxRequestSize)")
            await response(scope, receive, send)
            return
        deadline = trio.current_time() + timeout
        received = 0

        async def bounded_receive() -> Any:
            nonlocal received
            with trio.move_on_at(deadline):
                message = await receive()
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    if limit >= 0 and received > limit:
                        raise RestError(413, f"Request body is larger than the {limit} bytes "
                                             "allowed (httpMaxRequestSize)")
                return message
            raise RestError(408, f"Request body not received within {timeout:g} seconds")

        await app(scope, bounded_receive, send)

    return wrapped


def _content_length(scope: Any) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isascii() and text.isdigit() else None
    return None


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


def tenant_of(request: Request) -> str:
    """The ``{tenant}`` path parameter, which must follow Pulsar's rule for tenant names
    (412 otherwise, as for every invalid name)."""
    name = str(request.path_params["tenant"])
    NamespaceName.parse(f"{name}/probe")
    return name


def cluster_of(request: Request, default: str | None = None) -> str:
    """The ``{cluster}`` path parameter (`default` where the route has none): cluster
    names follow the tenant-name rule (412 otherwise)."""
    name = str(request.path_params.get("cluster", default))
    try:
        NamespaceName.parse(f"{name}/probe")
    except InvalidNameError:
        raise RestError(412, f"Invalid cluster name: {name!r}") from None
    return name


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


def _integer(text: str, what: str, lo: int, hi: int) -> int:
    """`text` as a decimal integer in ``[lo, hi]``; anything else is a 400 naming `what`."""
    if _INTEGER.fullmatch(text) is None:
        raise RestError(400, f"{what} must be an integer")
    # Past 19 significant digits a number is out of any range here; int() is not asked
    # to convert thousands of digits.
    value = int(text) if len(text.lstrip("-").lstrip("0")) <= 19 else None
    if value is None or not lo <= value <= hi:
        raise RestError(400, f"{what} must be between {lo} and {hi}")
    return value


def query_int(request: Request, key: str, default: int | None = None,
              lo: int = LONG_MIN, hi: int = LONG_MAX) -> int | None:
    """The query parameter `key` as an integer in ``[lo, hi]`` (400 otherwise), or
    `default` when absent."""
    value = request.query_params.get(key)
    if value is None:
        return default
    return _integer(value, f"Query parameter {key}", lo, hi)


def path_int(request: Request, key: str, lo: int = LONG_MIN, hi: int = LONG_MAX) -> int:
    """The path parameter `key` as an integer in ``[lo, hi]`` (400 otherwise)."""
    return _integer(str(request.path_params[key]), key, lo, hi)
