"""Incremental fetch sessions (KIP-227): the session cache on its own, then the wire
protocol against a real broker, then kafka-python (which uses sessions) end to end."""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import pytest

from handlers.kafka._codec import Data, KafkaConnection
from handlers.kafka._errors import ErrorCode
from handlers.kafka._fetch_session import MAX_EPOCH, FetchSessionCache, next_epoch
from handlers.kafka._records import decode_batches
from tests._standalone import Standalone
from tests.handlers.kafka._wire import Wire, bootstrap
from tests.handlers.kafka.conftest import KAFKA_CONF
from tests.handlers.kafka.test_codec import FIXTURES
from tests.handlers.kafka.test_wire import FETCH, PRODUCE, batch, produce_body

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:kafka")


def _topics(topic: str, offsets: dict[int, int]) -> list[Data]:
    return [Data(topic=topic, partitions=[
        Data(partition=p, fetch_offset=o, partition_max_bytes=1 << 20, log_start_offset=-1,
             current_leader_epoch=-1, last_fetched_epoch=-1) for p, o in offsets.items()])]


def _forget(topic: str, partitions: list[int]) -> list[Data]:
    return [Data(topic=topic, partitions=partitions)]


def _part(index: int, hw: int, records: bytes = b"", error: int = 0) -> Data:
    return Data(partition_index=index, error_code=error, high_watermark=hw,
                last_stable_offset=hw, log_start_offset=0, records=records)


# -- the cache -----------------------------------------------------------------------------


def test_epochs_wrap_to_one() -> None:
    assert next_epoch(0) == 1 and next_epoch(41) == 42 and next_epoch(MAX_EPOCH) == 1


def test_session_lifecycle_and_errors() -> None:
    cache = FetchSessionCache(rng=random.Random(1))
    sessionless = cache.context(0, -1, _topics("t", {0: 0}), [], 0)
    assert sessionless.session is None and sessionless.wanted == [("t", 0, 0, 1 << 20)]

    full = cache.context(0, 0, _topics("t", {0: 0, 1: 5}), [], 0)
    sid = full.session_id
    assert sid != 0 and len(cache) == 1
    # A full response answers every partition and remembers what it told.
    assert len(cache.respond(full, [(("t", 0), _part(0, 3, b"x")), (("t", 1), _part(1, 5))])) == 2

    # Incremental, nothing changed: the session supplies both partitions, none answered.
    inc = cache.context(sid, 1, [], [], 1)
    assert inc.incremental and {w[:2] for w in inc.wanted} == {("t", 0), ("t", 1)}
    assert cache.respond(inc, [(("t", 0), _part(0, 3)), (("t", 1), _part(1, 5))]) == []

    # Partition 0 moves its offset; new data on 1 raises its high watermark: only 1 answers.
    inc = cache.context(sid, 2, _topics("t", {0: 3}), [], 2)
    assert ("t", 0, 3, 1 << 20) in inc.wanted
    got = cache.respond(inc, [(("t", 0), _part(0, 3)), (("t", 1), _part(1, 6, b"y"))])
    assert [k for k, _ in got] == [("t", 1)]

    # Forgetting a partition drops it from the session.
    inc = cache.context(sid, 3, [], _forget("t", [1]), 3)
    assert [w[:2] for w in inc.wanted] == [("t", 0)]

    # A replayed epoch and an unknown session are refused, as Kafka does.
    assert cache.context(sid, 3, [], [], 4).error == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert cache.context(sid + 1, 1, [], [], 4).error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    # An error on a partition is always news.
    inc = cache.context(sid, 4, [], [], 5)
    assert len(cache.respond(inc, [(("t", 0), _part(0, 3, error=ErrorCode.OFFSET_OUT_OF_RANGE))])) == 1

    # Epoch -1 closes the session: its id is unknown afterwards.
    closing = cache.context(sid, -1, _topics("t", {0: 3}), [], 6)
    assert closing.session is None and len(cache) == 0
    assert cache.context(sid, 5, [], [], 7).error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_cache_is_bounded_and_evicts_idle_then_smaller_sessions() -> None:
    cache = FetchSessionCache(slots=2, eviction_ms=120_000, rng=random.Random(2))
    a = cache.context(0, 0, _topics("t", {0: 0, 1: 0}), [], 0).session_id
    b = cache.context(0, 0, _topics("t", {0: 0, 1: 0, 2: 0}), [], 1_000).session_id
    # Full, nobody idle long enough, nobody smaller than two partitions: no session.
    refused = cache.context(0, 0, _topics("u", {0: 0, 1: 0}), [], 2_000)
    assert refused.session_id == 0 and refused.wanted and len(cache) == 2
    # A bigger newcomer evicts the least recently used smaller session (a).
    c = cache.context(0, 0, _topics("u", {0: 0, 1: 0, 2: 0, 3: 0}), [], 3_000).session_id
    assert c and set(cache.sessions) == {b, c} and cache.evictions == 1
    assert cache.context(a, 1, [], [], 3_000).error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    # Once b has been idle for the eviction time, any newcomer may take its slot.
    d = cache.context(0, 0, _topics("v", {0: 0}), [], 1_000 + 120_000).session_id
    assert d and set(cache.sessions) == {c, d}


def test_the_smallest_session_makes_room_for_a_bigger_one() -> None:
    cache = FetchSessionCache(slots=2, rng=random.Random(3))
    big = cache.context(0, 0, _topics("t", {0: 0, 1: 0, 2: 0}), [], 0).session_id
    small = cache.context(0, 0, _topics("u", {0: 0}), [], 1_000).session_id
    new = cache.context(0, 0, _topics("v", {0: 0, 1: 0}), [], 2_000).session_id
    assert new and set(cache.sessions) == {big, new} and small not in cache.sessions


def test_zero_slots_means_no_sessions() -> None:
    cache = FetchSessionCache(slots=0)
    ctx = cache.context(0, 0, _topics("t", {0: 0}), [], 0)
    assert ctx.session_id == 0 and ctx.error == 0 and ctx.wanted


@pytest.mark.parametrize(("client", "epoch"), [("confluent", -1), ("kafkapython", 0)])
def test_what_each_client_asks_for(client: str, epoch: int) -> None:
    """The golden Fetch frames: librdkafka sends sessionless full fetches (id 0, epoch
    -1); kafka-python's first fetch opens a session (id 0, epoch 0)."""
    conn = KafkaConnection()
    conn.receive_data((FIXTURES / f"{client}_fetch_v12.bin").read_bytes())
    req = conn.next_event()
    assert (req.body.session_id, req.body.session_epoch) == (0, epoch)
    ctx = FetchSessionCache().context(req.body.session_id, req.body.session_epoch,
                                      req.body.topics, req.body.forgotten_topics_data, 0)
    assert (ctx.session is not None) == (epoch == 0) and ctx.wanted


# -- the wire ------------------------------------------------------------------------------


def _fetch(session_id: int, epoch: int, topics: list[Data], forgotten: list[Data] | None = None
           ) -> Data:
    return Data(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                session_id=session_id, session_epoch=epoch, topics=topics,
                forgotten_topics_data=forgotten or [], rack_id="")


def _values(part: Data) -> list[bytes]:
    return [r.value for b in decode_batches(part.records or b"") for r in b.records]


def test_incremental_fetch_over_the_wire(boot: str, unique: str) -> None:
    topic = f"session-{unique}"
    with Wire(boot) as w:
        w.call(PRODUCE, 9, produce_body(topic, batch([b"a0"])))
        opened = w.call(FETCH, 12, _fetch(0, 0, _topics(topic, {0: 0})))
        sid = opened.session_id
        assert opened.error_code == 0 and sid != 0
        assert _values(opened.responses[0].partitions[0]) == [b"a0"]

        # The offset moved to 1 and nothing new: an empty incremental response.
        quiet = w.call(FETCH, 12, _fetch(sid, 1, _topics(topic, {0: 1})))
        assert quiet.error_code == 0 and quiet.session_id == sid and quiet.responses == []

        # New data: the partition comes back although the request names no partition.
        w.call(PRODUCE, 9, produce_body(topic, batch([b"a1"])))
        news = w.call(FETCH, 12, _fetch(sid, 2, []))
        assert [_values(p) for t in news.responses for p in t.partitions] == [[b"a1"]]

        stale = w.call(FETCH, 12, _fetch(sid, 2, []))
        assert stale.error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH and stale.responses == []
        # Forgotten: the session is empty, so new data is not reported.
        w.call(FETCH, 12, _fetch(sid, 3, [], [Data(topic=topic, partitions=[0])]))
        w.call(PRODUCE, 9, produce_body(topic, batch([b"a2"])))
        assert w.call(FETCH, 12, _fetch(sid, 4, [])).responses == []
        # Closing: a sessionless full fetch, and the session is gone.
        closed = w.call(FETCH, 12, _fetch(sid, -1, _topics(topic, {0: 2})))
        assert closed.session_id == 0 and _values(closed.responses[0].partitions[0]) == [b"a2"]
        gone = w.call(FETCH, 12, _fetch(sid, 5, []))
        assert gone.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_fetch_v6_and_librdkafka_style_fetches_are_sessionless(boot: str, unique: str) -> None:
    topic = f"nosession-{unique}"
    with Wire(boot) as w:
        w.call(PRODUCE, 9, produce_body(topic, batch([b"x"])))
        v6 = w.call(FETCH, 6, _fetch(0, -1, _topics(topic, {0: 0})))
        assert _values(v6.responses[0].partitions[0]) == [b"x"]
        full = w.call(FETCH, 11, _fetch(0, -1, _topics(topic, {0: 1})))
        assert full.session_id == 0 and len(full.responses[0].partitions) == 1


def test_kafka_python_consumes_through_an_incremental_session(boot: str, unique: str) -> None:
    topic = f"kp-session-{unique}"
    producer = KafkaProducer(bootstrap_servers=boot)
    consumer = KafkaConsumer(bootstrap_servers=boot, auto_offset_reset="earliest",
                             enable_auto_commit=False, fetch_max_wait_ms=100)
    try:
        for _ in range(3):
            producer.send(topic, value=b"warm", partition=0)
        producer.flush(15)
        consumer.assign([KTopicPartition(topic, 0)])
        got: list[bytes] = []
        for round_ in range(4):
            for i in range(5):
                producer.send(topic, value=b"r%d-%d" % (round_, i))
            producer.flush(15)
            want = 3 + 5 * (round_ + 1)
            for _ in range(100):
                for records in consumer.poll(timeout_ms=200).values():
                    got.extend(r.value for r in records)
                if len(got) >= want:
                    break
            assert len(got) == want
        assert got[3:] == [b"r%d-%d" % (r, i) for r in range(4) for i in range(5)]
        # The client ran in a session the broker created, several epochs deep.
        handlers = consumer._fetcher._session_handlers  # noqa: SLF001
        metadata = [h.next_metadata for h in handlers.values()]
        assert metadata and all(m.session_id != 0 and m.epoch > 2 for m in metadata)
    finally:
        consumer.close()
        producer.close()


def test_a_full_session_cache_leaves_new_clients_sessionless(tmp_path: Path, unique: str) -> None:
    """With max.incremental.fetch.session.cache.slots=1 the first consumer holds the only
    slot; the second is told (session id 0) to keep sending full fetches, and both read
    everything."""
    topic = f"slots-{unique}"
    server = Standalone(tmp_path, conf={**KAFKA_CONF,
                                        "max.incremental.fetch.session.cache.slots": 1}).start()
    consumers: list[Any] = []
    try:
        boot = bootstrap(server.addresses)
        producer = KafkaProducer(bootstrap_servers=boot)
        for i in range(10):
            producer.send(topic, value=b"m%d" % i, partition=0)
        producer.flush(15)
        producer.close()
        for _ in range(2):
            c = KafkaConsumer(bootstrap_servers=boot, auto_offset_reset="earliest",
                              enable_auto_commit=False, fetch_max_wait_ms=100)
            c.assign([KTopicPartition(topic, 0)])
            got: list[bytes] = []
            for _ in range(100):
                for records in c.poll(timeout_ms=200).values():
                    got.extend(r.value for r in records)
                if len(got) >= 10:
                    break
            assert got == [b"m%d" % i for i in range(10)]
            consumers.append(c)
        # One more poll each, so that both have asked for a session since the other's.
        for c in consumers:
            c.poll(timeout_ms=200)
        ids = [h.next_metadata.session_id for c in consumers
               for h in c._fetcher._session_handlers.values()]  # noqa: SLF001
        assert ids[0] != 0 and ids[1:] == [0]
    finally:
        for c in consumers:
            c.close()
        server.kill()
