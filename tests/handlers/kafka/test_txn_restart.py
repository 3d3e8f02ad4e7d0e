"""A transaction open when the broker restarts: what it staged before the restart is gone,
so its producer must not be told it committed. It is fenced, as when a transaction times
out; a producer between transactions at the restart carries on, also after an aborted
transaction."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests._standalone import Standalone
from tests.handlers.kafka._wire import free_port
from tests.handlers.kafka.conftest import KAFKA_CONF
from tests.handlers.kafka.test_clients import DEADLINE


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
    boot = f"127.0.0.1:{free_port()}"
    conf = dict(KAFKA_CONF, kafkaListeners=f"PLAINTEXT://{boot}")
    topic = f"txn-restart-{unique}"
    server = Standalone(tmp_path, conf=conf).start()
    try:
        admin = AdminClient({"bootstrap.servers": boot})
        admin.create_topics([NewTopic(topic, 1)])[topic].result(DEADLINE)
        idle = Producer({"bootstrap.servers": boot, "transactional.id": f"idle-{unique}"})
        idle.init_transactions(DEADLINE)
        idle.begin_transaction()
        idle.produce(topic, value=b"before")
        idle.commit_transaction(DEADLINE)
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
        idle.begin_transaction()
        idle.produce(topic, value=b"after")
        idle.commit_transaction(DEADLINE)
        assert _committed_values(boot, topic) == [b"before", b"after"]
        # A new producer for the fenced id starts afresh.
        again = Producer({"bootstrap.servers": boot, "transactional.id": f"open-{unique}"})
        again.init_transactions(DEADLINE)
        again.begin_transaction()
        again.produce(topic, value=b"again")
        again.commit_transaction(DEADLINE)
        assert _committed_values(boot, topic) == [b"before", b"after", b"again"]
    finally:
        server.kill()
