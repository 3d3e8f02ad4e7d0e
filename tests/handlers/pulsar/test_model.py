"""Pulsar's messaging model through the official pulsar-client, on persistent topics:
acknowledgement forms, initial positions, unsubscribe, the last message id, seeks and
readers (by message id, inside batches, by publish time), producer access modes,
subscription types as consumers come and go, unacknowledged-message limits, delayed
delivery from batching producers, unloaded and terminated topics, end-to-end encryption."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pulsar
import pytest

from core.format import pulsar_api_pb2 as pb
from handlers.pulsar import _events as ev
from tests.handlers.pulsar._keys import key_reader
from tests.handlers.pulsar._raw import RawClient
from tests.handlers.pulsar._receive import nack_redelivery_counts, receive_until_idle, wait_until

RECEIVE_MS = 10_000


def _texts(consumer, *, ack: bool = True) -> list[str]:
    """The payloads received until idle, acknowledged unless ``ack`` is false."""
    return [m.data().decode() for m in receive_until_idle(consumer, ack=ack)]


def _send_each(client, topic: str, count: int):
    """Publish m0, m1, ... m<count-1>, one entry each; the producer."""
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(count):
        producer.send(f"m{i}".encode())
    return producer


def _send_one_batch(client, topic: str, texts: list[str]) -> None:
    """Publish ``texts`` as one batch (one entry)."""
    producer = client.create_producer(topic, batching_enabled=True,
                                      batching_max_messages=len(texts),
                                      batching_max_publish_delay_ms=60_000)
    for t in texts:
        producer.send_async(t.encode(), None)
    producer.flush()
    producer.close()


def test_cumulative_ack_holds_across_a_reconnect(client, unique):
    topic = f"cumulative-{unique}"
    consumer = client.subscribe(topic, "s")
    _send_each(client, topic, 10)
    got = [consumer.receive(timeout_millis=RECEIVE_MS) for _ in range(10)]
    consumer.acknowledge_cumulative(got[5])
    consumer.close()
    again = client.subscribe(topic, "s")
    assert _texts(again) == [f"m{i}" for i in range(6, 10)]


def test_cumulative_ack_inside_a_batch_keeps_the_rest_of_it(client, unique):
    topic = f"cumulative-batch-{unique}"
    consumer = client.subscribe(topic, "s", batch_index_ack_enabled=True)
    _send_one_batch(client, topic, [f"m{i}" for i in range(8)])
    got = [consumer.receive(timeout_millis=RECEIVE_MS) for _ in range(8)]
    assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got}) == 1
    consumer.acknowledge_cumulative(got[2])
    consumer.close()
    again = client.subscribe(topic, "s", batch_index_ack_enabled=True)
    assert _texts(again) == [f"m{i}" for i in range(3, 8)]


def test_batch_index_acks_leave_only_the_unacknowledged_messages_of_a_batch(client, unique):
    topic = f"batch-index-{unique}"
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                batch_index_ack_enabled=True)
    texts = [f"m{i}" for i in range(10)]
    _send_one_batch(client, topic, texts)
    got = [consumer.receive(timeout_millis=RECEIVE_MS) for _ in range(10)]
    assert [m.data().decode() for m in got] == texts
    for m in got[::2]:
        consumer.acknowledge(m)
    consumer.close()
    again = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                             batch_index_ack_enabled=True)
    assert _texts(again) == texts[1::2]


def test_a_batch_acknowledged_message_by_message_is_not_redelivered(client, unique):
    topic = f"batch-whole-{unique}"
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    _send_one_batch(client, topic, [f"m{i}" for i in range(5)])
    assert _texts(consumer) == [f"m{i}" for i in range(5)]
    consumer.close()
    assert _texts(client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)) == []


def test_initial_position_decides_whether_a_new_subscription_reads_the_backlog(client, unique):
    topic = f"initial-{unique}"
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"before")
    latest = client.subscribe(topic, "latest", initial_position=pulsar.InitialPosition.Latest)
    earliest = client.subscribe(topic, "earliest",
                                initial_position=pulsar.InitialPosition.Earliest)
    producer.send(b"after")
    assert _texts(latest) == ["after"]
    assert _texts(earliest) == ["before", "after"]


def test_unsubscribe_deletes_the_subscription_and_its_position(client, admin, unique):
    topic = f"unsub-{unique}"
    consumer = client.subscribe(topic, "gone")
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"old")
    consumer.unsubscribe()
    subs = admin.get(f"/admin/v2/persistent/public/default/{topic}/subscriptions")
    assert "gone" not in subs
    # A new subscription of that name starts where a new one starts (the end), not where
    # the old one stopped.
    fresh = client.subscribe(topic, "gone")
    producer.send(b"new")
    assert _texts(fresh) == ["new"]


def test_unsubscribe_is_refused_while_another_consumer_is_attached(client, unique):
    topic = f"unsub-busy-{unique}"
    a = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    b = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.PulsarException):
        a.unsubscribe()
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"still")
    assert sorted(_texts(a) + _texts(b)) == ["still"]


def test_last_message_id_is_the_newest_stored_message(client, unique):
    topic = f"last-id-{unique}"
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode()) for i in range(5)]
    last = consumer.get_last_message_id()
    assert (last.ledger_id(), last.entry_id()) == (ids[-1].ledger_id(), ids[-1].entry_id())
    _send_one_batch(client, topic, ["b0", "b1", "b2"])
    last = consumer.get_last_message_id()
    assert last.entry_id() == ids[-1].entry_id() + 1
    assert last.batch_index() == 2


def test_last_message_id_of_a_batch_of_one_is_the_id_the_producer_got(client, unique):
    # A batching producer sends a lone message as a batch of one: its id has batch
    # index 0, and Pulsar's last message id says so too
    topic = f"last-id-one-{unique}"
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic, batching_enabled=True)
    sent = producer.send(b"only")
    last = consumer.get_last_message_id()
    assert sent.batch_index() == 0
    assert (last.ledger_id(), last.entry_id(), last.batch_index()) == (
        sent.ledger_id(), sent.entry_id(), sent.batch_index())


def _publish_apart(client, topic: str, count: int, consumer) -> list[int]:
    """Publish m0..m{count-1} one at a time, each received (and acknowledged) by
    ``consumer`` before the clock passes on to the next millisecond; their publish times.
    Seeks by time compare against the broker's timestamps, which come after the client's:
    waiting past each receipt puts every publish time after the broker's stamp of the
    message before it."""
    producer = client.create_producer(topic, batching_enabled=False)
    stamps = []
    for i in range(count):
        producer.send(f"m{i}".encode())
        msg = consumer.receive(timeout_millis=RECEIVE_MS)
        consumer.acknowledge(msg)
        stamps.append(msg.publish_timestamp())
        received = time.time() * 1000
        deadline = time.monotonic() + 1
        while time.time() * 1000 <= received + 1:
            assert time.monotonic() < deadline
            time.sleep(0.001)
    return stamps


def test_seek_to_a_publish_time_replays_from_the_first_message_at_or_after_it(client, unique):
    topic = f"seek-time-{unique}"
    consumer = client.subscribe(topic, "s")
    stamps = _publish_apart(client, topic, 6, consumer)
    consumer.seek(stamps[2])
    assert _texts(consumer) == ["m2", "m3", "m4", "m5"]


def test_wait_for_exclusive_producer_takes_over_when_the_exclusive_one_closes(client, unique):
    topic = f"wait-excl-{unique}"
    first = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive,
                                   batching_enabled=False)
    first.send(b"from-first")
    created = threading.Event()
    waiting: list = []

    def wait_for_it() -> None:
        waiting.append(client.create_producer(
            topic, access_mode=pulsar.ProducerAccessMode.WaitForExclusive,
            batching_enabled=False))
        created.set()

    t = threading.Thread(target=wait_for_it, daemon=True)
    t.start()
    # The waiting producer is not granted the topic while the exclusive one holds it.
    assert not created.wait(1.0)
    first.close()
    assert created.wait(RECEIVE_MS / 1000)
    waiting[0].send(b"from-second")
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [reader.read_next(RECEIVE_MS).data() for _ in range(2)] == [b"from-first", b"from-second"]


def test_shared_producers_coexist_and_an_exclusive_one_is_refused_beside_them(client, unique):
    topic = f"shared-prod-{unique}"
    a = client.create_producer(topic, batching_enabled=False)
    b = client.create_producer(topic, batching_enabled=False)
    a.send(b"a")
    b.send(b"b")
    with pytest.raises((pulsar.ProducerBusy, pulsar.ProducerFenced)):
        client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)


def test_a_terminated_topic_refuses_producers_and_consumers_still_drain_it(client, admin, unique):
    topic = f"terminated-{unique}"
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"last")
    admin.post(f"/admin/v2/persistent/public/default/{topic}/terminate")
    with pytest.raises(pulsar.PulsarException):
        producer.send(b"refused")
    with pytest.raises(pulsar.PulsarException):
        client.create_producer(topic)
    assert _texts(consumer) == ["last"]


def _per_key(texts: list[str]) -> dict[str, list[int]]:
    """``key:i`` payloads as the i of each key, in the order received."""
    out: dict[str, list[int]] = {}
    for text in texts:
        k, i = text.split(":")
        out.setdefault(k, []).append(int(i))
    return out


def _key_shared(client, topic: str, name: str, queue: int):
    """A Key_Shared consumer of subscription ``s``."""
    return client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared,
                            consumer_name=name, receiver_queue_size=queue)


def test_key_shared_keeps_each_keys_order_when_a_consumer_leaves(client, unique):
    topic = f"ks-leave-{unique}"
    a, b = _key_shared(client, topic, "a", 1000), _key_shared(client, topic, "b", 1000)
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"k{k}" for k in range(16)]

    def publish(start: int, stop: int) -> None:
        for i in range(start, stop):
            producer.send_async(f"{keys[i % 16]}:{i}".encode(), None, partition_key=keys[i % 16])
        producer.flush()

    publish(0, 160)
    # `a` takes its share and acknowledges none of it; `b` acknowledges its own.
    held = _texts(a, ack=False)
    first_b = _texts(b)
    assert len(held) + len(first_b) == 160 and held
    a.close()
    publish(160, 320)
    # `b` now owns every key: what `a` held comes again, and per key nothing overtakes it.
    rest = _texts(b)
    per_key = _per_key(first_b + rest)
    assert sorted(i for seq in per_key.values() for i in seq) == list(range(320))
    for k, seq in per_key.items():
        assert seq == sorted(seq), k


def _publish_rounds(client, topic: str, keys: list[str], rounds: int) -> None:
    """``key:i`` for each key, ``rounds`` times over, one entry each, keyed."""
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    for i in range(rounds):
        for k in keys:
            producer.send_async(f"{k}:{i}".encode(), None, partition_key=k)
    producer.flush()


def test_a_key_shared_consumer_that_does_not_read_stalls_only_its_own_keys(client, unique):
    # The stuck-consumer failure: `a` fills its small queue and reads no more, so its keys'
    # entries wait in the replay set; `b`'s keys must flow on past them.
    topic = f"ks-slow-{unique}"
    a, b = _key_shared(client, topic, "a", 10), _key_shared(client, topic, "b", 10)
    keys, rounds = [f"k{k}" for k in range(20)], 50
    _publish_rounds(client, topic, keys, rounds)
    got_b = _per_key(_texts(b))
    assert got_b and len(got_b) < len(keys)
    assert all(seq == list(range(rounds)) for seq in got_b.values()), got_b
    # and `a`, once it reads, gets every message of the other keys, in order
    got_a = _per_key(_texts(a))
    assert set(got_a) | set(got_b) == set(keys) and not set(got_a) & set(got_b)
    assert all(seq == list(range(rounds)) for seq in got_a.values())


def test_a_sticky_key_shared_consumer_gets_its_range_while_no_one_covers_the_rest(client, unique):
    topic = f"ks-gap-{unique}"
    b = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared,
                         receiver_queue_size=10,
                         key_shared_policy=pulsar.ConsumerKeySharedPolicy(
                             pulsar.KeySharedMode.Sticky, sticky_ranges=[(32768, 65535)]))
    keys, rounds = [f"k{k}" for k in range(20)], 30
    _publish_rounds(client, topic, keys, rounds)
    got = _per_key(_texts(b))
    assert got and len(got) < len(keys)
    assert all(seq == list(range(rounds)) for seq in got.values()), got


def test_a_negative_ack_inside_a_batch_redelivers_only_that_message(client, unique):
    topic = f"nack-batch-{unique}"
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                batch_index_ack_enabled=True,
                                negative_ack_redelivery_delay_ms=100)
    _send_one_batch(client, topic, ["m0", "m1", "m2", "m3"])
    got = [consumer.receive(timeout_millis=RECEIVE_MS) for _ in range(4)]
    for m in got[:3]:
        consumer.acknowledge(m)
    consumer.negative_acknowledge(got[3])
    again = consumer.receive(timeout_millis=RECEIVE_MS)
    assert (again.data(), again.redelivery_count()) == (b"m3", 1)
    consumer.acknowledge(again)
    assert _texts(consumer) == []


@pytest.mark.parametrize("sub_type", ["Exclusive", "Failover"])
def test_a_single_active_consumer_is_told_no_redelivery_count(client, unique, sub_type):
    # As Pulsar's broker does: only Shared and Key_Shared count redeliveries, so a dead
    # letter policy on these types never takes the message away from the consumer.
    topic = f"nack-single-{sub_type}-{unique}"
    dlq = f"persistent://public/default/{topic}-DLQ"
    consumer = client.subscribe(
        topic, "s", consumer_type=getattr(pulsar.ConsumerType, sub_type),
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=1, dead_letter_topic=dlq))
    _send_each(client, topic, 1)
    assert nack_redelivery_counts(consumer, 3, receive_ms=RECEIVE_MS) == [0, 0, 0]
    assert consumer.receive(timeout_millis=RECEIVE_MS).data() == b"m0"


def test_redeliver_unacknowledged_messages_sends_them_again(client, unique):
    topic = f"redeliver-{unique}"
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    _send_each(client, topic, 3)
    first = [consumer.receive(timeout_millis=RECEIVE_MS) for _ in range(3)]
    consumer.acknowledge(first[1])
    consumer.redeliver_unacknowledged_messages()
    assert sorted(_texts(consumer)) == ["m0", "m2"]


def test_an_unacknowledged_message_of_a_shared_subscription_goes_to_another_consumer(
        client, unique):
    topic = f"shared-timeout-{unique}"
    slow = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                            consumer_name="slow", receiver_queue_size=1)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"work")
    assert slow.receive(timeout_millis=RECEIVE_MS).data() == b"work"
    other = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                             consumer_name="other")
    slow.close()  # without acknowledging
    msg = other.receive(timeout_millis=RECEIVE_MS)
    # as in Pulsar, a consumer leaving is no redelivery the message's count shows
    assert (msg.data(), msg.redelivery_count()) == (b"work", 0)


def test_redelivery_counts_start_anew_once_every_consumer_has_left(client, unique):
    """A consumer restarted with messages in its receive queue does not push them towards
    its dead letter topic: Pulsar counts only what was given back (nack, ack timeout), and
    forgets the counts when the subscription has no consumer left."""
    topic = f"shared-restart-{unique}"

    def subscribe():
        return client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                negative_ack_redelivery_delay_ms=100,
                                dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=1))

    consumer = subscribe()
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(3):
        producer.send(f"m{i}".encode())
    first = consumer.receive(timeout_millis=RECEIVE_MS)
    consumer.negative_acknowledge(first)
    again = [consumer.receive(timeout_millis=RECEIVE_MS) for _ in range(3)]
    assert max(m.redelivery_count() for m in again) == 1
    for _ in range(2):  # restarts, never acknowledging
        consumer.close()
        consumer = subscribe()
    got = sorted((m.data(), m.redelivery_count()) for m in receive_until_idle(consumer))
    assert got == [(b"m0", 0), (b"m1", 0), (b"m2", 0)]


def test_a_consumer_of_several_topics_gets_each_ones_messages(client, unique):
    topics = [f"multi-{unique}-{i}" for i in range(3)]
    consumer = client.subscribe(topics, "s")
    for i, t in enumerate(topics):
        client.create_producer(t, batching_enabled=False).send(f"from-{i}".encode())
    assert sorted(_texts(consumer)) == ["from-0", "from-1", "from-2"]


def test_a_reader_seeks_ahead_to_a_publish_time(client, unique):
    topic = f"reader-seek-{unique}"
    stamps = _publish_apart(client, topic, 4, client.subscribe(topic, "probe"))
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert reader.read_next(RECEIVE_MS).data() == b"m0"
    # The seek disconnects the reader; it must find its subscription where the seek put
    # it when it subscribes again.
    reader.seek(stamps[2])
    assert [reader.read_next(RECEIVE_MS).data() for _ in range(2)] == [b"m2", b"m3"]


def test_a_reader_seeks_back_to_a_message_and_to_a_publish_time(client, unique):
    topic = f"reader-back-{unique}"
    stamps = _publish_apart(client, topic, 6, client.subscribe(topic, "probe"))
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    read = [reader.read_next(RECEIVE_MS) for _ in range(5)]
    assert [m.data() for m in read] == [f"m{i}".encode() for i in range(5)]
    # back before what it read: the broker disconnects it before answering, so the client
    # subscribes again from the seek, not from where it was
    reader.seek(read[1].message_id())
    assert [reader.read_next(RECEIVE_MS).data() for _ in range(3)] == [b"m2", b"m3", b"m4"]
    reader.seek(stamps[1])
    assert [reader.read_next(RECEIVE_MS).data() for _ in range(2)] == [b"m1", b"m2"]


@pytest.mark.parametrize("inclusive", [False, True])
def test_a_reader_starts_at_or_after_a_message_outside_a_batch(client, unique, inclusive):
    topic = f"reader-at-{unique}-{inclusive}"
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode()) for i in range(4)]
    reader = client.create_reader(topic, ids[1], start_message_id_inclusive=inclusive)
    expected = [b"m1", b"m2", b"m3"] if inclusive else [b"m2", b"m3"]
    assert [reader.read_next(RECEIVE_MS).data() for _ in expected] == expected
    assert not reader.has_message_available()
    last = client.create_reader(topic, ids[3], start_message_id_inclusive=inclusive)
    assert last.has_message_available() == inclusive
    if inclusive:
        assert last.read_next(RECEIVE_MS).data() == b"m3"


def test_an_inclusive_reader_at_a_chunked_message_reads_it_whole(client, unique):
    topic = f"reader-chunk-{unique}"
    producer = client.create_producer(topic, batching_enabled=False, chunking_enabled=True)
    big = bytes(range(256)) * (6 * 1024 * 1024 // 256)  # 6 MiB: two chunks of maxMessageSize
    first = producer.send(big)
    producer.send(b"after")
    reader = client.create_reader(topic, first, start_message_id_inclusive=True)
    assert reader.read_next(RECEIVE_MS).data() == big
    assert reader.read_next(RECEIVE_MS).data() == b"after"


def test_failover_spreads_the_partitions_of_a_topic_over_its_consumers(client, admin, unique):
    topic = f"persistent://public/default/fo-parts-{unique}"
    admin.put(f"/admin/v2/persistent/public/default/fo-parts-{unique}/partitions", 4)
    a = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a")
    b = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b")
    producer = client.create_producer(
        topic, batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(40):
        producer.send(f"m{i}".encode())

    def partitions(consumer) -> set[str]:
        return {m.topic_name() for m in receive_until_idle(consumer, ack=True)}

    pa, pb_ = partitions(a), partitions(b)
    assert pa | pb_ == {f"{topic}-partition-{i}" for i in range(4)}
    assert not pa & pb_, "a partition had two active consumers"
    assert len(pa) == len(pb_) == 2


def test_partitions_added_to_a_topic_get_its_subscriptions(client, admin, unique):
    """Pulsar's partition-count update creates the topic's subscriptions on the new
    partitions: what is published there before a consumer comes back is kept for it."""
    path = f"/admin/v2/persistent/public/default/grown-{unique}/partitions"
    admin.put(path, 2)
    topic = f"persistent://public/default/grown-{unique}"
    client.subscribe(topic, "s").close()
    admin.post(path, 4)
    producer = client.create_producer(
        topic, batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(20):
        producer.send(f"m{i}".encode())
    consumer = client.subscribe(topic, "s")
    got = receive_until_idle(consumer, ack=True)
    assert sorted(m.data().decode() for m in got) == sorted(f"m{i}" for i in range(20))
    assert {m.topic_name() for m in got} == {f"{topic}-partition-{i}" for i in range(4)}


def test_failover_spreads_the_topics_of_a_consumer_group_over_its_consumers(client, admin, unique):
    # Each non-partitioned topic picks its active consumer by its name's place on a hash
    # ring of the consumers' names, as Pulsar does, not always the first name.
    topics = [f"fo-ring-{unique}-{i}" for i in range(8)]
    for name in ("c1", "c2"):
        client.subscribe(topics, "s", consumer_type=pulsar.ConsumerType.Failover, consumer_name=name)
    active = {admin.get(f"/admin/v2/persistent/public/default/{t}/stats")["subscriptions"]["s"]
              ["activeConsumerName"] for t in topics}
    assert active == {"c1", "c2"}


def test_failover_gives_partitions_to_the_highest_priority_consumers_only(standalone, admin, unique):
    # The official Python client cannot set a priority level; raw SUBSCRIBE frames do.
    name = f"fo-prio-{unique}-partition-2"
    raws = []
    try:
        for consumer_name, priority in (("a", 1), ("x", 0), ("y", 0)):
            raw = RawClient(standalone.pulsar_url)
            raws.append(raw)
            raw.connect()
            raw.send(ev.CommandSubscribe.build(
                topic=f"persistent://public/default/{name}", subscription="s",
                subType=pb.CommandSubscribe.Failover, consumer_id=1, request_id=1,
                consumer_name=consumer_name, priority_level=priority))
            while not isinstance(raw.next_event(), ev.CommandSuccess):
                pass  # ACTIVE_CONSUMER_CHANGE may come first
        # partition 2 of two top-priority consumers: the first of them, never the standby
        stats = admin.get(f"/admin/v2/persistent/public/default/{name}/stats")
        assert stats["subscriptions"]["s"]["activeConsumerName"] == "x"
    finally:
        for raw in raws:
            raw.close()


def test_a_subscription_without_consumers_may_change_its_type(client, unique):
    topic = f"retype-{unique}"
    exclusive = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Exclusive)
    exclusive.close()
    shared = [client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
              for _ in range(2)]
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"x")
    assert sorted(_texts(shared[0]) + _texts(shared[1])) == ["x"]


def test_a_subscription_with_consumers_refuses_another_type(client, unique):
    topic = f"mixed-{unique}"
    client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Failover)


def test_key_based_batches_reach_key_shared_consumers_one_key_each(client, unique):
    topic = f"kb-{unique}"
    consumers = [client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared,
                                  consumer_name=f"c{i}") for i in range(2)]
    producer = client.create_producer(topic, batching_enabled=True,
                                      batching_type=pulsar.BatchingType.KeyBased,
                                      batching_max_publish_delay_ms=20)
    for i in range(200):
        k = f"k{i % 10}"
        producer.send_async(f"{k}:{i}".encode(), None, partition_key=k)
    producer.flush()
    owner: dict[str, int] = {}
    seen = []
    for ci, c in enumerate(consumers):
        for text in _texts(c):
            k, i = text.split(":")
            assert owner.setdefault(k, ci) == ci, f"{k} reached two consumers"
            seen.append(int(i))
    assert sorted(seen) == list(range(200))


def test_a_message_over_the_maximum_size_is_refused_by_the_client(client, unique):
    producer = client.create_producer(f"too-big-{unique}", batching_enabled=False)
    with pytest.raises(pulsar.MessageTooBig):
        producer.send(b"x" * (5 * 1024 * 1024 + 1))
    producer.send(b"small")  # the producer is still usable


def test_a_consumer_at_its_unacked_limit_gets_nothing_more_until_it_acks_half(
        client, admin, unique):
    topic = f"unacked-{unique}"
    path = f"/admin/v2/persistent/public/default/{topic}"
    a = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, consumer_name="a")
    admin.post(path + "/maxUnackedMessagesOnConsumer", 10)
    _send_each(client, topic, 30)
    held = receive_until_idle(a, ack=False)
    assert len(held) == 10

    def consumer_stats() -> dict:
        return admin.get(path + "/stats")["subscriptions"]["s"]["consumers"][0]

    assert consumer_stats()["blockedConsumerOnUnackedMsgs"] is True
    assert consumer_stats()["unackedMessages"] == 10
    # Another consumer of the subscription is not held back by `a`.
    b = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared, consumer_name="b")
    assert len(receive_until_idle(b, ack=False)) == 10
    # Acknowledging 4 leaves 6, above half the limit: still blocked; the fifth frees it.
    for m in held[:4]:
        a.acknowledge(m)
    assert receive_until_idle(a, ack=False) == []
    a.acknowledge(held[4])
    more = receive_until_idle(a, ack=False)
    assert len(more) >= 5
    assert {m.data() for m in held + more} <= {f"m{i}".encode() for i in range(30)}


def test_a_subscription_at_its_unacked_limit_delivers_to_no_consumer(client, admin, unique):
    topic = f"unacked-sub-{unique}"
    path = f"/admin/v2/persistent/public/default/{topic}"
    consumers = [client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                  consumer_name=f"c{i}") for i in range(2)]
    admin.post(path + "/maxUnackedMessagesOnSubscription", 8)
    _send_each(client, topic, 20)
    held = [m for c in consumers for m in receive_until_idle(c, ack=False)]
    assert len(held) == 8
    assert admin.get(path + "/stats")["subscriptions"]["s"]["blockedSubscriptionOnUnackedMsgs"]
    # Acknowledged, they free the subscription, which delivers (and blocks) again.
    for c in consumers:
        for m in held:
            c.acknowledge(m)
    rest = [m for c in consumers for m in receive_until_idle(c, ack=False)]
    assert rest, "the subscription stayed blocked"
    # Acks arrive a few at a time, so it may free and fill up more than once, but it
    # never holds more than its limit.
    assert admin.get(path + "/stats")["subscriptions"]["s"]["unackedMessages"] <= 8
    assert len({m.data() for m in held + rest}) == len(held) + len(rest)


def test_seek_to_a_message_inside_a_batch_resumes_from_it(client, unique):
    topic = f"seek-batch-{unique}"
    consumer = client.subscribe(topic, "s")
    _send_one_batch(client, topic, [f"m{i}" for i in range(5)])
    got = [consumer.receive(timeout_millis=RECEIVE_MS) for _ in range(5)]
    for m in got:
        consumer.acknowledge(m)
    consumer.seek(got[2].message_id())
    # The broker replays the whole entry; the client drops what precedes the id (and, as
    # for a message outside a batch, the C++ client drops the id's own message too).
    assert _texts(consumer) in (["m2", "m3", "m4"], ["m3", "m4"])


@pytest.mark.parametrize("inclusive", [False, True])
def test_a_reader_starts_inside_a_batch(client, unique, inclusive):
    topic = f"reader-batch-{unique}-{inclusive}"
    probe = client.subscribe(topic, "probe")
    _send_one_batch(client, topic, [f"m{i}" for i in range(5)])
    ids = [probe.receive(timeout_millis=RECEIVE_MS).message_id() for _ in range(5)]
    reader = client.create_reader(topic, ids[2], start_message_id_inclusive=inclusive)
    expected = [b"m2", b"m3", b"m4"] if inclusive else [b"m3", b"m4"]
    assert [reader.read_next(RECEIVE_MS).data() for _ in expected] == expected
    assert not reader.has_message_available()


def test_has_message_available_on_an_empty_topic_and_after_a_publish(client, unique):
    topic = f"available-{unique}"
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert not reader.has_message_available()
    client.create_producer(topic, batching_enabled=False).send(b"one")
    assert reader.has_message_available()
    assert reader.read_next(RECEIVE_MS).data() == b"one"
    assert not reader.has_message_available()


def test_a_delayed_message_from_a_batching_producer_waits_while_the_rest_flow(client, unique):
    topic = f"delay-batched-{unique}"
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=True,
                                      batching_max_publish_delay_ms=10)
    sent = time.time()
    producer.send_async(b"later", None, deliver_after=timedelta(seconds=2))
    for i in range(5):
        producer.send_async(f"now{i}".encode(), None)
    producer.flush()
    first = [consumer.receive(timeout_millis=RECEIVE_MS).data() for _ in range(5)]
    assert sorted(first) == [f"now{i}".encode() for i in range(5)]
    later = consumer.receive(timeout_millis=RECEIVE_MS)
    assert later.data() == b"later" and time.time() - sent >= 1.9


def test_a_delayed_message_at_the_head_of_a_backlog_holds_back_nothing_behind_it(client, unique):
    # The subscription exists with no consumer; the backlog starts with a delayed message.
    topic = f"delay-head-{unique}"
    client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared).close()
    producer = client.create_producer(topic, batching_enabled=False)
    due = time.time() + 5
    producer.send(b"later", deliver_at=int(due * 1000))
    for i in range(3):
        producer.send(f"now{i}".encode())
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    first = [consumer.receive(timeout_millis=RECEIVE_MS) for _ in range(3)]
    assert [m.data() for m in first] == [b"now0", b"now1", b"now2"]
    assert time.time() < due  # they did not wait for it
    later = consumer.receive(timeout_millis=RECEIVE_MS)
    assert later.data() == b"later" and time.time() >= due - 0.1


def test_key_shared_groups_by_ordering_key_before_partition_key(client, unique):
    topic = f"ordering-key-{unique}"
    consumers = [client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared,
                                  consumer_name=f"c{i}") for i in range(2)]
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(60):
        # Every message has its own partition key; the ordering key decides the owner.
        producer.send_async(f"o{i % 6}:{i}".encode(), None, partition_key=f"p{i}",
                            ordering_key=f"o{i % 6}")
    producer.flush()
    owner: dict[str, int] = {}
    total = 0
    for ci, c in enumerate(consumers):
        for text in _texts(c):
            k = text.split(":")[0]
            assert owner.setdefault(k, ci) == ci, f"{k} reached two consumers"
            total += 1
    assert total == 60


def test_unloading_a_topic_loses_nothing_for_its_clients(client, admin, unique):
    topic = f"unload-{unique}"
    consumer = client.subscribe(topic, "s")
    producer = _send_each(client, topic, 5)
    admin.put(f"/admin/v2/persistent/public/default/{topic}/unload")
    for i in range(5, 10):
        producer.send(f"m{i}".encode())
    assert _texts(consumer) == [f"m{i}" for i in range(10)]


def _compact(admin, topic: str) -> None:
    path = f"/admin/v2/persistent/public/default/{topic}/compaction"
    admin.put(path)
    deadline = time.monotonic() + 20
    while admin.get(path)["status"] != "SUCCESS":
        assert time.monotonic() < deadline, admin.get(path)
        time.sleep(0.05)


def _publish_keyed(client, topic: str, pairs: list[tuple[str, str]]) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    for key, value in pairs:
        producer.send(value.encode(), partition_key=key)
    producer.close()


def _publish_keyed_batches(client, topic: str, batches: list[list[tuple[str, str]]], *,
                           batching: bool = True) -> None:
    """Publish each list of (key, value) as one batch (one entry each without batching)."""
    producer = client.create_producer(topic, batching_enabled=batching, batching_max_messages=1000,
                                      batching_max_publish_delay_ms=60_000)
    for pairs in batches:
        for key, value in pairs:
            producer.send_async(value.encode(), None, partition_key=key)
        producer.flush()
    producer.close()


def test_a_compacted_read_sees_each_keys_latest_then_what_came_after(client, admin, unique):
    topic = f"compacted-{unique}"
    _publish_keyed(client, topic, [("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c1"), ("b", "b2")])
    _compact(admin, topic)
    _publish_keyed(client, topic, [("a", "a3"), ("a", "a4")])
    compacted = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    got = [compacted.read_next(RECEIVE_MS).data() for _ in range(5)]
    # The view up to the compaction, in publish order, then everything after it.
    assert got == [b"a2", b"c1", b"b2", b"a3", b"a4"]
    assert not compacted.has_message_available()
    full = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [full.read_next(RECEIVE_MS).data() for _ in range(7)][:2] == [b"a1", b"b1"]
    consumer = client.subscribe(topic, "compacted-sub", is_read_compacted=True,
                                initial_position=pulsar.InitialPosition.Earliest)
    assert _texts(consumer) == ["a2", "c1", "b2", "a3", "a4"]


def test_a_second_producer_of_the_same_name_is_refused(client, unique):
    topic = f"same-name-{unique}"
    first = client.create_producer(topic, producer_name="only-one", batching_enabled=False)
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic, producer_name="only-one")
    first.send(b"still mine")
    first.close()
    client.create_producer(topic, producer_name="only-one").send(b"now yours")


def test_deleting_a_topic_with_clients_needs_force(client, admin, unique):
    from gateway._admin_cli import AdminError

    topic = f"delete-me-{unique}"
    path = f"/admin/v2/persistent/public/default/{topic}"
    consumer = client.subscribe(topic, "s")
    client.create_producer(topic, batching_enabled=False).send(b"x")
    with pytest.raises(AdminError) as refused:
        admin.delete(path)
    assert refused.value.status == 412
    admin.delete(path, force="true")
    assert f"persistent://public/default/{topic}" not in admin.get("/admin/v2/persistent/public/default")
    consumer.close()


def test_a_reader_from_latest_inclusive_reads_the_last_message(client, unique):
    topic = f"latest-inclusive-{unique}"
    producer = _send_each(client, topic, 3)
    reader = client.create_reader(topic, pulsar.MessageId.latest, start_message_id_inclusive=True)
    # The C++ client moves such a reader to the last message (a GET_LAST_MESSAGE_ID and a
    # SEEK) when it is first asked whether a message is available.
    assert reader.has_message_available()
    assert reader.read_next(RECEIVE_MS).data() == b"m2"
    producer.send(b"m3")
    assert reader.read_next(RECEIVE_MS).data() == b"m3"


def test_every_subscription_of_a_topic_gets_every_message(client, unique):
    topic = f"fan-out-{unique}"
    subs = [client.subscribe(topic, f"s{i}") for i in range(3)]
    _send_each(client, topic, 5)
    for consumer in subs:
        assert _texts(consumer) == [f"m{i}" for i in range(5)]


def test_a_compacted_read_skips_the_older_messages_of_a_batch(client, admin, unique):
    topic = f"compacted-batch-{unique}"
    _publish_keyed_batches(client, topic, [[("a", "a1"), ("b", "b1"), ("a", "a2")],
                                           [("c", "c1"), ("b", "b2")]])
    _compact(admin, topic)
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    got = [reader.read_next(RECEIVE_MS).data() for _ in range(3)]
    assert got == [b"a2", b"c1", b"b2"]
    assert not reader.has_message_available()


def _read_until_idle(reader, idle_ms: int = 2000) -> list:
    got = []
    while True:
        try:
            got.append(reader.read_next(idle_ms))
        except pulsar.Timeout:
            return got


@pytest.mark.parametrize("batching", [False, True])
def test_a_key_whose_latest_message_is_empty_leaves_the_compacted_view(client, admin, unique,
                                                                      batching):
    # Pulsar's compactor takes an empty payload for a tombstone, as it does a null value.
    topic = f"compacted-empty-{unique}"
    _publish_keyed_batches(client, topic, [[("a", "a1"), ("b", "b1"), ("a", ""), ("c", "c1"),
                                            ("b", "b2")]], batching=batching)
    _compact(admin, topic)
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    got = [(m.partition_key(), m.data()) for m in _read_until_idle(reader)]
    assert got == [("c", b"c1"), ("b", b"b2")]


@pytest.mark.parametrize("batching", [False, True])
def test_a_compacted_read_ends_before_a_tombstoned_tail(client, admin, unique, batching):
    # Compaction covers the whole topic and its last messages are tombstones: the last
    # message id a compacted reader is told is the last one it can read (Pulsar #13533,
    # #18877), else has_message_available stays true with nothing to read.
    topic = f"compacted-tail-{unique}"
    _publish_keyed_batches(client, topic, [[("a", "a1"), ("b", "b1"), ("b", "")]], batching=batching)
    _compact(admin, topic)
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert reader.has_message_available()
    assert reader.read_next(RECEIVE_MS).data() == b"a1"
    assert not reader.has_message_available()
    table = client.create_table_view(topic)  # reads until has_message_available is false
    assert table.get("a") == b"a1" and table.get("b") is None
    table.close()


def test_a_compacted_consumer_seeking_back_reads_the_view_again(client, admin, unique):
    topic = f"compacted-seek-{unique}"
    keys = [f"k{i:03}" for i in range(200)]
    _publish_keyed(client, topic, [("x", "old"), *((k, k) for k in keys), ("x", "new")])
    _compact(admin, topic)
    view = [*(k.encode() for k in keys), b"new"]
    consumer = client.subscribe(topic, "s", is_read_compacted=True,
                                initial_position=pulsar.InitialPosition.Earliest)
    # Each seek lands while the dispatcher is still reading the view, in several reads:
    # the seek must win over the read it overtook, whichever of the two finishes first.
    for _ in range(15):
        assert consumer.receive(RECEIVE_MS).data() == view[0]
        consumer.seek(pulsar.MessageId.earliest)
        assert [consumer.receive(RECEIVE_MS).data() for _ in view] == view
        consumer.seek(pulsar.MessageId.earliest)


def test_an_encrypted_message_stays_in_the_compacted_view_by_its_key(client, admin, unique):
    topic = f"compacted-encrypted-{unique}"
    producer = client.create_producer(topic, batching_enabled=False, encryption_key="app-key",
                                      crypto_key_reader=key_reader())
    for key, value in [("a", "a1"), ("b", "b1"), ("a", "a2")]:
        producer.send(value.encode(), partition_key=key)
    _compact(admin, topic)
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True,
                                  crypto_key_reader=key_reader())
    assert [m.data() for m in _read_until_idle(reader)] == [b"b1", b"a2"]


def test_stats_show_what_clients_say_of_themselves(client, admin, unique):
    topic = f"who-{unique}"
    client.subscribe(topic, "s", properties={"app": "billing"})
    client.create_producer(topic, properties={"team": "payments"})
    stats = admin.get(f"/admin/v2/persistent/public/default/{topic}/stats")
    consumer = stats["subscriptions"]["s"]["consumers"][0]
    producer = stats["publishers"][0]
    assert consumer["metadata"] == {"app": "billing"}
    assert producer["metadata"] == {"team": "payments"}
    for who in (consumer, producer):
        assert who["address"].startswith("/127.0.0.1:")
        assert who["clientVersion"].startswith("Pulsar-")


def test_stats_count_messages_per_entry_and_redeliveries(client, admin, unique):
    topic = f"rates-{unique}"
    path = f"/admin/v2/persistent/public/default/{topic}/stats"
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared,
                                negative_ack_redelivery_delay_ms=100)
    _send_one_batch(client, topic, [f"m{i}" for i in range(10)])
    got = [consumer.receive(timeout_millis=RECEIVE_MS) for _ in range(10)]

    def consumer_stats() -> dict:
        return admin.get(path)["subscriptions"]["s"]["consumers"][0]

    assert consumer_stats()["avgMessagesPerEntry"] == 10
    assert consumer_stats()["msgRateRedeliver"] == 0
    for m in got:
        consumer.negative_acknowledge(m)
    again = [consumer.receive(timeout_millis=RECEIVE_MS) for _ in range(10)]
    assert {m.redelivery_count() for m in again} == {1}
    assert consumer_stats()["msgRateRedeliver"] > 0
    assert admin.get(path)["subscriptions"]["s"]["msgRateRedeliver"] > 0


def test_stats_say_when_a_subscription_was_last_used(client, admin, unique):
    topic = f"activity-{unique}"
    path = f"/admin/v2/persistent/public/default/{topic}/stats"
    started = int(time.time() * 1000)
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)

    def stats() -> tuple[dict, dict]:
        sub = admin.get(path)["subscriptions"]["s"]
        return sub, sub["consumers"][0]

    sub, one = stats()
    assert sub["lastConsumedFlowTimestamp"] >= started and one["lastConsumedFlowTimestamp"] >= started
    assert sub["lastConsumedTimestamp"] == sub["lastAckedTimestamp"] == 0
    assert sub["messageAckRate"] == 0
    _send_one_batch(client, topic, [f"m{i}" for i in range(10)])
    for m in [consumer.receive(timeout_millis=RECEIVE_MS) for _ in range(10)]:
        consumer.acknowledge(m)
    wait_until(lambda: stats()[0]["lastMarkDeleteAdvancedTimestamp"] > 0)
    sub, one = stats()
    for got in (sub, one):
        assert got["lastConsumedTimestamp"] >= started
        assert got["lastAckedTimestamp"] >= got["lastConsumedTimestamp"]
        assert got["messageAckRate"] > 0
    assert sub["lastMarkDeleteAdvancedTimestamp"] >= sub["lastConsumedTimestamp"]


@pytest.mark.parametrize("out_of_order", [False, True], ids=["in-order", "out-of-order"])
def test_key_shared_keys_move_to_a_new_consumer_only_as_the_policy_allows(client, admin, unique,
                                                                          out_of_order):
    """Without allowOutOfOrderDelivery, a key that moves to a consumer that joined waits
    until its old owner has acknowledged what it holds of it; with it, its new messages
    go to the new owner at once."""
    topic = f"ks-order-{unique}"
    policy = pulsar.ConsumerKeySharedPolicy(allow_out_of_order_delivery=out_of_order)

    def join(name: str):
        return client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared,
                                key_shared_policy=policy, consumer_name=name)

    first = join("first")
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"key-{i}" for i in range(20)]
    for k in keys:
        producer.send(k.encode(), partition_key=k)
    held = [first.receive(timeout_millis=RECEIVE_MS) for _ in keys]  # none acknowledged
    second = join("second")
    for k in keys:
        producer.send(k.encode(), partition_key=k)
    moved = receive_until_idle(second)
    if out_of_order:
        assert moved  # about half the keys now hash to the second consumer
    else:
        assert moved == []
        for m in held:
            first.acknowledge(m)
        assert receive_until_idle(second)
    stats = admin.get(f"/admin/v2/persistent/public/default/{topic}/stats")
    assert stats["subscriptions"]["s"]["allowOutOfOrderDelivery"] is out_of_order


@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
def test_end_to_end_encrypted_messages_reach_only_key_holders(client, unique, batching):
    """The broker stores and delivers the producer's ciphertext and its encryption
    metadata (keys, algorithm, parameter) untouched: the key holder decrypts; a consumer
    without the key, told to consume anyway, gets the ciphertext and the context."""
    topic = f"encrypted-{unique}"
    keys = key_reader()
    holder = client.subscribe(topic, "holder", crypto_key_reader=keys)
    stranger = client.subscribe(
        topic, "stranger", crypto_failure_action=pulsar.ConsumerCryptoFailureAction.CONSUME)
    producer = client.create_producer(topic, encryption_key="app-key", crypto_key_reader=keys,
                                      batching_enabled=batching)
    texts = [f"secret-{i}" for i in range(5)]
    for t in texts:
        producer.send_async(t.encode(), None)
    producer.flush()
    assert _texts(holder) == texts
    raw = stranger.receive(timeout_millis=RECEIVE_MS)
    context = raw.encryption_context()
    assert context is not None and context.is_decryption_failed()
    assert [k.key for k in context.keys()] == ["app-key"]
    assert context.batch_size() == (len(texts) if batching else -1)  # -1: not a batch
    assert b"secret-" not in raw.data()
