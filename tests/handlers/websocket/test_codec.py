"""The WebSocket API's sans-IO codec: paths, query parameters, frames and message ids,
checked against values Pulsar's own code and documentation give."""

from __future__ import annotations

import random
import string

import pytest

from core.naming import TopicName
from handlers.websocket._codec import (
    ConsumerParams,
    FrameError,
    InvalidParams,
    Kind,
    MessageId,
    ProducerParams,
    ReaderParams,
    WebSocketError,
    ack_set_without,
    choose_partition,
    decode_consumer_command,
    decode_message_id,
    decode_producer_message,
    encode_message_id,
    java_string_hash,
    parse_endpoint,
    parse_time,
    producer_ack,
    producer_error,
)


@pytest.mark.parametrize(("path", "kind", "topic", "subscription"), [
    ("/ws/v2/producer/persistent/public/default/t", Kind.producer, "persistent://public/default/t", ""),
    ("/ws/v2/producer/non-persistent/a/b/c?x=1", Kind.producer, "non-persistent://a/b/c", ""),
    ("/ws/v2/reader/persistent/public/default/a/b", Kind.reader, "persistent://public/default/a/b", ""),
    ("/ws/v2/consumer/persistent/public/default/t/s", Kind.consumer, "persistent://public/default/t", "s"),
    ("/ws/v2/consumer/persistent/public/default/a%2Fb/my%20sub", Kind.consumer,
     "persistent://public/default/a/b", "my sub"),
    ("/ws/v2/producer/persistent/public/default/a//b", Kind.producer, "persistent://public/default/a/b", ""),
])
def test_endpoints_as_pulsar_reads_their_paths(path, kind, topic, subscription):
    endpoint = parse_endpoint(path)
    assert endpoint is not None
    assert (endpoint.kind, str(endpoint.topic), endpoint.subscription) == (kind, topic, subscription)


@pytest.mark.parametrize(("path", "kind", "topic", "subscription"), [
    ("/ws/producer/persistent/my-tenant/my-cluster/my-ns/my-topic", Kind.producer,
     "persistent://my-tenant/my-cluster/my-ns/my-topic", ""),
    ("/ws/consumer/persistent/my-tenant/my-cluster/my-ns/my-topic/my-sub", Kind.consumer,
     "persistent://my-tenant/my-cluster/my-ns/my-topic", "my-sub"),
    ("/ws/reader/non-persistent/my-tenant/global/my-ns/a%2Fb", Kind.reader,
     "non-persistent://my-tenant/global/my-ns/a/b", ""),
])
def test_v1_paths_name_a_topic_with_a_cluster(path, kind, topic, subscription):
    endpoint = parse_endpoint(path)
    assert endpoint is not None and endpoint.topic is None
    assert (endpoint.kind, endpoint.v1_topic, endpoint.subscription) == (kind, topic, subscription)


@pytest.mark.parametrize("path", ["/ws/pingpong", "/ws/v2/pingpong"])
def test_pingpong_endpoint(path):
    endpoint = parse_endpoint(path)
    assert endpoint is not None and endpoint.kind is Kind.pingpong


@pytest.mark.parametrize("path", ["/ws", "/ws/v2", "/ws/v2/other/persistent/a/b/c", "/admin/v2/x",
                                  "/ws/v3/consumer/persistent/a/b/c/s"])
def test_paths_of_no_endpoint(path):
    assert parse_endpoint(path) is None


@pytest.mark.parametrize("path", [
    "/ws/v2/producer/persistent/public/default",
    "/ws/v2/producer/bogus/public/default/t",
    "/ws/v2/consumer/persistent/public/default/t",
    "/ws/v2/consumer/persistent/public/default/t/",
    "/ws/v2/producer/persistent/pub%2Flic/default/t",
    "/ws/producer/persistent/my-tenant/my-cluster/my-ns",
    "/ws/consumer/persistent/my-tenant/my-cluster/my-ns/t/",
    "/ws/producer/persistent/my-tenant/bad%20cluster/my-ns/t",
])
def test_paths_pulsar_refuses(path):
    with pytest.raises(InvalidParams):
        parse_endpoint(path)


def test_message_ids_as_pulsars_to_byte_array_writes_them():
    # Pulsar's documentation: a consumer's message id for ledger 3, entry 0 (batch size 0)
    assert encode_message_id(MessageId(3, 0)) == "CAMQADAA"
    assert decode_message_id("CAMQADAA") == MessageId(3, 0)
    batch = MessageId(7, 9, partition=2, batch_index=1, batch_size=4)
    assert decode_message_id(encode_message_id(batch)) == batch
    # and the older form without a batch size
    assert decode_message_id("CAAQAw==") == MessageId(0, 3)
    assert decode_message_id("CAAQAw") == MessageId(0, 3)  # padding optional, as in Java


@pytest.mark.parametrize("text", ["", "!!", "CA==", None, 3, "AAAA"])
def test_bad_message_ids(text):
    with pytest.raises(FrameError) as info:
        decode_message_id(text)
    assert info.value.code is WebSocketError.FailedToDeserializeFromJSON


def test_java_string_hash_routes_keys_as_pulsar():
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -2147483648
    assert java_string_hash("€") == 8364
    assert choose_partition("hello", 7, "JavaStringHash", 0) == 99162322 % 7
    assert choose_partition(None, 7, "JavaStringHash", 5) == 5


def test_producer_answers_have_pulsars_fields():
    assert producer_ack("CAMQADAA", "c") == \
        '{"result":"ok","messageId":"CAMQADAA","context":"c","errorCode":0,"schemaVersion":0}'
    assert producer_error(WebSocketError.FailedToDeserializeFromJSON, "bad", None) == \
        '{"result":"send-error:3","errorMsg":"bad","errorCode":0,"schemaVersion":0}'


def test_producer_message_fields():
    msg = decode_producer_message('{"payload":"aGk=","properties":{"a":"b","n":1},"context":"c",'
                                  '"key":"k","eventTime":"2024-01-02T03:04:05.678+01:00",'
                                  '"deliverAfterMs":5,"replicationClusters":["x"],"unknown":true}')
    assert (msg.payload, msg.properties, msg.context, msg.key) == (b"hi", {"a": "b", "n": "1"}, "c", "k")
    assert msg.event_time == parse_time("2024-01-02T02:04:05.678Z")
    assert (msg.deliver_after_ms, msg.replication_clusters) == (5, ["x"])


@pytest.mark.parametrize(("text", "code"), [
    ("nope", WebSocketError.FailedToDeserializeFromJSON),
    ("[1]", WebSocketError.FailedToDeserializeFromJSON),
    ('{"payload": {"a": 1}}', WebSocketError.FailedToDeserializeFromJSON),
    ('{"payload": "aGk=", "properties": [1]}', WebSocketError.FailedToDeserializeFromJSON),
    ('{"context": "c"}', WebSocketError.PayloadEncodingError),
    ('{"payload": "a b"}', WebSocketError.PayloadEncodingError),
    ('{"payload": "aGk=", "eventTime": "2024-01-02"}', WebSocketError.PayloadEncodingError),
])
def test_producer_frames_pulsar_refuses(text, code):
    with pytest.raises(FrameError) as info:
        decode_producer_message(text)
    assert info.value.code is code


def test_frames_never_fail_otherwise():
    rng = random.Random(7)
    alphabet = string.printable + '{}[]":,\\'
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))
        for decode in (decode_producer_message, decode_consumer_command):
            try:
                decode(text)
            except FrameError:
                pass
        try:
            parse_endpoint("/ws/v2/" + text)
        except InvalidParams:
            pass


def test_query_parameters():
    p = ProducerParams.parse(b"producerName=p&initialSequenceId=9&messageRoutingMode=CustomPartition"
                             b"&compressionType=LZ4&batchingEnabled=TRUE")
    assert (p.producer_name, p.initial_sequence_id, p.routing_mode, p.batching) == \
        ("p", 9, "SinglePartition", True)
    topic = TopicName.parse("persistent://public/default/t")
    c = ConsumerParams.parse(b"receiverQueueSize=5000&maxRedeliverCount=2&pullMode=true", topic, "s")
    assert (c.receiver_queue_size, c.max_redeliver_count, c.pull_mode) == (1000, 2, True)
    assert c.dead_letter_topic == "persistent://public/default/t-s-DLQ"
    assert ReaderParams.parse(b"messageId=earliest").start == "earliest"
    assert ReaderParams.parse(b"").start == "latest"
    for bad in (b"subscriptionType=Nope", b"ackTimeoutMillis=5", b"priorityLevel=-1",
                b"receiverQueueSize=x"):
        with pytest.raises(InvalidParams):
            ConsumerParams.parse(bad, topic, "s")
    with pytest.raises(InvalidParams):
        ProducerParams.parse(b"hashingScheme=Nope")


def test_ack_sets_are_signed_longs_with_the_message_cleared():
    assert ack_set_without(3, 1) == [0b101]
    assert ack_set_without(64, 0) == [-2]
    assert ack_set_without(65, 64) == [-1, 0]


def test_consumer_commands():
    assert decode_consumer_command('{"type":"permit","permitMessages":"3"}').permit_messages == 3
    assert decode_consumer_command('{"messageId":"CAMQADAA"}').type is None


@pytest.mark.parametrize(("query", "action"), [
    ("", "FAIL"), ("cryptoFailureAction=CONSUME", "CONSUME"), ("cryptoFailureAction=DISCARD", "DISCARD"),
    ("cryptoFailureAction=consume", "FAIL"),  # Pulsar logs a value it does not know and keeps FAIL
])
def test_crypto_failure_action_as_pulsars_handlers_take_it(query, action):
    topic = TopicName.parse("persistent://public/default/t")
    assert ConsumerParams.parse(query, topic, "s").crypto_failure_action == action
    assert ReaderParams.parse(query).crypto_failure_action == action
