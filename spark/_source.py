"""The ``magnetar`` PySpark data source: batch and streaming, read and write.

Theory of operation
-------------------
Offsets are Kafka's: per topic-partition, the broker index of each message (an entry of
``n`` messages whose last index is ``i`` holds offsets ``i-n+1 .. i``). The driver plans
a read through the admin REST API (:mod:`spark._admin`): it finds the entry holding the
start offset by binary search and cuts the range ``[start, end)`` at ledger boundaries,
so a large backlog becomes one input partition per ledger, and a ledger holding more
than :data:`SPLIT_MESSAGES` messages several (so that every core has work). Each input
partition names its first and last entry (one ledger) and the first entry's offset.

An executor reads its range straight from the bookies when it can (see
:mod:`spark._direct`): the planner passes the ledger's metadata record, and the native
reader fetches the entries (all confirmed) from their replicas and decodes them into
Arrow columns without a Python object per message. Otherwise - option
``directRead=false``, no metadata, no native core on the executor, or no replica
answering - it opens a Pulsar Reader at the range's first entry (inclusive) and numbers
messages as they come: within an entry by batch index, each next entry continuing where
the previous one ended, and each entry it is not handed (chunks before a chunked
message's last one) holding one offset, as the broker indexed it. A direct read that fails midway resumes on a Reader from
the next offset. Both stop at the range's end offset, so two input partitions never
overlap and none leaves a gap. ``directRead=require`` fails the task instead of falling
back; :data:`READ_PATHS` counts which path served each range in this process.

Streaming offsets are ``{topic: {partition: next_offset}}`` JSON, as Spark's Kafka source
writes them, and ``next_offset`` counts messages, never entries: it is the offset (broker
index) of the first message not read yet, so a run ends after the last message of an
entry and the next run starts at the first message of the next one however many
messages that entry held. ``initialOffset``, ``latestOffset``, planning and both read
paths use that one unit. The offsets live in the query's checkpoint, and a restarted
query plans the same ranges again, which is what makes a file sink's output exactly
once.

The ``protocol`` column is derived from the producer name the entry carries: the Kafka
handler names its producers ``kafka`` (no idempotent producer id) or ``kafka-<id>``;
AMQP and MQTT handlers use ``amqp``/``amqp-*`` and ``mqtt``/``mqtt-*`` alike; anything
else came from a Pulsar client (see :func:`protocol_of`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ._admin import AdminClient, PartitionLayout, TopicName, split_topic_name
from ._decode import Decoder, decoder_for
from ._direct import direct_read_errors, read_direct

__all__ = ["MagnetarDataSource", "SCHEMA", "protocol_of", "MagnetarPartition", "READ_PATHS"]

_log = logging.getLogger(__name__)

#: The columns every read yields.
SCHEMA = (
    "topic string, partition int, offset long, messageId string, key binary, value binary, "
    "properties map<string,string>, publishTime timestamp, eventTime timestamp, "
    "producerName string, protocol string"
)

#: Rows per Arrow batch handed to Spark.
ARROW_BATCH_ROWS = 65536
#: A ledger range of more messages than this is planned as several input partitions.
SPLIT_MESSAGES = 131072
#: ``directRead`` values: read from the bookies with a Reader as fallback, only with a
#: Reader, or only from the bookies.
DIRECT_READ_MODES = ("true", "false", "require")
#: Input partitions served per path in this process: ``direct``, ``reader``, and
#: ``resumed`` (a direct read that a Reader finished).
READ_PATHS: Counter[str] = Counter()
#: How long an executor waits for the next message of a range it knows is stored.
READ_STALL_MS = 30_000
#: Messages a Reader prefetches.
RECEIVER_QUEUE = 5000

_PROTOCOL_PREFIXES = (("kafka", "kafka"), ("amqp", "amqp"), ("mqtt", "mqtt"))
_EARLIEST, _LATEST = -2, -1


def protocol_of(producer_name: str | None) -> str:
    """The protocol a message arrived by, from its entry's producer name.

    ``kafka`` or ``kafka-<n>`` → ``"kafka"`` (and likewise ``amqp``, ``mqtt``); any other
    name → ``"pulsar"``.

    >>> protocol_of("kafka-7"), protocol_of("kafka"), protocol_of("standalone-0-3")
    ('kafka', 'kafka', 'pulsar')
    """
    name = producer_name or ""
    for prefix, protocol in _PROTOCOL_PREFIXES:
        if name == prefix or name.startswith(prefix + "-"):
            return protocol
    return "pulsar"


# --------------------------------------------------------------------------- options


def _option(options: Mapping[str, str], key: str) -> str | None:
    """An option by name, whatever its case (Spark hands options over lower-cased)."""
    value = options.get(key)
    return options.get(key.lower()) if value is None else value


def _required(options: Mapping[str, str], key: str) -> str:
    value = _option(options, key)
    if not value:
        raise ValueError(f"option {key!r} is required by format('magnetar')")
    return value


@dataclass(frozen=True, slots=True)
class _TopicPartition:
    label: str  # the topic column's value and the offsets' JSON key
    partition: int
    pulsar_topic: TopicName


def _resolve_topics(options: Mapping[str, str], admin: AdminClient) -> list[str]:
    topics = _option(options, "topics")
    if topics:
        return [t.strip() for t in topics.split(",") if t.strip()]
    pattern = _option(options, "topicsPattern")
    if not pattern:
        raise ValueError("format('magnetar') needs option 'topics' or 'topicsPattern'")
    # The namespace is the pattern's text before its last '/' (public/default when none).
    scope = pattern.split("://", 1)[-1].split("/")
    tenant, namespace = (scope[0], scope[1]) if len(scope) >= 3 else ("public", "default")
    regex = re.compile(pattern)
    return [t for t in admin.list_topics(tenant, namespace)
            if regex.fullmatch(t) or regex.fullmatch(split_topic_name(t).local)]


def _topic_partitions(topics: Sequence[str], admin: AdminClient) -> list[_TopicPartition]:
    out = []
    for label in topics:
        name = split_topic_name(label)
        n = admin.partitions(name)
        if n == 0:
            out.append(_TopicPartition(label, 0, name))
        else:
            out.extend(_TopicPartition(label, p, name.partition(p)) for p in range(n))
    return out


def _offset_spec(text: str | None, default: str) -> str | dict[str, dict[str, int]]:
    text = (text or default).strip()
    if text in ("earliest", "latest"):
        return text
    try:
        doc = json.loads(text)
    except ValueError:
        raise ValueError(f"offsets must be earliest, latest or JSON, got {text!r}") from None
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise ValueError(f'offsets JSON must look like {{"topic": {{"0": 23}}}}, got {text!r}')
    return {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in doc.items()}


def _offset_for(spec: str | dict[str, dict[str, int]], tp: _TopicPartition, layout: PartitionLayout,
                *, absent: int) -> int:
    if spec == "earliest":
        value = _EARLIEST
    elif spec == "latest":
        value = _LATEST
    else:
        assert isinstance(spec, dict)
        value = spec.get(tp.label, {}).get(str(tp.partition), absent)
    if value == _EARLIEST:
        return layout.earliest()
    if value == _LATEST:
        return layout.latest()
    return value


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class MagnetarPartition(InputPartition):
    """One range ``[from_offset, to_offset)`` of one topic-partition, held by the entries
    ``entry_id..last_entry_id`` of one ledger."""

    service_url: str
    label: str
    partition: int
    pulsar_topic: str
    ledger_id: int
    entry_id: int
    base_offset: int
    from_offset: int
    to_offset: int
    decoder: Decoder | None = None
    last_entry_id: int = -1
    ledger_metadata: str | None = None  # the ledger's metadata record, for direct reads
    direct_read: str = "true"

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", (self.label, self.partition, self.from_offset, self.to_offset))


def _cuts(layout: PartitionLayout, first: int, last: int) -> list[int]:
    """The ordinals in ``[first, last]`` where input partitions start: ``first``, every
    ledger start, and evenly spaced ones inside a ledger range of over SPLIT_MESSAGES."""
    starts = layout.ledger_starts(first, last)
    out: list[int] = []
    for i, ordinal in enumerate(starts):
        stop = starts[i + 1] if i + 1 < len(starts) else last + 1
        messages = layout.info(stop - 1).index + 1 - layout.info(ordinal).base_offset
        pieces = min(stop - ordinal, -(-messages // SPLIT_MESSAGES))
        out.extend(ordinal + (stop - ordinal) * k // max(pieces, 1) for k in range(max(pieces, 1)))
    return out


def _plan(service_url: str, tp: _TopicPartition, layout: PartitionLayout, lo: int, hi: int,
          decoder: Decoder | None = None, direct_read: str = "true") -> list[MagnetarPartition]:
    if hi <= lo:
        return []
    first = layout.find(lo)
    if first is None:
        return []
    last = layout.find(hi - 1)
    last = layout.total - 1 if last is None else last
    cuts = _cuts(layout, first, last)
    out = []
    for i, ordinal in enumerate(cuts):
        info = layout.info(ordinal)
        start = max(lo, info.base_offset)
        end = layout.info(cuts[i + 1]).base_offset if i + 1 < len(cuts) else hi
        last_entry = layout.position((cuts[i + 1] if i + 1 < len(cuts) else last + 1) - 1)[1]
        if end > start:
            out.append(MagnetarPartition(service_url, tp.label, tp.partition, tp.pulsar_topic.full,
                                         info.ledger_id, info.entry_id,
                                         info.base_offset, start, end, decoder, last_entry,
                                         layout.metadata.get(info.ledger_id), direct_read))
    return out


# --------------------------------------------------------------------------- reading


def _arrow_schema(decoder: Decoder | None) -> Any:
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    extra = list(zip((f[0] for f in decoder.fields), decoder.arrow_types(pa), strict=True)) if decoder else []
    return pa.schema([
        ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
        ("messageId", pa.string()), ("key", pa.binary()), ("value", pa.binary()),
        ("properties", pa.map_(pa.string(), pa.string())), ("publishTime", ts),
        ("eventTime", ts), ("producerName", pa.string()), ("protocol", pa.string()),
        *extra,
    ])


def _quiet_logger() -> Any:
    import pulsar

    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)


class _ColumnBuffer:
    """Rows gathered column by column, handed over as one Arrow record batch."""

    def __init__(self, split: MagnetarPartition, schema: Any, pa: Any):
        self.split, self.schema, self.pa = split, schema, pa
        self.state: dict[str, Any] = {}
        self._reset()

    def _reset(self) -> None:
        self.rows = 0
        self.offsets: list[int] = []
        self.ids: list[str] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.props: list[list[tuple[str, str]]] = []
        self.published: list[int | None] = []
        self.events: list[int | None] = []
        self.producers: list[str | None] = []
        self.protocols: list[str | None] = []
        self.decoded: list[list[Any]] = [[] for _ in self.split.decoder.fields] if self.split.decoder else []

    def add(self, offset: int, message_id: str, key: str, value: bytes | None, props: dict[str, str],
            published: int | None, event: int, producer: str | None, protocol: str | None) -> None:
        self.rows += 1
        self.offsets.append(offset)
        self.ids.append(message_id)
        self.keys.append(key.encode() if key else None)
        self.values.append(value)
        self.props.append(list(props.items()) if props else [])
        self.published.append(published)
        self.events.append(event * 1000 if event else None)
        self.producers.append(producer)
        self.protocols.append(protocol)
        if self.split.decoder is not None:
            for column, v in zip(self.decoded, self.split.decoder.decode(value, self.state), strict=True):
                column.append(v)

    def flush(self) -> Any:
        pa, n = self.pa, self.rows
        columns = [[self.split.label] * n, [self.split.partition] * n, self.offsets, self.ids,
                   self.keys, self.values, self.props, self.published, self.events,
                   self.producers, self.protocols, *self.decoded]
        out = pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(columns, self.schema, strict=True)],
            schema=self.schema)
        self._reset()
        return out


def read_partition(split: MagnetarPartition) -> Iterator[Any]:
    """The rows of ``split`` as Arrow record batches, in offset order: from the bookies
    when the split allows it, else (or for what a failed direct read left) by a Reader."""
    schema = _arrow_schema(split.decoder)
    resume = split.from_offset
    if split.direct_read != "false":
        why = "the broker reported no metadata for the ledger"
        if split.ledger_metadata is not None:
            try:
                for batch in read_direct(split, schema, ARROW_BATCH_ROWS):
                    resume = batch.column(2)[-1].as_py() + 1
                    yield batch
                READ_PATHS["direct"] += 1
                return
            except direct_read_errors() as exc:
                why = f"{type(exc).__name__}: {exc}"
        if split.direct_read == "require":
            raise RuntimeError(f"{split.pulsar_topic} ledger {split.ledger_id}: direct read required "
                               f"(directRead=require) but not possible: {why}")
        _log.warning("%s ledger %s: reading offsets %d..%d through a Reader: %s",
                     split.pulsar_topic, split.ledger_id, resume, split.to_offset, why)
    READ_PATHS["resumed" if resume > split.from_offset else "reader"] += 1
    yield from _read_with_reader(dataclasses.replace(split, from_offset=resume), schema)


def _read_with_reader(split: MagnetarPartition, schema: Any) -> Iterator[Any]:
    """The rows of ``split`` through a Pulsar Reader, one message at a time.

    The Reader starts at the split's first entry, inclusive: a message id names a message,
    and "after entry ``e``" said as the id ``e:-1`` is after a single message but before
    every message of a batch ``e`` (the client keeps a batch's messages whose index is
    past -1), so an exclusive start after the entry before would read that batch again.
    Offsets are counted in messages from the first entry's base offset, entry by entry:
    the next entry of the ledger starts where the previous one ended, and each entry the
    Reader never hands out on its own (the chunks before a chunked message's last one,
    markers) holds one offset, as its broker index says.
    """
    import pulsar
    import pyarrow as pa

    client = pulsar.Client(split.service_url, operation_timeout_seconds=30, logger=_quiet_logger())
    try:
        start = pulsar.MessageId(-1, split.ledger_id, split.entry_id, -1)
        reader = client.create_reader(split.pulsar_topic, start, receiver_queue_size=RECEIVER_QUEUE,
                                      start_message_id_inclusive=True)
        # The extension's reader hands out its messages without a per-message wrapper
        # object; both have the same methods.
        read_next = getattr(reader, "_reader", reader).read_next
        batch = _ColumnBuffer(split, schema, pa)
        entry = -1  # the entry of the messages being read (in split.ledger_id)
        next_entry, next_base = split.entry_id, split.base_offset  # where the next entry starts
        base = offset = emitted = split.from_offset - 1
        publish = producer = protocol = None
        while offset + 1 < split.to_offset:
            try:
                msg = read_next(READ_STALL_MS)
            except pulsar.Timeout:
                raise RuntimeError(
                    f"{split.pulsar_topic}: no message within {READ_STALL_MS} ms at offset "
                    f"{offset + 1} (range ends at {split.to_offset})") from None
            mid = msg.message_id()
            ledger_id, entry_id, batch_index = mid.ledger_id(), mid.entry_id(), mid.batch_index()
            if ledger_id != split.ledger_id or entry_id > split.last_entry_id:
                break  # past the split's entries: what is left of its range has no rows
            if entry_id < split.entry_id:
                continue  # a broker that started early
            if entry_id != entry:
                if entry_id < next_entry:
                    continue  # an entry read already (a reconnecting Reader may repeat it)
                entry = entry_id
                base = next_base + (entry_id - next_entry)  # one offset per entry not handed out
                next_entry, next_base = entry_id + 1, base + 1
                # What only the entry carries is the same for all of its messages.
                publish = msg.publish_timestamp() * 1000
                producer = msg.producer_name()
                protocol = protocol_of(producer)
            offset = base + max(batch_index, 0)
            next_base = max(next_base, offset + 1)
            if offset <= emitted:
                continue  # before the range, or a message handed out twice
            if offset >= split.to_offset:
                break
            batch.add(offset, f"{ledger_id}:{entry_id}:{batch_index}", msg.partition_key(),
                      None if msg.has_null_value() else msg.data(), msg.properties(), publish,
                      msg.event_timestamp(), producer, protocol)
            emitted = offset
            if batch.rows >= ARROW_BATCH_ROWS:
                yield batch.flush()
        if batch.rows:
            yield batch.flush()
        reader.close()
    finally:
        client.close()


def _read(partition: InputPartition | None) -> Iterator[Any]:
    # Spark reads one placeholder partition when planning found nothing to read.
    if isinstance(partition, MagnetarPartition):
        return read_partition(partition)
    return iter(())


_COLUMNS = frozenset(c.split()[0] for c in SCHEMA.split(", "))


def _decoder(options: Mapping[str, str], admin: AdminClient) -> Decoder | None:
    """The decoder of the topics' schema when ``decodeSchema`` is true (the first topic's
    schema; every topic read must carry the same one)."""
    if (_option(options, "decodeSchema") or "false").lower() != "true":
        return None
    found = None
    for label in _resolve_topics(options, admin):
        schema = admin.schema(split_topic_name(label))
        if schema is None:
            raise ValueError(f"decodeSchema=true but topic {label!r} has no schema")
        if found is not None and schema != found:
            raise ValueError(f"decodeSchema=true but topic {label!r} has another schema than the first")
        found = schema
    if found is None:
        raise ValueError("decodeSchema=true but no topic matched")
    return decoder_for(found[0], found[1], set(_COLUMNS))


class _Planner:
    """Driver-side state shared by the batch and the streaming reader."""

    def __init__(self, options: Mapping[str, str]):
        self.options = dict(options)
        self.service_url = _required(options, "serviceUrl")
        self.admin = AdminClient(_required(options, "adminUrl"))
        self.decoder = _decoder(options, self.admin)
        self.direct_read = (_option(options, "directRead") or "true").strip().lower()
        if self.direct_read not in DIRECT_READ_MODES:
            raise ValueError(f"option directRead must be one of {', '.join(DIRECT_READ_MODES)}, "
                             f"got {self.direct_read!r}")

    def plan(self, tp: _TopicPartition, layout: PartitionLayout, lo: int, hi: int) -> list[MagnetarPartition]:
        return _plan(self.service_url, tp, layout, lo, hi, self.decoder, self.direct_read)

    def topic_partitions(self) -> list[_TopicPartition]:
        return _topic_partitions(_resolve_topics(self.options, self.admin), self.admin)

    def layout(self, tp: _TopicPartition) -> PartitionLayout:
        return PartitionLayout(self.admin, tp.pulsar_topic)


class _BatchReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]):
        self.planner = _Planner(options)
        self.starting = _offset_spec(_option(options, "startingOffsets"), "earliest")
        self.ending = _offset_spec(_option(options, "endingOffsets"), "latest")

    def partitions(self) -> Sequence[InputPartition]:
        out: list[InputPartition] = []
        for tp in self.planner.topic_partitions():
            layout = self.planner.layout(tp)
            lo = _offset_for(self.starting, tp, layout, absent=_EARLIEST)
            hi = _offset_for(self.ending, tp, layout, absent=_LATEST)
            out.extend(self.planner.plan(tp, layout, lo, min(hi, layout.latest())))
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(partition)


class _StreamReader(DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]):
        self.planner = _Planner(options)
        self.starting = _offset_spec(_option(options, "startingOffsets"), "latest")
        limit = _option(options, "maxEntriesPerTrigger")
        self.max_per_trigger = int(limit) if limit else None

    def initialOffset(self) -> dict:
        out: dict[str, dict[str, int]] = {}
        for tp in self.planner.topic_partitions():
            layout = self.planner.layout(tp)
            out.setdefault(tp.label, {})[str(tp.partition)] = _offset_for(
                self.starting, tp, layout, absent=_LATEST)
        return out

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: Any) -> dict:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        ends: list[tuple[_TopicPartition, int, int]] = []
        for tp in self.planner.topic_partitions():
            layout = self.planner.layout(tp)
            begin = start.get(tp.label, {}).get(str(tp.partition))
            if begin is None:  # a partition that appeared since: read it from its start
                begin = layout.earliest()
            ends.append((tp, int(begin), max(int(begin), layout.latest())))
        if isinstance(limit, ReadMaxRows):
            ends = _share(ends, int(limit.max_rows))
        out: dict[str, dict[str, int]] = {}
        for tp, _, end in ends:
            out.setdefault(tp.label, {})[str(tp.partition)] = end
        return out

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        out: list[InputPartition] = []
        for tp in self.planner.topic_partitions():
            hi = end.get(tp.label, {}).get(str(tp.partition))
            if hi is None:
                continue
            layout = self.planner.layout(tp)
            lo = start.get(tp.label, {}).get(str(tp.partition))
            lo = layout.earliest() if lo is None else lo
            out.extend(self.planner.plan(tp, layout, int(lo), int(hi)))
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: progress lives in the query's checkpoint, not in the broker."""


def _share(ends: list[tuple[_TopicPartition, int, int]], budget: int) -> list[tuple[_TopicPartition, int, int]]:
    """Cap the total span at ``budget`` messages, shared evenly over the partitions."""
    spans = [end - begin for _, begin, end in ends]
    take = [0] * len(ends)
    left = budget
    while left > 0:
        wanting = [i for i, s in enumerate(spans) if take[i] < s]
        if not wanting:
            break
        share = max(1, left // len(wanting))
        for i in wanting:
            step = min(share, spans[i] - take[i], left)
            take[i] += step
            left -= step
            if left == 0:
                break
    return [(tp, begin, begin + t) for (tp, begin, _), t in zip(ends, take, strict=True)]


# --------------------------------------------------------------------------- writing


def _field(row: Any, name: str) -> Any:
    try:
        return row[name]
    except (KeyError, ValueError, IndexError):
        return None


def _as_bytes(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def write_rows(options: Mapping[str, str], rows: Iterator[Any]) -> int:
    """Produce every row (``topic``, ``key``, ``value``, ``properties``); returns the count."""
    import pulsar

    service_url = _required(options, "serviceUrl")
    default_topic = _option(options, "topic")
    client = pulsar.Client(service_url, operation_timeout_seconds=30, logger=_quiet_logger())
    producers: dict[str, Any] = {}
    failures: list[str] = []
    sent = 0

    def done(result: Any, _msg_id: Any) -> None:
        if result != pulsar.Result.Ok:
            failures.append(str(result))

    try:
        for row in rows:
            topic = _field(row, "topic") or default_topic
            if not topic:
                raise ValueError("a row has no topic column value and option 'topic' is not set")
            name = split_topic_name(str(topic)).full
            producer = producers.get(name)
            if producer is None:
                producer = producers[name] = client.create_producer(
                    name, batching_enabled=True, batching_max_publish_delay_ms=5,
                    block_if_queue_full=True, max_pending_messages=10_000)
            key = _field(row, "key")
            props = _field(row, "properties") or {}
            producer.send_async(
                _as_bytes(_field(row, "value")), done,
                properties={str(k): str(v) for k, v in dict(props).items()},
                partition_key=(key.decode(errors="replace") if isinstance(key, (bytes, bytearray))
                               else str(key)) if key is not None else None)
            sent += 1
        for producer in producers.values():
            producer.flush()
        if failures:
            raise RuntimeError(f"{len(failures)} of {sent} messages were not stored: {failures[0]}")
        return sent
    finally:
        for producer in producers.values():
            producer.close()
        client.close()


@dataclass
class _Written(WriterCommitMessage):
    count: int


class _BatchWriter(DataSourceWriter):
    def __init__(self, options: Mapping[str, str]):
        self.options = dict(options)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _Written(write_rows(self.options, iterator))


class _StreamWriter(DataSourceStreamWriter):
    def __init__(self, options: Mapping[str, str]):
        self.options = dict(options)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _Written(write_rows(self.options, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Messages are stored once each task's producer flushed; nothing is left to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Messages a failed task stored stay stored (at-least-once delivery)."""


# --------------------------------------------------------------------------- the source


class MagnetarDataSource(DataSource):
    """``format("magnetar")``: Magnetar topics as a Spark source and sink.

    Options: ``serviceUrl`` (``pulsar://host:6650``), ``adminUrl`` (``http://host:8080``),
    ``topics`` (comma list) or ``topicsPattern`` (a regex over full or local names),
    ``startingOffsets``/``endingOffsets`` (``earliest``, ``latest`` or JSON
    ``{"topic": {"0": 42}}``, -2 for earliest and -1 for latest, as in Spark's Kafka
    source), ``maxEntriesPerTrigger`` (messages per micro-batch, shared over
    partitions), ``decodeSchema`` (``true``: the topic's JSON/Avro schema fields as
    extra columns, see :mod:`spark._decode`), and for writes ``topic`` (used when a row has no ``topic`` column).
    """

    @classmethod
    def name(cls) -> str:
        return "magnetar"

    def schema(self) -> StructType | str:
        decoder = _decoder(self.options, AdminClient(_required(self.options, "adminUrl")))
        return SCHEMA if decoder is None else f"{SCHEMA}, {decoder.ddl}"

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return _BatchWriter(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return _StreamWriter(self.options)
