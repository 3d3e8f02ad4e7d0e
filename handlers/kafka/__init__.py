"""The Kafka wire protocol: a sans-IO codec (message-definition table, record batches) and
the trio session that maps Kafka's APIs onto Magnetar topics and subscriptions.

``CONFIG_KEYS`` are the protocol's configuration keys (``KafkaProtocolHandler.config_keys``).
The other names are imported when first used, so that reading a configuration, which
needs only the keys, does not load the protocol.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from handlers.kafka._settings import CONFIG_KEYS

if TYPE_CHECKING:
    from handlers.kafka._codec import (
        APIS,
        NEED_DATA,
        Data,
        KafkaConnection,
        RequestReceived,
        UnsupportedRequest,
        decode_response,
        encode_request,
    )
    from handlers.kafka._errors import (
        ErrorCode,
        LocalProtocolError,
        ProtocolError,
        RemoteProtocolError,
    )
    from handlers.kafka._handler import KafkaProtocolHandler
    from handlers.kafka._records import Record, RecordBatch, decode_batches, encode_batch

__all__ = [
    "APIS",
    "CONFIG_KEYS",
    "NEED_DATA",
    "Data",
    "ErrorCode",
    "KafkaConnection",
    "KafkaProtocolHandler",
    "LocalProtocolError",
    "ProtocolError",
    "Record",
    "RecordBatch",
    "RemoteProtocolError",
    "RequestReceived",
    "UnsupportedRequest",
    "decode_batches",
    "decode_response",
    "encode_batch",
    "encode_request",
]

#: The module of each name imported on first use.
_LAZY = {
    **dict.fromkeys(["APIS", "NEED_DATA", "Data", "KafkaConnection", "RequestReceived",
                     "UnsupportedRequest", "decode_response", "encode_request"], "_codec"),
    **dict.fromkeys(["ErrorCode", "LocalProtocolError", "ProtocolError",
                     "RemoteProtocolError"], "_errors"),
    "KafkaProtocolHandler": "_handler",
    **dict.fromkeys(["Record", "RecordBatch", "decode_batches", "encode_batch"], "_records"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
