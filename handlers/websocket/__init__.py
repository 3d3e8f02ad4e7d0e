"""Pulsar's WebSocket API on the web service (``webSocketServiceEnabled``): producers,
consumers and readers at ``/ws/v2/{producer,consumer,reader}/{domain}/{tenant}/{namespace}
/{topic}[/{subscription}]``, speaking Pulsar's JSON frames, and ``/ws/pingpong``.

:class:`WebSocketService` is an ASGI app for WebSocket connections; the gateway hands it
every WebSocket request its web service receives. :mod:`._codec` is the sans-IO part
(paths, query parameters, frames); :mod:`._session` the trio driver every session shares,
:mod:`._producer` and :mod:`._consumer` (consumers and readers) the endpoints' own.
"""

from handlers.websocket._service import WebSocketService, deny

__all__ = ["WebSocketService", "deny"]
