"""One stored entry as an admin HTTP response, the way Pulsar's peek-messages,
get-message-by-id and examine-message answer: the (uncompressed) payload as the body,
the message metadata as ``X-Pulsar-*`` headers. A batch entry's body is the batch
payload and ``X-Pulsar-num-batch-message`` says how many messages it holds."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from urllib.parse import quote

from starlette.responses import Response

from core.format import EntryFormatError, decode_entry, decompress
from core.storage import Entry

from ._common import RestError

__all__ = ["entry_response", "HEADER_PREFIX"]

HEADER_PREFIX = "X-Pulsar-"


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def entry_response(entry: Entry) -> Response:
    try:
        md, payload = decode_entry(entry.data)
        body = decompress(md.compression, payload, md.uncompressed_size) if md.compression else bytes(payload)
    except EntryFormatError as exc:
        raise RestError(500, f"Stored entry {entry.position} is unreadable: {exc}") from None
    h = {
        "X-Pulsar-Message-ID": f"{entry.position.ledger_id}:{entry.position.entry_id}",
        "X-Pulsar-publish-time": _time(entry.publish_time or md.publish_time),
        "X-Pulsar-producer-name": md.producer_name,
        "X-Pulsar-sequence-id": str(md.sequence_id),
        "X-Pulsar-uncompressed-size": str(len(body)),
    }
    # the broker entry metadata, under the names Pulsar's admin client reads it by
    if entry.publish_time > 0:
        h["X-Pulsar-Broker-Entry-METADATA-timestamp"] = _time(entry.publish_time)
    if entry.index >= 0:
        h["X-Pulsar-Broker-Entry-METADATA-index"] = str(entry.index)
    if md.HasField("num_messages_in_batch"):
        h["X-Pulsar-num-batch-message"] = str(md.num_messages_in_batch)
        h["X-Pulsar-batch-size"] = str(len(body))
    if md.HasField("partition_key"):
        h["X-Pulsar-partition-key"] = md.partition_key
    if md.partition_key_b64_encoded:
        h["X-Pulsar-partition-key-b64-encoded"] = "true"
    if md.HasField("event_time") and md.event_time:
        h["X-Pulsar-event-time"] = _time(md.event_time)
    if md.HasField("deliver_at_time"):
        h["X-Pulsar-deliver-at-time"] = _time(md.deliver_at_time)
    if md.HasField("schema_version"):
        h["X-Pulsar-schema-version"] = str(int.from_bytes(md.schema_version, "big", signed=True))
    if md.null_value:
        h["X-Pulsar-null-value"] = "true"
    if md.properties:
        # Pulsar 3.1+ (PIP-279): every property in one JSON header, which keeps names a
        # header name cannot hold (``=``, ``:``, ...) and their case; one header per
        # property as well, for admin clients before it
        props = {kv.key: kv.value for kv in md.properties}
        h["X-Pulsar-PROPERTY"] = json.dumps(props, separators=(",", ":"))
        for key, value in props.items():
            h[f"X-Pulsar-PROPERTY-{key}"] = value
    # Header values must be latin-1; anything else is percent-encoded.
    safe = {quote(k, safe="-_.~"): v if v.isascii() and v.isprintable() else quote(v) for k, v in h.items()}
    return Response(body, media_type="application/octet-stream", headers=safe)
