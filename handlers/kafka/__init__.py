"""The Kafka wire protocol: a sans-IO codec (message-definition table, record batches) and
the trio session that maps Kafka's APIs onto Magnetar topics and subscriptions."""

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
from handlers.kafka._errors import ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError
from handlers.kafka._handler import KafkaProtocolHandler
from handlers.kafka._records import Record, RecordBatch, decode_batches, encode_batch

__all__ = [
    "APIS",
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
