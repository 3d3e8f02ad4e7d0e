"""The Kafka handler on the wire (our codec on a socket) against a real standalone broker:
what bad input gets, idempotence, pipelining, acks=0, long-poll fetch."""

from __future__ import annotations

import struct
import threading
import time

import pytest

from handlers.kafka._codec import APIS, Data, decode_response, encode_request
from handlers.kafka._errors import ErrorCode
from handlers.kafka._records import Record, decode_batches, encode_batch
from tests._standalone import Standalone
from tests.handlers.kafka._wire import Wire, free_port

PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS, INIT_PID = 0, 1, 2, 3, 18, 22
ADD_PARTITIONS_TO_TXN, END_TXN = 24, 26
JOIN_GROUP, DESCRIBE_GROUPS = 11, 15


def produce_body(topic: str, records: bytes, *, partition: int = 0, acks: int = -1) -> Data:
    return Data(transactional_id=None, acks=acks, timeout_ms=5000, topic_data=[
        Data(name=topic, partition_data=[Data(index=partition, records=records)])])


def batch(values: list[bytes], **kw: int) -> bytes:
    return encode_batch([Record(offset_delta=i, timestamp=int(time.time() * 1000), value=v)
                         for i, v in enumerate(values)], base_offset=0, **kw)


def part(resp: Data) -> Data:
    return resp.responses[0].partition_responses[0]


def fetch_body(topic: str, offset: int, *, max_wait: int = 0, min_bytes: int = 1) -> Data:
    return Data(replica_id=-1, max_wait_ms=max_wait, min_bytes=min_bytes, max_bytes=1 << 20,
                isolation_level=0, session_id=0, session_epoch=-1, topics=[Data(
                    topic=topic, partitions=[Data(partition=0, fetch_offset=offset,
                                                  partition_max_bytes=1 << 20)])],
                forgotten_topics_data=[], rack_id="")


def test_api_versions_advertises_exactly_what_is_served(boot: str) -> None:
    with Wire(boot) as w:
        resp = w.call(API_VERSIONS, 3, Data(client_software_name="t", client_software_version="1"))
    assert resp.error_code == 0
    assert {(k.api_key, k.min_version, k.max_version) for k in resp.api_keys} == {
        (a.key, a.min_version, a.max_version) for a in APIS.values()}


def test_api_versions_refuses_an_invalid_client_software_name(boot: str) -> None:
    """KIP-511: a client software name or version that is not alphanumerics with inner
    '-' and '.' is INVALID_REQUEST, as Kafka answers, with no API listed."""
    with Wire(boot) as w:
        for name, version in (("bad name", "1.0"), ("ok", "1.0-"), ("", "1")):
            resp = w.call(API_VERSIONS, 3, Data(client_software_name=name,
                                                client_software_version=version))
            assert (resp.error_code, resp.api_keys) == (ErrorCode.INVALID_REQUEST, [])
        good = w.call(API_VERSIONS, 3, Data(client_software_name="confluent-kafka-python",
                                            client_software_version="2.16.1-rdkafka-2.16.0"))
        assert good.error_code == 0 and good.api_keys


def test_metadata_advertises_the_bound_port(boot: str, unique: str) -> None:
    with Wire(boot) as w:
        resp = w.call(METADATA, 12, Data(topics=[Data(name=f"md-{unique}")],
                                         allow_auto_topic_creation=True))
    assert [(b.host, b.port) for b in resp.brokers] == [("127.0.0.1", int(boot.rsplit(":", 1)[1]))]
    [t] = resp.topics
    assert t.error_code == 0 and len(t.partitions) >= 1
    assert t.partitions[0].leader_id == resp.brokers[0].node_id


def test_unknown_and_invalid_topics(boot: str, unique: str) -> None:
    with Wire(boot) as w:
        resp = w.call(METADATA, 12, Data(topics=[Data(name=f"nope-{unique}"), Data(name="bad name!")],
                                         allow_auto_topic_creation=False))
        codes = [t.error_code for t in resp.topics]
        assert codes == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.INVALID_TOPIC_EXCEPTION]
        resp = w.call(PRODUCE, 9, produce_body("bad name!", batch([b"x"])))
        assert part(resp).error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
        resp = w.call(FETCH, 12, fetch_body(f"nope2-{unique}", 0))
        assert resp.responses[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_message_too_large(boot: str, unique: str) -> None:
    big = batch([b"x" * (6 * 1024 * 1024)])
    with Wire(boot) as w:
        resp = w.call(PRODUCE, 9, produce_body(f"big-{unique}", big))
        assert part(resp).error_code == ErrorCode.MESSAGE_TOO_LARGE
        resp = w.call(PRODUCE, 9, produce_body(f"big-{unique}", batch([b"small"])))
        assert part(resp).error_code == 0


def test_corrupt_batch_is_refused(boot: str, unique: str) -> None:
    raw = bytearray(batch([b"abc" * 10]))
    raw[-2] ^= 0x55
    with Wire(boot) as w:
        resp = w.call(PRODUCE, 9, produce_body(f"crc-{unique}", bytes(raw)))
    assert part(resp).error_code == ErrorCode.CORRUPT_MESSAGE


def test_an_unsupported_version_closes_the_connection_but_for_api_versions(boot: str) -> None:
    """As Kafka: ApiVersions at a version not served is answered UNSUPPORTED_VERSION in
    its v0 layout, with the table, and the connection stays open; any other API at a
    version (or an API key) not served cannot be parsed, and the connection is closed
    without an answer."""
    with Wire(boot) as w:
        w.send_raw(struct.pack(">ihhi", 8, API_VERSIONS, 99, 76))
        frame = w.read_frame()
        assert frame[:6] == struct.pack(">ih", 76, ErrorCode.UNSUPPORTED_VERSION)
        assert w.call(API_VERSIONS, 0, Data()).error_code == 0
        for key, version in ((METADATA, 99), (777, 0)):
            with Wire(boot) as bad:
                assert bad.call(API_VERSIONS, 0, Data()).error_code == 0
                bad.send_raw(struct.pack(">ihhi", 8, key, version, 77))
                with pytest.raises(ConnectionError):
                    bad.read_frame()


def test_requests_before_one_that_ends_the_connection_are_answered(boot: str) -> None:
    """Kafka reads a connection's next request only once the last one is answered: those
    pipelined before a request it cannot parse get their responses, then it closes."""
    with Wire(boot) as w:
        w.send_raw(encode_request(API_VERSIONS, 3, 1, "t", Data(client_software_name="t",
                                                                 client_software_version="1"))
                   + encode_request(METADATA, 12, 2, "t", Data(topics=[],
                                                               allow_auto_topic_creation=False))
                   + struct.pack(">ihhi", 8, METADATA, 99, 3))
        assert decode_response(API_VERSIONS, 3, w.read_frame())[0] == 1
        cid, body = decode_response(METADATA, 12, w.read_frame())
        assert cid == 2 and body.brokers
        with pytest.raises(ConnectionError):
            w.read_frame()


def test_unsupported_version_and_absurd_length_leave_others_served(boot: str) -> None:
    with Wire(boot) as good, Wire(boot) as bad, Wire(boot) as worse:
        bad.send_raw(struct.pack(">ihhi", 8, METADATA, 99, 77))
        with pytest.raises(ConnectionError):
            bad.read_frame()
        worse.send_raw(struct.pack(">i", -5))
        with pytest.raises(ConnectionError):
            worse.read_frame()
        worse2 = Wire(boot)
        worse2.send_raw(struct.pack(">i", 2**31 - 1) + b"\x00" * 64)
        with pytest.raises(ConnectionError):
            worse2.read_frame()
        worse2.close()
        assert good.call(API_VERSIONS, 3, Data(client_software_name="a",
                                               client_software_version="b")).error_code == 0


def test_pipelined_produce_keeps_order_and_acks_zero_gets_no_response(boot: str, unique: str) -> None:
    topic = f"pipe-{unique}"
    with Wire(boot) as w:
        ids = [w.send(PRODUCE, 9, produce_body(topic, batch([b"%d" % i, b"x"]))) for i in range(40)]
        w.send(PRODUCE, 9, produce_body(topic, batch([b"fire-and-forget"]), acks=0))
        last = w.send(API_VERSIONS, 0, Data())
        offsets = []
        for cid in ids:
            frame = w.read_frame()
            assert struct.unpack(">i", frame[:4])[0] == cid
            from handlers.kafka._codec import decode_response
            _, body = decode_response(PRODUCE, 9, frame)
            offsets.append(part(body).base_offset)
        assert offsets == [2 * i for i in range(40)]
        frame = w.read_frame()
        assert struct.unpack(">i", frame[:4])[0] == last
        resp = w.call(FETCH, 12, fetch_body(topic, 79))
        values = [r.value for b in decode_batches(resp.responses[0].partitions[0].records)
                  for r in b.records]
        assert values[-2:] == [b"x", b"fire-and-forget"]


def test_idempotent_producer_retry_is_not_stored_twice(boot: str, unique: str) -> None:
    topic = f"idem-{unique}"
    with Wire(boot) as w:
        pid = w.call(INIT_PID, 4, Data(transactional_id=None, transaction_timeout_ms=60000))
        assert pid.error_code == 0 and pid.producer_id >= 0
        kw = {"producer_id": pid.producer_id, "producer_epoch": pid.producer_epoch}
        first = part(w.call(PRODUCE, 9, produce_body(topic, batch([b"a", b"b"], base_sequence=0, **kw))))
        again = part(w.call(PRODUCE, 9, produce_body(topic, batch([b"a", b"b"], base_sequence=0, **kw))))
        assert first.error_code == again.error_code == 0
        assert again.base_offset == first.base_offset
        nxt = part(w.call(PRODUCE, 9, produce_body(topic, batch([b"c"], base_sequence=2, **kw))))
        assert nxt.base_offset == first.base_offset + 2
        gap = part(w.call(PRODUCE, 9, produce_body(topic, batch([b"d"], base_sequence=9, **kw))))
        assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        resp = w.call(LIST_OFFSETS, 7, Data(replica_id=-1, isolation_level=0, topics=[Data(
            name=topic, partitions=[Data(partition_index=0, timestamp=-1)])]))
        assert resp.topics[0].partitions[0].offset == first.base_offset + 3


def test_transactional_producer_retry_is_not_staged_twice(boot: str, unique: str) -> None:
    topic, tid = f"idem-txn-{unique}", f"idem-txn-{unique}"
    with Wire(boot) as w:
        w.call(PRODUCE, 9, produce_body(topic, batch([b"first"])))  # creates the topic
        pid = w.call(INIT_PID, 4, Data(transactional_id=tid, transaction_timeout_ms=60000))
        kw = {"producer_id": pid.producer_id, "producer_epoch": pid.producer_epoch}
        added = w.call(ADD_PARTITIONS_TO_TXN, 3, Data(transactional_id=tid, **kw, topics=[
            Data(name=topic, partitions=[0])]))
        assert added.results[0].results[0].error_code == 0

        def send(values: list[bytes], seq: int) -> int:
            body = produce_body(topic, batch(values, base_sequence=seq, transactional=True, **kw))
            body.transactional_id = tid
            return int(part(w.call(PRODUCE, 9, body)).error_code)

        assert send([b"a", b"b"], 0) == 0
        assert send([b"a", b"b"], 0) == 0  # a retry: answered, not staged again
        assert send([b"d"], 9) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert send([b"c"], 2) == 0
        assert w.call(END_TXN, 3, Data(transactional_id=tid, **kw, committed=True)).error_code == 0
        resp = w.call(FETCH, 12, fetch_body(topic, 0))
        values = [r.value for b in decode_batches(resp.responses[0].partitions[0].records)
                  for r in b.records]
        assert values == [b"first", b"a", b"b", b"c"]


def test_describe_groups_shows_the_address_a_member_connected_from(boot: str, unique: str) -> None:
    group = f"host-{unique}"
    with Wire(boot, source_host="127.0.0.2") as w:
        joined = w.call(JOIN_GROUP, 5, Data(
            group_id=group, session_timeout_ms=10_000, rebalance_timeout_ms=10_000, member_id="",
            group_instance_id=None, protocol_type="consumer",
            protocols=[Data(name="range", metadata=b"")]))
        assert joined.error_code == 0
        described = w.call(DESCRIBE_GROUPS, 5, Data(groups=[group],
                                                     include_authorized_operations=False))
        assert [m.client_host for m in described.groups[0].members] == ["/127.0.0.2"]


def test_long_poll_fetch_is_woken_by_new_data(boot: str, unique: str) -> None:
    topic = f"poll-{unique}"
    with Wire(boot) as w, Wire(boot) as p:
        p.call(PRODUCE, 9, produce_body(topic, batch([b"first"])))
        done: list[float] = []
        result: list[Data] = []

        def fetch() -> None:
            result.append(w.call(FETCH, 12, fetch_body(topic, 1, max_wait=10_000)))
            done.append(time.monotonic())

        t = threading.Thread(target=fetch)
        t.start()
        time.sleep(0.3)
        sent = time.monotonic()
        p.call(PRODUCE, 9, produce_body(topic, batch([b"second"])))
        t.join(15)
        assert done and done[0] - sent < 1.0
        recs = [r.value for b in decode_batches(result[0].responses[0].partitions[0].records)
                for r in b.records]
        assert recs == [b"second"]


def test_fetch_out_of_range(boot: str, unique: str) -> None:
    topic = f"oor-{unique}"
    with Wire(boot) as w:
        w.call(PRODUCE, 9, produce_body(topic, batch([b"x"])))
        resp = w.call(FETCH, 12, fetch_body(topic, 5))
        p = resp.responses[0].partitions[0]
        assert p.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
        assert p.high_watermark == 1


def test_broker_restart_keeps_offsets(tmp_path_factory: pytest.TempPathFactory, unique: str) -> None:
    from tests.handlers.kafka._wire import bootstrap
    from tests.handlers.kafka.conftest import KAFKA_CONF
    data = tmp_path_factory.mktemp("restart")
    # The ledgers name their bookie by address: the restarted bookie must keep its port.
    conf = {**KAFKA_CONF, "bookiePort": free_port()}
    s = Standalone(data, conf=conf).start()
    topic = f"rs-{unique}"
    try:
        with Wire(bootstrap(s.addresses)) as w:
            w.call(PRODUCE, 9, produce_body(topic, batch([b"a", b"b", b"c"])))
            pid = w.call(INIT_PID, 4, Data(transactional_id=None, transaction_timeout_ms=60000))
            kw = {"producer_id": pid.producer_id, "producer_epoch": pid.producer_epoch}
            first = part(w.call(PRODUCE, 9, produce_body(topic, batch([b"d"], base_sequence=0, **kw))))
            assert first.base_offset == 3
    finally:
        s.kill()
    s = Standalone(data, conf=conf).start()
    try:
        with Wire(bootstrap(s.addresses)) as w:
            resp = w.call(FETCH, 12, fetch_body(topic, 1))
            p = resp.responses[0].partitions[0]
            assert p.high_watermark == 4
            b = decode_batches(p.records)[0]
            assert b.base_offset == 0 and [r.value for r in b.records] == [b"a", b"b", b"c"]
            # The idempotent producer's retry after the restart is recognised, not stored.
            again = part(w.call(PRODUCE, 9, produce_body(topic, batch([b"d"], base_sequence=0, **kw))))
            assert (again.error_code, again.base_offset) == (0, 3)
            nxt = part(w.call(PRODUCE, 9, produce_body(topic, batch([b"e"], base_sequence=1, **kw))))
            assert (nxt.error_code, nxt.base_offset) == (0, 4)
    finally:
        s.kill()
