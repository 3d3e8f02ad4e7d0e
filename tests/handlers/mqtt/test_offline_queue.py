"""``mqttMaxQueuedMessages``: what a persistent session keeps while its client is away."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._standalone import Standalone

from ._clients import WAIT, metric, scrape, subscribe, unique, wait_until
from .conftest import MQTT_CONF

BOUND = 10


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    data: Path = tmp_path_factory.mktemp("mqtt-bound")
    s = Standalone(data, conf={**MQTT_CONF, "mqttMaxQueuedMessages": BOUND}).start()
    try:
        yield s
    finally:
        s.kill()


def test_an_offline_session_keeps_the_newest_dropping_qos0_first(connect, standalone):
    web = standalone.addresses["web"][0]
    cid, base = unique("bound"), unique("q")
    sub, _ = connect(cid, clean=False)
    subscribe(sub, f"{base}/#", qos=1)
    sub.loop_stop()
    sub.disconnect()
    pub, _ = connect(unique("p"))
    # 8 at QoS 1, 6 at QoS 0, 4 at QoS 1: 18 for a bound of 10. Each over the bound drops
    # the oldest QoS 0 one while there is one (z0..z5), then the oldest QoS 1 (m0, m1).
    sent = [(f"m{i}", 1) for i in range(8)] + [(f"z{i}", 0) for i in range(6)] \
        + [(f"m{i}", 1) for i in range(8, 12)]
    for payload, qos in sent:
        pub.publish(f"{base}/x", payload.encode(), qos=qos).wait_for_publish(WAIT)

    def settled() -> bool:
        m = scrape(web)
        return (metric(m, "magnetar_mqtt_messages_dropped_total", reason="queue_full") == 8
                and metric(m, "magnetar_mqtt_queued_messages") == BOUND)

    wait_until(settled)
    again, box = connect(cid, clean=False)
    assert box.flags.session_present
    kept = [f"m{i}".encode() for i in range(2, 12)]
    assert [m.payload for m in box.wait(BOUND)] == kept  # the newest, in order
    pub.publish(f"{base}/x", b"live", qos=1).wait_for_publish(WAIT)
    box.wait(BOUND + 1)
    assert [m.payload for m in box.items] == [*kept, b"live"]  # and nothing else came
    assert metric(scrape(web), "magnetar_mqtt_queued_messages") == 0
