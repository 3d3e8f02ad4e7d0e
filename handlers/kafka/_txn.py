"""Theory of operation: producer ids and transactions.

InitProducerId hands out producer ids from a counter kept in the metadata store (taken in
blocks, so ids stay unique across restarts). A transactional id keeps its producer id;
each InitProducerId for it bumps the epoch, which fences the previous producer and
aborts whatever it left open.

A transaction's batches are *staged* here, not written: the produce request is answered
at once, and on EndTxn(commit) the staged batches are appended to their partitions in
the order they were produced and the staged offset commits applied; on abort (or when the
transaction times out) they are dropped. So the log holds committed data only: a
read_committed consumer never sees an aborted record and sees committed ones in order,
and a Pulsar consumer of the same topic sees the same. What one transaction may stage is
bounded (:data:`MAX_TXN_BYTES`).

Staged batches live in memory only. Whether a transactional id has a transaction open is
kept with its producer id and epoch, so a transaction open when the broker stopped is
aborted when its id is next used, with its epoch bumped: its producer is fenced, as when a
transaction times out, instead of committing what it produced after the restart alone (or
nothing, while being told it committed).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import trio

from handlers._ticker import Ticker
from handlers.kafka._access import CONSUME, PRODUCE, allowed
from handlers.kafka._codec import Data, RequestReceived
from handlers.kafka._errors import ErrorCode
from handlers.kafka._produce import (
    SEQUENCE_MOD,
    Pending,
    check_sequence,
    note_sequence,
    publish_batch,
)
from handlers.kafka._records import RecordBatch
from handlers.kafka._topics import PartitionLog

if TYPE_CHECKING:
    from handlers.kafka._handler import KafkaProtocolHandler

__all__ = ["TxnCoordinator", "MAX_TXN_BYTES"]

log = logging.getLogger(__name__)

MAX_TXN_BYTES = 256 * 1024 * 1024
PRODUCER_ID_BLOCK = 1000
PRODUCER_ID_PATH = "/kafka/producer-id-block"
TXN_PATH = "/kafka/transactions"
MAX_TXN_TIMEOUT_MS = 900_000
TICK_S = 0.5

COORDINATOR_EPOCH = 0
"""The epoch of this node's transaction coordinator, which never moves: a Kafka
coordinator's is its transaction log partition's leader epoch, 0 until leadership
changes."""

EMPTY = "Empty"
ONGOING = "Ongoing"


@dataclass(eq=False)
class Txn:
    transactional_id: str
    producer_id: int
    epoch: int
    timeout: float
    state: str = EMPTY
    partitions: set[tuple[str, int]] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    staged: list[tuple[PartitionLog, RecordBatch]] = field(default_factory=list)
    offsets: list[tuple[str, list[Any]]] = field(default_factory=list)
    staged_bytes: int = 0
    deadline: float = 0.0
    last_epoch: int = -1  # the epoch a producer's own bump (KIP-360) came from, else -1
    ended: str = ""  # how the last transaction of this epoch ended: "commit", "abort", or none
    started_ms: int = -1  # when the last transaction of this epoch began (wall clock), or -1

    def reset(self) -> None:
        self.state = EMPTY
        self.partitions.clear()
        self.groups.clear()
        self.staged.clear()
        self.offsets.clear()
        self.staged_bytes = 0
        self.deadline = 0.0


class TxnCoordinator:
    def __init__(self, handler: KafkaProtocolHandler):
        self.h = handler
        self.txns: dict[str, Txn] = {}
        self._next_id = 0
        self._block_end = 0
        self._ticker = Ticker(TICK_S)

    async def run(self) -> None:
        """Abort transactions that outlive their timeout, until cancelled; parked while
        none is open."""
        while True:
            await self._ticker.next_tick(any(t.state == ONGOING for t in self.txns.values()))
            now = trio.current_time()
            for txn in list(self.txns.values()):
                if txn.state == ONGOING and txn.deadline and now >= txn.deadline:
                    log.info("kafka: transaction %s timed out: aborted", txn.transactional_id)
                    txn.epoch += 1
                    txn.reset()
                    txn.ended = "abort"
                    self._save(txn)

    # -- producer ids ----------------------------------------------------------------------------

    def next_producer_id(self) -> int:
        if self._next_id >= self._block_end:
            md = self.h.broker.metadata
            got = md.get(PRODUCER_ID_PATH)
            start = int(json.loads(got[0])) if got else 0
            md.put(PRODUCER_ID_PATH, json.dumps(start + PRODUCER_ID_BLOCK).encode())
            self._next_id, self._block_end = start, start + PRODUCER_ID_BLOCK
        pid = self._next_id
        self._next_id += 1
        return pid

    def _path(self, tid: str) -> str:
        return f"{TXN_PATH}/{quote(tid, safe='')}"

    def _save(self, txn: Txn) -> None:
        self.h.broker.metadata.put(self._path(txn.transactional_id), json.dumps(
            {"producer_id": txn.producer_id, "epoch": txn.epoch,
             "ongoing": txn.state == ONGOING, "ended": txn.ended}).encode())

    def _load(self, tid: str, timeout: float) -> Txn | None:
        txn = self.txns.get(tid)
        if txn is not None:
            return txn
        got = self.h.broker.metadata.get(self._path(tid))
        if got is None:
            return None
        doc = json.loads(got[0])
        txn = self.txns[tid] = Txn(tid, int(doc["producer_id"]), int(doc["epoch"]), timeout,
                                   ended=str(doc.get("ended", "")))
        if doc.get("ongoing"):
            # Open when this broker stopped: what it staged is gone, so it is aborted as a
            # timed-out one is, fencing its producer rather than letting it commit a part.
            log.info("kafka: transaction %s was open at the last shutdown: aborted", tid)
            txn.epoch += 1
            txn.ended = "abort"
            self._save(txn)
        return txn

    def init_producer_id(self, req: RequestReceived) -> Data:
        b = req.body
        tid = b.transactional_id
        if tid is None:
            return Data(throttle_time_ms=0, error_code=0, producer_id=self.next_producer_id(),
                        producer_epoch=0)
        if not 0 < b.transaction_timeout_ms <= MAX_TXN_TIMEOUT_MS:
            return Data(throttle_time_ms=0, error_code=ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                        producer_id=-1, producer_epoch=-1)
        timeout = b.transaction_timeout_ms / 1000.0
        txn = self._load(tid, timeout)
        expected = b.producer_id >= 0 if req.api_version >= 3 else False
        if txn is None:
            txn = self.txns[tid] = Txn(tid, self.next_producer_id(), 0, timeout)
        elif expected and b.producer_id == txn.producer_id and b.producer_epoch == txn.last_epoch \
                and txn.state == EMPTY:
            # A retry of a bump whose answer was lost: the same epoch again.
            return Data(throttle_time_ms=0, error_code=0, producer_id=txn.producer_id,
                        producer_epoch=txn.epoch)
        elif expected and (b.producer_id, b.producer_epoch) != (txn.producer_id, txn.epoch):
            # KIP-360: a producer recovering with an older producer id or epoch is a zombie;
            # it must not fence the current one.
            code = ErrorCode.PRODUCER_FENCED if req.api_version >= 4 else ErrorCode.INVALID_PRODUCER_EPOCH
            return Data(throttle_time_ms=0, error_code=code, producer_id=-1, producer_epoch=-1)
        else:
            if txn.state == ONGOING:
                log.info("kafka: transaction %s aborted by a new producer epoch", tid)
            txn.reset()
            txn.ended = ""
            txn.started_ms = -1
            txn.timeout = timeout
            # Kept for a retry of a producer's own bump only; a new instance (no epoch
            # given) fences every earlier one.
            txn.last_epoch = txn.epoch if expected else -1
            txn.epoch += 1
            if txn.epoch >= 0x7FFF:
                txn.producer_id = self.next_producer_id()
                txn.epoch = 0
        self._save(txn)
        return Data(throttle_time_ms=0, error_code=0, producer_id=txn.producer_id,
                    producer_epoch=txn.epoch)

    def _check(self, tid: str, producer_id: int, epoch: int,
               fenced: int = ErrorCode.INVALID_PRODUCER_EPOCH) -> tuple[int, Txn | None]:
        """The transaction of ``tid`` if the producer id and epoch are its own; else the
        error, ``fenced`` for another epoch."""
        txn = self._load(tid, 60.0)
        if txn is None or txn.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, None
        if epoch != txn.epoch:
            return fenced, None
        return 0, txn

    def _check_request(self, req: RequestReceived) -> tuple[int, Txn | None]:
        """:meth:`_check` for AddPartitionsToTxn, AddOffsetsToTxn and EndTxn: from v2 on
        (KIP-588) another epoch is PRODUCER_FENCED, as Kafka answers; before, the
        INVALID_PRODUCER_EPOCH older clients know."""
        b = req.body
        fenced = ErrorCode.PRODUCER_FENCED if req.api_version >= 2 else ErrorCode.INVALID_PRODUCER_EPOCH
        return self._check(b.transactional_id, b.producer_id, b.producer_epoch, fenced)

    def _begin(self, txn: Txn) -> None:
        if txn.state == EMPTY:
            txn.state = ONGOING
            txn.started_ms = int(time.time() * 1000)
            txn.deadline = trio.current_time() + txn.timeout
            self._save(txn)
            self._ticker.arm()

    # -- requests ------------------------------------------------------------------------------

    async def add_partitions(self, req: RequestReceived) -> Data:
        b = req.body
        error, txn = self._check_request(req)
        # Kafka: WRITE on every topic, else nothing is added: the refused topics answer
        # TOPIC_AUTHORIZATION_FAILED and the others OPERATION_NOT_ATTEMPTED
        refused = {t.name for t in b.topics if not allowed(self.h, req, t.name, PRODUCE)}
        results = []
        for t in b.topics:
            parts = []
            for p in t.partitions:
                code = error
                if not code and refused:
                    code = (ErrorCode.TOPIC_AUTHORIZATION_FAILED if t.name in refused
                            else ErrorCode.OPERATION_NOT_ATTEMPTED)
                if not code:
                    try:
                        await self.h.topics.log(t.name, p, create=self.h.auto_create_on_produce)
                        assert txn is not None
                        self._begin(txn)
                        txn.partitions.add((t.name, p))
                    except Exception:
                        code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                parts.append(Data(partition_index=p, error_code=code))
            results.append(Data(name=t.name, results=parts))
        return Data(throttle_time_ms=0, results=results)

    def add_offsets(self, req: RequestReceived) -> Data:
        b = req.body
        error, txn = self._check_request(req)
        if txn is not None:
            self._begin(txn)
            txn.groups.add(b.group_id)
        return Data(throttle_time_ms=0, error_code=error)

    def txn_offset_commit(self, req: RequestReceived) -> Data:
        b = req.body
        error, txn = self._check(b.transactional_id, b.producer_id, b.producer_epoch)
        if txn is not None and b.group_id not in txn.groups:
            error = ErrorCode.INVALID_TXN_STATE
        if not error and req.api_version >= 3:
            error = self.h.groups.check_txn_commit(b.group_id, b.generation_id, b.member_id,
                                                   b.group_instance_id)
        unknown = self.h.groups.partition_errors(b.topics) if not error else {}
        # Kafka: READ on each topic; a refused one's offsets are not committed
        unknown.update(((t.name, p.partition_index), ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                       for t in b.topics if not allowed(self.h, req, t.name, CONSUME) for p in t.partitions)
        if not error and txn is not None:
            txn.offsets.append((b.group_id, [
                Data(name=t.name, partitions=[p for p in t.partitions
                                              if (t.name, p.partition_index) not in unknown])
                for t in b.topics]))
        return Data(throttle_time_ms=0, topics=[
            Data(name=t.name, partitions=[Data(
                partition_index=p.partition_index,
                error_code=error or unknown.get((t.name, p.partition_index), 0))
                for p in t.partitions]) for t in b.topics])

    # -- admin ------------------------------------------------------------------------------------

    def _all(self) -> list[Txn]:
        """Every transactional id's state, those stored but not yet used loaded."""
        ids = {unquote(n) for n in self.h.broker.metadata.children(TXN_PATH)} | set(self.txns)
        return [txn for tid in sorted(ids) if (txn := self._load(tid, 60.0)) is not None]

    def list_transactions(self, req: RequestReceived) -> Data:
        """ListTransactions (KIP-664): the transactional ids in the states and with the
        producer ids asked for (all when none); state names Kafka does not have are
        answered back as unknown."""
        states = set(req.body.state_filters or [])
        pids = set(req.body.producer_id_filters or [])
        return Data(throttle_time_ms=0, error_code=0,
                    unknown_state_filters=sorted(states - KAFKA_TXN_STATES),
                    transaction_states=[
                        Data(transactional_id=txn.transactional_id, producer_id=txn.producer_id,
                             transaction_state=_state(txn))
                        for txn in self._all()
                        if (not states or _state(txn) in states)
                        and (not pids or txn.producer_id in pids)])

    def describe_transactions(self, req: RequestReceived) -> Data:
        """DescribeTransactions (KIP-664): each transactional id's state, producer id and
        epoch, timeout, and the partitions of its open transaction;
        TRANSACTIONAL_ID_NOT_FOUND for one never used."""
        out = []
        for tid in req.body.transactional_ids:
            txn = self._load(tid, 60.0)
            if txn is None:
                out.append(Data(error_code=ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
                                transactional_id=tid, transaction_state="",
                                transaction_timeout_ms=0, transaction_start_time_ms=-1,
                                producer_id=-1, producer_epoch=-1, topics=[]))
                continue
            topics: dict[str, list[int]] = {}
            for topic, partition in sorted(txn.partitions):
                topics.setdefault(topic, []).append(partition)
            out.append(Data(error_code=0, transactional_id=tid, transaction_state=_state(txn),
                            transaction_timeout_ms=int(txn.timeout * 1000),
                            transaction_start_time_ms=txn.started_ms,
                            producer_id=txn.producer_id, producer_epoch=txn.epoch,
                            topics=[Data(topic=t, partitions=ps) for t, ps in topics.items()]))
        return Data(throttle_time_ms=0, transaction_states=out)

    def pending_offsets(self, group_id: str) -> set[tuple[str, int]]:
        """The partitions of ``group_id`` with an offset in a transaction still open."""
        return {(t.name, p.partition_index)
                for txn in self.txns.values() if txn.state == ONGOING
                for group, topics in txn.offsets if group == group_id
                for t in topics for p in t.partitions}

    def stage(self, tid: str, plog: PartitionLog, batch: RecordBatch) -> tuple[int, Pending]:
        pending = Pending()
        error, txn = self._check(tid, batch.producer_id, batch.producer_epoch)
        if txn is None:
            return error, pending
        if (plog.kafka_topic, plog.partition) not in txn.partitions:
            return ErrorCode.INVALID_TXN_STATE, pending
        if txn.staged_bytes + batch.size > MAX_TXN_BYTES:
            return ErrorCode.RECORD_LIST_TOO_LARGE, pending
        # Sequenced as an idempotent producer's batches are: a retried batch is not
        # staged twice, and a gap is OUT_OF_ORDER_SEQUENCE_NUMBER; except a gap after
        # what was read back from the log, which may be the batches of aborted
        # transactions (not in the log).
        st = plog.producers.get(batch.producer_id)
        if st is not None and st.from_log and st.epoch == batch.producer_epoch \
                and (batch.base_sequence, batch.last_sequence) not in st.recent \
                and 0 < (batch.base_sequence - st.last_sequence) % SEQUENCE_MOD < SEQUENCE_MOD // 2:
            st.last_sequence = (batch.base_sequence - 1) % SEQUENCE_MOD
        error, original = check_sequence(plog, batch)
        if error:
            return error, pending
        if st is not None:
            st.from_log = False
        if original is not None:
            return 0, original
        txn.staged.append((plog, batch))
        txn.staged_bytes += batch.size
        pending.done(-1)
        note_sequence(plog, batch, pending)
        return 0, pending

    async def end_txn(self, req: RequestReceived) -> Data:
        b = req.body
        error, txn = self._check_request(req)
        if txn is None:
            return Data(throttle_time_ms=0, error_code=error)
        ending = "commit" if b.committed else "abort"
        if txn.state != ONGOING:
            # As Kafka: a retry of the EndTxn that ended the last transaction succeeds again;
            # ending a transaction that never began (nothing added since InitProducerId), or
            # ending the last one the other way, is INVALID_TXN_STATE.
            return Data(throttle_time_ms=0,
                        error_code=0 if txn.ended == ending else ErrorCode.INVALID_TXN_STATE)
        staged, offsets = list(txn.staged), list(txn.offsets)
        txn.reset()
        txn.ended = ending
        self._save(txn)
        # Where Kafka would write the transaction's end marker, the producer's state
        # takes the coordinator's epoch.
        for plog, _ in staged:
            st = plog.producers.get(txn.producer_id)
            if st is not None:
                st.coordinator_epoch = COORDINATOR_EPOCH
        if not b.committed:
            return Data(throttle_time_ms=0, error_code=0)
        pendings = []
        for plog, batch in staged:
            p = Pending()
            publish_batch(plog, batch, p)
            pendings.append(p)
        failed = 0
        for p in pendings:
            await p.wait()
            failed = failed or p.error
        if failed:
            return Data(throttle_time_ms=0, error_code=ErrorCode.UNKNOWN_SERVER_ERROR)
        # All of a group's offsets in the transaction are one commit (one write), later
        # TxnOffsetCommits of a partition overriding earlier ones.
        by_group: dict[str, list[Any]] = {}
        for group_id, topics in offsets:
            by_group.setdefault(group_id, []).extend(topics)
        for group_id, topics in by_group.items():
            stored = await self.h.groups.store_offsets(group_id, topics, 0)
            if any(p.error_code for t in stored.topics for p in t.partitions):
                failed = ErrorCode.UNKNOWN_SERVER_ERROR
        return Data(throttle_time_ms=0, error_code=failed)


KAFKA_TXN_STATES = frozenset({"Empty", "Ongoing", "PrepareCommit", "PrepareAbort",
                              "CompleteCommit", "CompleteAbort", "Dead", "PrepareEpochFence"})
"""Kafka's transaction state names."""


def _state(txn: Txn) -> str:
    """A transaction's state by Kafka's name: an ended one is complete, as Kafka's is once
    its markers are written (which here is before EndTxn is answered)."""
    if txn.state == ONGOING:
        return "Ongoing"
    return {"commit": "CompleteCommit", "abort": "CompleteAbort"}.get(txn.ended, "Empty")
