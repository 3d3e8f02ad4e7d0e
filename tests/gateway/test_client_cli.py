"""``magnetar client produce``'s flags as pulsar-client documents them, parsed and then
sent through a real standalone."""

from __future__ import annotations

import argparse

import pulsar
import pytest

from gateway._cli import build_parser, main
from tests._standalone import Standalone


def parse_produce(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["client", "produce", "persistent://t/n/x", "-m", "d", *flags])


@pytest.mark.parametrize(("flags", "expected"), [
    # pulsar-client: "Comma separated key=value string, like k1=v1,k2=v2"
    (("-p", "x=1,y=2"), {"x": "1", "y": "2"}),
    (("-p", "x=1", "-p", "y=2"), {"x": "1", "y": "2"}),
    (("-p", "a=1,b=2", "--properties", "c=3"), {"a": "1", "b": "2", "c": "3"}),
    (("-p", "url=a=b,k="), {"url": "a=b", "k": ""}),
    ((), {}),
])
def test_properties_are_comma_separated_pairs(flags: tuple[str, ...], expected: dict[str, str]) -> None:
    assert dict(parse_produce(*flags).properties) == expected


@pytest.mark.parametrize("bad", ["x", "=1", "x=1,y", "x=1,,y=2"])
def test_a_property_without_key_and_value_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_produce("-p", bad)
    assert exc.value.code == 2
    assert "key=value" in capsys.readouterr().err


def test_produced_message_carries_each_property(standalone: Standalone, unique: str) -> None:
    topic = f"persistent://public/default/client-props-{unique}"
    client = pulsar.Client(standalone.pulsar_url, operation_timeout_seconds=10)
    try:
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        assert main(["client", "--url", standalone.pulsar_url, "produce", topic, "-m", "d",
                     "-p", "x=1,y=2", "-p", "z=a=b"]) == 0
        msg = consumer.receive(timeout_millis=10_000)
        assert msg.data() == b"d"
        assert msg.properties() == {"x": "1", "y": "2", "z": "a=b"}
    finally:
        client.close()
