"""A transaction open when the broker restarts: what it staged before the restart is gone,
so its producer must not be told it committed. It is fenced, as when a transaction times
out; a producer between transactions at the restart carries on, also after an aborted
transaction. An idempotent producer's state, as DescribeProducers reports it, is read back
from the log after a restart."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from handlers.kafka._codec import Data
from tests._standalone import Standalone
from tests.handlers.kafka._wire import Wire, free_port
from tests.handlers.kafka.conftest import KAFKA_CONF
from tests.handlers.kafka.test_clients import DEADLINE


def _broker_with_topic(tmp_path: Path, topic: str) -> tuple[str, dict[str, object], Standalone]:
    """A standalone on a Kafka listener of its own with ``topic`` (one partition) created:
    its bootstrap address, its conf (to start it again on the same data) and itself."""
    boot = f"127.0.0.1:{free_port()}"
    conf = dict(KAFKA_CONF, kafkaListeners=f"PLAINTEXT://{boot}")
    server = Standalone(tmp_path, conf=conf).start()
    try:
        admin = AdminClient({"bootstrap.servers": boot})
        admin.create_topics([NewTopic(topic, 1)])[topic].result(DEADLINE)
    except BaseException:
        server.kill()
        raise
    return boot, conf, server


def _commit(producer: Producer, topic: str, value: bytes) -> None:
    """One transaction of ``producer`` holding ``value``, committed."""
    producer.begin_transaction()
    producer.produce(topic, value=value)
    producer.commit_transaction(DEADLINE)


def _committed_values(boot: str, topic: str) -> list[bytes]:
    c = Consumer({"bootstrap.servers": boot, "group.id": f"read-{topic}",
                  "isolation.level": "read_committed", "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    end = time.monotonic() + DEADLINE
    try:
        while time.monotonic() < end:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return got
                raise AssertionError(str(m.error()))
            got.append(m.value())
        raise AssertionError("no end of partition in time")
    finally:
        c.close()


def test_a_transaction_open_across_a_restart_is_fenced_not_committed(
        tmp_path: Path, unique: str) -> None:
    topic = f"txn-restart-{unique}"
    boot, conf, server = _broker_with_topic(tmp_path, topic)
    try:
        idle = Producer({"bootstrap.servers": boot, "transactional.id": f"idle-{unique}"})
        idle.init_transactions(DEADLINE)
        _commit(idle, topic, b"before")
        # An aborted transaction is not in the log: its sequence numbers are missing from
        # what the restarted broker reads back, and the producer goes on after them.
        idle.begin_transaction()
        idle.produce(topic, value=b"aborted")
        assert idle.flush(DEADLINE) == 0
        idle.abort_transaction(DEADLINE)
        open_ = Producer({"bootstrap.servers": boot, "transactional.id": f"open-{unique}"})
        open_.init_transactions(DEADLINE)
        open_.begin_transaction()
        open_.produce(topic, value=b"lost")
        assert open_.flush(DEADLINE) == 0
        server.stop()
        server = Standalone(tmp_path, conf=conf).start()

        with pytest.raises(KafkaException):
            open_.commit_transaction(DEADLINE)
        # The producer that had no transaction open is not fenced.
        _commit(idle, topic, b"after")
        assert _committed_values(boot, topic) == [b"before", b"after"]
        # A new producer for the fenced id starts afresh.
        again = Producer({"bootstrap.servers": boot, "transactional.id": f"open-{unique}"})
        again.init_transactions(DEADLINE)
        _commit(again, topic, b"again")
        assert _committed_values(boot, topic) == [b"before", b"after", b"again"]
    finally:
        server.kill()


def test_an_idempotent_producers_state_is_read_back_after_a_restart(
        tmp_path: Path, unique: str) -> None:
    topic = f"producers-restart-{unique}"
    boot, conf, server = _broker_with_topic(tmp_path, topic)
    try:
        p = Producer({"bootstrap.servers": boot, "enable.idempotence": True})
        stamp = int(time.time() * 1000) - 3_600_000
        for i in range(4):
            p.produce(topic, value=b"%d" % i, timestamp=stamp + i)
        assert p.flush(DEADLINE) == 0
        ask = Data(topics=[Data(name=topic, partition_indexes=[0])])

        def active() -> list[tuple[int, int, int, int, int]]:
            with Wire(boot) as w:
                [t] = w.call(61, 0, ask).topics
            [part] = t.partitions
            assert part.error_code == 0
            return [(st.producer_epoch, st.last_sequence, st.last_timestamp, st.coordinator_epoch,
                     st.current_txn_start_offset) for st in part.active_producers]

        before = active()
        assert before == [(0, 3, stamp + 3, -1, -1)]
        server.stop()
        server = Standalone(tmp_path, conf=conf).start()
        assert active() == before
    finally:
        server.kill()
