"""aio-pika (asyncio) against a real standalone broker: pipelined publisher confirms,
consuming with a queue iterator and acks, and /metrics counting it."""

from __future__ import annotations

import asyncio
import urllib.request

import aio_pika

from tests._standalone import Standalone
from tests.handlers.amqp.conftest import amqp_port

N = 200


def _url(s: Standalone) -> str:
    return f"amqp://guest:guest@127.0.0.1:{amqp_port(s)}/"


def test_pipelined_confirms_then_consume_with_acks(amqp_broker: Standalone, unique: str) -> None:
    async def run() -> list[bytes]:
        conn = await aio_pika.connect(_url(amqp_broker), timeout=10)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            ex = await ch.declare_exchange(f"aio-{unique}", aio_pika.ExchangeType.TOPIC, durable=True)
            q = await ch.declare_queue(f"aio-q-{unique}", durable=True)
            await q.bind(ex, routing_key="jobs.*")
            # all N in flight at once; each await is its confirm
            await asyncio.wait_for(asyncio.gather(*[
                ex.publish(aio_pika.Message(b"%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                           routing_key="jobs.new")
                for i in range(N)]), 20)
            await ch.set_qos(prefetch_count=50)
            got: list[bytes] = []
            async with q.iterator() as it:
                async for message in it:
                    async with message.process():
                        got.append(message.body)
                    if len(got) == N:
                        break
            return got

    got = asyncio.run(run())
    assert got == [b"%d" % i for i in range(N)]
    web = amqp_broker.addresses["web"][0]
    metrics = urllib.request.urlopen(f"{web}/metrics", timeout=10).read().decode()
    published = [line for line in metrics.splitlines() if line.startswith("magnetar_amqp_publishes_total")]
    assert published and float(published[0].rsplit(" ", 1)[1]) >= N
    ready = [line for line in metrics.splitlines()
             if line.startswith("magnetar_amqp_queue_messages_ready") and f'queue="aio-q-{unique}"' in line]
    assert len(ready) == 1 and float(ready[0].rsplit(" ", 1)[1]) == 0
