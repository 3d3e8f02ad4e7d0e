"""DeleteRecords: the log start moves (ListOffsets earliest, Fetch below it is
OFFSET_OUT_OF_RANGE), the ledgers wholly below it leave storage once no subscription needs
them, whatever retention says, and all of it survives a broker restart."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pulsar
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from handlers.kafka._codec import Data
from handlers.kafka._errors import ErrorCode
from handlers.kafka._records import decode_batches
from tests._standalone import Standalone
from tests.handlers.kafka._wire import Wire, bootstrap
from tests.handlers.kafka.conftest import KAFKA_CONF
from tests.handlers.kafka.test_clients import DEADLINE, wait_for
from tests.handlers.kafka.test_wire import FETCH, PRODUCE, batch, fetch_body, produce_body

ENTRIES_PER_LEDGER = 5
RECORDS = 30
CUT = 17
CONF = {**KAFKA_CONF,
        "managedLedgerMaxEntriesPerLedger": ENTRIES_PER_LEDGER,
        "managedLedgerMinLedgerRolloverTimeMinutes": 0,
        # Retention keeps everything: only DeleteRecords may remove data here.
        "defaultRetentionTimeInMinutes": -1, "defaultRetentionSizeInMB": -1,
        "retentionCheckIntervalInSeconds": 1}


def _ledgers(server: Standalone, topic: str) -> list[dict[str, Any]]:
    url = f"{server.addresses['web'][0]}/admin/v2/persistent/public/default/{topic}-partition-0/internalStats"
    with urllib.request.urlopen(url, timeout=DEADLINE) as r:
        return list(json.loads(r.read())["ledgers"])


def _watermarks(boot: str, topic: str) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": boot, "group.id": "watermarks"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=DEADLINE, cached=False)
        return int(low), int(high)
    finally:
        c.close()


def _fetch_at(boot: str, topic: str, offset: int) -> Data:
    with Wire(boot) as w:
        return w.call(FETCH, 12, fetch_body(topic, offset)).responses[0].partitions[0]


def test_delete_records_moves_the_log_start_and_trims_storage(tmp_path: Path, unique: str) -> None:
    topic = f"trim-{unique}"
    server = Standalone(tmp_path, conf=CONF).start()
    try:
        boot = bootstrap(server.addresses)
        with Wire(boot) as w:
            for i in range(RECORDS):
                w.call(PRODUCE, 9, produce_body(topic, batch([b"v%d" % i])))
        before = _ledgers(server, topic)
        assert len(before) >= RECORDS // ENTRIES_PER_LEDGER

        # A Kafka group that committed offset 2: its subscription follows the log start
        # (Kafka clients cannot read below it), so it holds nothing back.
        group = Consumer({"bootstrap.servers": boot, "group.id": f"g-{unique}"})
        group.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
        group.close()
        # A Pulsar subscription that has consumed nothing holds every ledger.
        client = pulsar.Client(server.pulsar_url)
        holder = client.subscribe(f"persistent://public/default/{topic}", "holder",
                                  initial_position=pulsar.InitialPosition.Earliest)
        try:
            admin = AdminClient({"bootstrap.servers": boot})
            done = admin.delete_records([TopicPartition(topic, 0, CUT)])
            result = next(iter(done.values())).result(DEADLINE)
            assert result.low_watermark == CUT

            assert _watermarks(boot, topic) == (CUT, RECORDS)
            assert _fetch_at(boot, topic, CUT - 1).error_code == ErrorCode.OFFSET_OUT_OF_RANGE
            assert _ledgers(server, topic)[:len(before)] == before

            # Once the subscription has consumed them, the ledgers below the cut go; the
            # one holding offset CUT stays, and retention keeps the rest.
            last = None
            for _ in range(RECORDS):
                last = holder.receive(int(DEADLINE * 1000))
            holder.acknowledge_cumulative(last)
            gone = CUT // ENTRIES_PER_LEDGER
            first_kept = before[gone]["ledgerId"]
            wait_for(lambda: _ledgers(server, topic)[0]["ledgerId"] == first_kept)
            kept = [led["ledgerId"] for led in _ledgers(server, topic)]
            assert set(kept) >= {led["ledgerId"] for led in before[gone:]}
        finally:
            holder.close()
            client.close()
    finally:
        server.kill()

    # After a crash and restart: the same log start, the same ledgers, the same records.
    again = Standalone(tmp_path, conf=CONF).start()
    try:
        boot = bootstrap(again.addresses)
        assert _watermarks(boot, topic) == (CUT, RECORDS)
        assert _fetch_at(boot, topic, 0).error_code == ErrorCode.OFFSET_OUT_OF_RANGE
        part = _fetch_at(boot, topic, CUT)
        assert part.error_code == 0 and part.log_start_offset == CUT
        values = [r.value for b in decode_batches(part.records) for r in b.records]
        assert values[0] == b"v%d" % CUT
        reopened = [led["ledgerId"] for led in _ledgers(again, topic)]
        assert reopened[0] == first_kept and set(reopened) >= set(kept) - {kept[-1]}
    finally:
        again.kill()


@pytest.mark.parametrize("offset", [RECORDS + 1, -5])
def test_delete_records_beyond_the_high_watermark_is_out_of_range(boot: str, unique: str,
                                                                  offset: int) -> None:
    topic = f"trim-oor-{unique}"
    with Wire(boot) as w:
        w.call(PRODUCE, 9, produce_body(topic, batch([b"x"])))
        resp = w.call(21, 2, Data(topics=[Data(name=topic, partitions=[
            Data(partition_index=0, offset=offset)])], timeout_ms=1000))
        assert resp.topics[0].partitions[0].error_code == ErrorCode.OFFSET_OUT_OF_RANGE


def test_produce_answers_the_log_start_offset(boot: str, unique: str) -> None:
    """A produce response (v5+) gives the partition's log start offset, as Kafka's does."""
    topic = f"trim-produced-{unique}"
    with Wire(boot) as w:
        first = w.call(PRODUCE, 9, produce_body(topic, batch([b"a", b"b", b"c"])))
        part = first.responses[0].partition_responses[0]
        assert (part.error_code, part.log_start_offset) == (0, 0)
        cut = w.call(21, 2, Data(topics=[Data(name=topic, partitions=[
            Data(partition_index=0, offset=2)])], timeout_ms=1000))
        assert cut.topics[0].partitions[0].error_code == 0
        later = w.call(PRODUCE, 9, produce_body(topic, batch([b"d"])))
        part = later.responses[0].partition_responses[0]
        assert (part.error_code, part.base_offset, part.log_start_offset) == (0, 3, 2)
