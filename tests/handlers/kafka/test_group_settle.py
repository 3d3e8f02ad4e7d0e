"""Consumer groups settle: members that start together, a member that leaves while another
joins, and a member that crashes and comes back each end with every partition owned by
exactly one member, within twice ``group.initial.rebalance.delay.ms``, for kafka-python
and confluent-kafka with each of their assignors. After each settle, records produced
are consumed exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from tests._standalone import Standalone
from tests.handlers.kafka._wire import bootstrap
from tests.handlers.kafka.test_clients import create_topic

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:kafka")

DELAY_MS = 500
"""The broker's group.initial.rebalance.delay.ms in this module."""
SETTLE_S = 2 * DELAY_MS / 1000
"""A group must settle within this of its members starting (or of one leaving/joining)."""
ROUNDS = 20
PARTITIONS = 4
RECORDS = 40
DEADLINE = 20.0
SESSION_MS = 2000

KP_ASSIGNORS: dict[str, Any] = {"range": RangePartitionAssignor,
                                "roundrobin": RoundRobinPartitionAssignor,
                                "sticky": StickyPartitionAssignor}
CASES = [("kafka-python", s) for s in KP_ASSIGNORS] + \
        [("confluent", s) for s in ("range", "roundrobin", "cooperative-sticky")]


@pytest.fixture(scope="module")
def boot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data: Path = tmp_path_factory.mktemp("settle")
    s = Standalone(data, conf={"messagingProtocols": "pulsar,kafka",
                               "group.initial.rebalance.delay.ms": DELAY_MS,
                               "group.min.session.timeout.ms": 1000}).start()
    try:
        yield bootstrap(s.addresses)
    finally:
        s.kill()


class Member:
    """One group member, driven by the test's thread: ``poll`` once, ``owned`` is what it
    is assigned now, ``got`` what it consumed as (partition, offset, value)."""

    def __init__(self, client: str, boot: str, group: str, topic: str, strategy: str):
        self.client = client
        self.got: list[tuple[int, int, bytes]] = []
        if client == "kafka-python":
            self.kp = KafkaConsumer(
                bootstrap_servers=boot, group_id=group, auto_offset_reset="earliest",
                enable_auto_commit=False, session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=100, max_poll_interval_ms=15000,
                partition_assignment_strategy=[KP_ASSIGNORS[strategy]])
            self.kp.subscribe([topic])
        else:
            self.cf = Consumer({"bootstrap.servers": boot, "group.id": group,
                                "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                "partition.assignment.strategy": strategy,
                                "session.timeout.ms": SESSION_MS,
                                "heartbeat.interval.ms": 100})
            self.cf.subscribe([topic])

    def poll(self) -> None:
        if self.client == "kafka-python":
            for records in self.kp.poll(timeout_ms=50).values():
                self.got += [(r.partition, r.offset, r.value) for r in records]
        else:
            for m in self.cf.consume(100, 0.05):
                if not m.error():
                    self.got.append((m.partition(), m.offset(), m.value()))

    def owned(self) -> list[int]:
        if self.client == "kafka-python":
            return sorted(tp.partition for tp in self.kp.assignment())
        return sorted(tp.partition for tp in self.cf.assignment())

    def close(self) -> None:
        if self.client == "kafka-python":
            self.kp.close()
        else:
            self.cf.close()


def settled(owned: list[list[int]]) -> bool:
    """Every partition owned by exactly one member, and the members balanced."""
    flat = sorted(p for o in owned for p in o)
    return flat == list(range(PARTITIONS)) and \
        max(map(len, owned)) - min(map(len, owned)) <= 1


def settle(members: list[Member], bound: float = SETTLE_S) -> float:
    """Poll the members in turn until the group is settled; how long that took. Fails if
    it takes longer than ``bound`` (with the owners seen, to show how it was stuck)."""
    t0 = time.monotonic()
    while not settled([m.owned() for m in members]):
        if time.monotonic() - t0 > max(bound, DEADLINE):
            break
        for m in members:
            m.poll()
    took = time.monotonic() - t0
    owners = [m.owned() for m in members]
    assert settled(owners), f"not settled after {took:.1f} s: {owners}"
    assert took <= bound, f"settled in {took:.2f} s, over {bound:.2f} s: {owners}"
    return took


def produce_round(producer: Producer, topic: str, tag: str) -> set[bytes]:
    """RECORDS records spread over every partition, their values carrying ``tag``."""
    values = {f"{tag}:{i}".encode() for i in range(RECORDS)}
    for i, v in enumerate(sorted(values)):
        producer.produce(topic, value=v, partition=i % PARTITIONS)
    producer.flush(10)
    return values


def consumed_once(members: list[Member], values: set[bytes]) -> None:
    """Poll until every one of ``values`` is consumed, then a little more; each exactly once,
    and only by the member that owns its partition."""
    def seen() -> list[bytes]:
        return [v for m in members for _, _, v in m.got if v in values]

    end = time.monotonic() + DEADLINE
    while set(seen()) != values and time.monotonic() < end:
        for m in members:
            m.poll()
    for _ in range(2):
        for m in members:
            m.poll()
    got = seen()
    assert sorted(got) == sorted(values), (len(got), len(set(got)), len(values))
    for m in members:
        owned = set(m.owned())
        assert all(p in owned for p, _, v in m.got if v in values)


@pytest.mark.parametrize(("client", "strategy"), CASES)
def test_members_starting_together_settle(boot: str, unique: str, client: str,
                                          strategy: str) -> None:
    topic = f"settle-start-{client}-{strategy}-{unique}"
    create_topic(boot, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": boot})
    times = []
    for r in range(ROUNDS):
        members = [Member(client, boot, f"start-{unique}-{r}", topic, strategy)
                   for _ in range(2)]
        try:
            times.append(settle(members))
            consumed_once(members, produce_round(producer, topic, f"r{r}"))
        finally:
            for m in members:
                m.close()
    print(f"{client}/{strategy}: settled in {min(times):.2f}..{max(times):.2f} s")


@pytest.mark.parametrize(("client", "strategy"), CASES)
def test_a_member_leaving_as_another_joins_settles(boot: str, unique: str, client: str,
                                                   strategy: str) -> None:
    topic = f"settle-churn-{client}-{strategy}-{unique}"
    group = f"churn-{unique}"
    create_topic(boot, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": boot})
    members = [Member(client, boot, group, topic, strategy) for _ in range(2)]
    # A cooperative assignor moves a partition in two rebalances (revoke, then assign).
    bound = SETTLE_S * (2 if strategy.startswith("cooperative") else 1)
    try:
        settle(members)
        for r in range(ROUNDS):
            # The older member leaves, a new one joins: the group goes through a
            # rebalance of one member and another of two, and must settle again.
            members.pop(0).close()
            members.append(Member(client, boot, group, topic, strategy))
            settle(members, bound)
            consumed_once(members, produce_round(producer, topic, f"r{r}"))
    finally:
        for m in members:
            m.close()


CHILD = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from kafka import KafkaConsumer
from kafka.coordinator.assignors.range import RangePartitionAssignor
boot, group, topic = sys.argv[1:4]
c = KafkaConsumer(bootstrap_servers=boot, group_id=group, auto_offset_reset="earliest",
                  enable_auto_commit=False, session_timeout_ms=int(sys.argv[4]),
                  heartbeat_interval_ms=100, partition_assignment_strategy=[RangePartitionAssignor])
c.subscribe([topic])
print(json.dumps({"ready": True}), flush=True)
owned = None
while True:
    got = [[r.partition, r.value.decode()] for rs in c.poll(timeout_ms=50).values() for r in rs]
    now = sorted(tp.partition for tp in c.assignment())
    if got or now != owned:
        owned = now
        print(json.dumps({"owned": now, "got": got}), flush=True)
"""


class Child:
    """A kafka-python member in its own process, so it can be killed -9; it reports what
    it owns and consumes as JSON lines."""

    def __init__(self, boot: str, group: str, topic: str):
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, boot, group, topic,
                                      str(SESSION_MS)], stdout=subprocess.PIPE)
        self.owned_now: list[int] = []
        self.got: list[bytes] = []
        self.changed = threading.Lock()
        self.ready = threading.Event()  # it has started and subscribed
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout as out:
            for line in out:
                report = json.loads(line)
                if report.get("ready"):
                    self.ready.set()
                    continue
                with self.changed:
                    self.owned_now = report["owned"]
                    self.got += [v.encode() for _, v in report["got"]]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.reader.join(10)


def settle_with(child: Child, member: Member, bound: float) -> float:
    """Poll ``member`` until it and ``child`` split the topic: within ``bound`` of the
    child's start (its interpreter and imports not counted)."""
    end = time.monotonic() + DEADLINE
    while not child.ready.is_set() and time.monotonic() < end:
        member.poll()
    t0 = time.monotonic()
    while not settled([child.owned_now, member.owned()]) and \
            time.monotonic() - t0 < max(bound, DEADLINE):
        member.poll()
    took = time.monotonic() - t0
    assert settled([child.owned_now, member.owned()]), (child.owned_now, member.owned())
    assert took <= bound, f"settled in {took:.2f} s, over {bound:.2f} s"
    return took


def test_a_crashed_member_expires_and_its_restart_settles_under_load(
        boot: str, unique: str) -> None:
    """A member killed -9 holds its partitions until its session expires; the survivor
    then owns everything, and when the member is started again the group splits again.
    A producer keeps writing throughout; records produced after each settle are consumed
    exactly once."""
    topic, group = f"settle-crash-{unique}", f"crash-{unique}"
    create_topic(boot, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": boot, "linger.ms": 5})
    stop = threading.Event()

    def load() -> None:
        i = 0
        while not stop.is_set():
            producer.produce(topic, value=b"load:%d" % i, partition=i % PARTITIONS)
            producer.poll(0)
            i += 1
            stop.wait(0.005)

    loader = threading.Thread(target=load)
    loader.start()
    member = Member("kafka-python", boot, group, topic, "range")
    child = Child(boot, group, topic)
    try:
        settle_with(child, member, SETTLE_S)
        for r in range(3):
            child.kill()
            # The dead member's session expires, then the survivor rejoins and owns all.
            t0 = time.monotonic()
            while member.owned() != list(range(PARTITIONS)) and \
                    time.monotonic() - t0 < DEADLINE:
                member.poll()
            assert member.owned() == list(range(PARTITIONS))
            assert time.monotonic() - t0 <= SESSION_MS / 1000 + SETTLE_S
            child = Child(boot, group, topic)
            settle_with(child, member, SETTLE_S)
            tag = f"crash{r}"
            values = {f"{tag}:{i}".encode() for i in range(RECORDS)}
            for i, v in enumerate(sorted(values)):
                producer.produce(topic, value=v, partition=i % PARTITIONS)
            producer.flush(10)
            end = time.monotonic() + DEADLINE
            while time.monotonic() < end:
                member.poll()
                with child.changed:
                    mine = [v for _, _, v in member.got if v in values]
                    theirs = [v for v in child.got if v in values]
                    if set(mine) | set(theirs) == values:
                        break
            assert sorted(mine + theirs) == sorted(values), (len(mine), len(theirs))
            assert mine and theirs, "both members consume their half"
    finally:
        stop.set()
        loader.join(10)
        producer.flush(10)
        child.kill()
        member.close()


def test_a_starting_group_is_assigned_once_after_the_initial_delay(
        boot: str, unique: str) -> None:
    """With group.initial.rebalance.delay.ms, a second member starting soon after the
    first is in the group's first generation: the first member is never given every
    partition, and neither is assigned before the delay has passed."""
    topic = f"settle-delay-{unique}"
    create_topic(boot, topic, PARTITIONS)
    first = Member("confluent", boot, f"delay-{unique}", topic, "range")
    t0 = time.monotonic()
    seen: list[list[int]] = []
    second = None
    try:
        while time.monotonic() - t0 < DEADLINE:
            first.poll()
            if second is None and time.monotonic() - t0 > DELAY_MS / 2000:
                second = Member("confluent", boot, f"delay-{unique}", topic, "range")
            if second is not None:
                second.poll()
                if first.owned() and first.owned() not in seen:
                    seen.append(first.owned())
                if settled([first.owned(), second.owned()]):
                    break
            elif first.owned():
                seen.append(first.owned())
        assert second is not None and settled([first.owned(), second.owned()])
        assert time.monotonic() - t0 >= DELAY_MS / 1000
        assert seen == [first.owned()], f"the first member was assigned {seen}"
    finally:
        first.close()
        if second is not None:
            second.close()
