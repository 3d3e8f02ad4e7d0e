"""``magnetar client produce|consume``: pulsar-client's commands and flags, using the
official Pulsar Python client against the broker's Pulsar listener (``--url``)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from ._cli import Command, register_command
from ._config import SUBSCRIPTION_TYPES
from ._tokens_cli import add_auth_arguments, token_of

__all__ = ["produce", "consume"]

DEFAULT_SERVICE_URL = "pulsar://127.0.0.1:6650"


def _properties(text: str) -> list[tuple[str, str]]:
    """``k1=v1,k2=v2`` as pulsar-client's ``-p`` takes it: comma separated pairs, each split
    at its first ``=`` (so a value may hold ``=`` but not ``,``)."""
    pairs: list[tuple[str, str]] = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"expected key=value[,key=value...], got {text!r}")
        pairs.append((key, value))
    return pairs


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("MAGNETAR_SERVICE_URL", DEFAULT_SERVICE_URL),
                   help=f"Pulsar service URL (default {DEFAULT_SERVICE_URL}, or $MAGNETAR_SERVICE_URL)")
    add_auth_arguments(p)
    sub = p.add_subparsers(dest="client_command", metavar="COMMAND", title="commands")

    prod = sub.add_parser("produce", help="produce messages", description="Produce messages to a topic.")
    prod.add_argument("topic")
    prod.add_argument("-m", "--messages", action="append", default=[],
                      help="message bodies, split on --separator; repeatable")
    prod.add_argument("-f", "--files", action="append", default=[], help="files whose contents are messages")
    # --num-messages: the spelling Pulsar's operations guides use with produce
    prod.add_argument("-n", "--num-produce", "--num-messages", dest="num_produce", type=int, default=1,
                      help="times to send each message")
    prod.add_argument("-r", "--rate", type=float, default=0.0, help="messages per second (0: no limit)")
    prod.add_argument("-s", "--separator", default=",", help="separator of --messages (default ,)")
    prod.add_argument("-k", "--key", help="message key")
    prod.add_argument("-p", "--properties", type=_properties, action="extend", default=[],
                      help="message properties, comma separated key=value, like k1=v1,k2=v2; repeatable")
    prod.add_argument("-db", "--disable-batching", action="store_true", help="send each message alone")
    prod.set_defaults(_client_run=produce)

    cons = sub.add_parser("consume", help="consume messages", description="Consume messages from a topic.")
    cons.add_argument("topic")
    cons.add_argument("-s", "--subscription-name", "--subscription", dest="subscription_name",
                      required=True, help="subscription name")
    cons.add_argument("-n", "--num-messages", type=int, default=1, help="messages to consume (0: forever)")
    cons.add_argument("-t", "--subscription-type", default="Exclusive", choices=SUBSCRIPTION_TYPES)
    cons.add_argument("-p", "--subscription-position", default="Latest", choices=("Latest", "Earliest"))
    cons.add_argument("-r", "--rate", type=float, default=0.0, help="messages per second (0: no limit)")
    cons.add_argument("--hex", action="store_true", help="print contents as hex")
    cons.add_argument("--timeout", type=float, default=0.0,
                      help="stop after this many seconds without a message (0: wait forever)")
    cons.set_defaults(_client_run=consume)
    p.set_defaults(_client_parser=p)


def _bodies(args: argparse.Namespace) -> list[bytes]:
    bodies: list[bytes] = []
    for m in args.messages:
        bodies.extend(part.encode() for part in m.split(args.separator))
    for path in args.files:
        with open(path, "rb") as f:
            bodies.append(f.read())
    return bodies


def produce(args: argparse.Namespace) -> int:

    bodies = _bodies(args)
    if not bodies:
        print("magnetar client: error: give messages with -m or files with -f", file=sys.stderr)
        return 2
    client = _client(args)
    sent = 0
    try:
        producer = client.create_producer(args.topic, batching_enabled=not args.disable_batching)
        props = dict(args.properties)
        interval = 1.0 / args.rate if args.rate > 0 else 0.0
        for _ in range(args.num_produce):
            for body in bodies:
                started = time.monotonic()
                kw: dict[str, Any] = {"properties": props} if props else {}
                if args.key is not None:
                    kw["partition_key"] = args.key
                producer.send(body, **kw)
                sent += 1
                if interval:
                    time.sleep(max(0.0, interval - (time.monotonic() - started)))
        producer.close()
    except Exception as exc:
        print(f"{sent} messages successfully produced", file=sys.stderr)
        print(f"magnetar client: error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(f"{sent} messages successfully produced")
    return 0


def _format(msg: Any, hex_content: bool) -> str:
    data = msg.data()
    content = data.hex() if hex_content else data.decode(errors="replace")
    props = ", ".join(f"{k}={v}" for k, v in sorted(msg.properties().items()))
    key = msg.partition_key() or "null"
    return f"----- got message -----\nkey:[{key}], properties:[{props}], content:{content}"


def consume(args: argparse.Namespace) -> int:
    import pulsar

    client = _client(args)
    received = 0
    try:
        consumer = client.subscribe(
            args.topic, args.subscription_name,
            consumer_type=getattr(pulsar.ConsumerType, args.subscription_type.replace("_", "")),
            initial_position=getattr(pulsar.InitialPosition, args.subscription_position))
        interval = 1.0 / args.rate if args.rate > 0 else 0.0
        while args.num_messages <= 0 or received < args.num_messages:
            started = time.monotonic()
            try:
                if args.timeout > 0:
                    msg = consumer.receive(timeout_millis=int(args.timeout * 1000))
                else:
                    msg = consumer.receive()
            except pulsar.Timeout:
                break
            print(_format(msg, args.hex), flush=True)
            consumer.acknowledge(msg)
            received += 1
            if interval:
                time.sleep(max(0.0, interval - (time.monotonic() - started)))
        consumer.close()
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        print(f"{received} messages successfully consumed", file=sys.stderr)
        print(f"magnetar client: error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(f"{received} messages successfully consumed")
    return 0


def _client(args: argparse.Namespace) -> Any:
    """The Pulsar client for ``--url``, authenticating with ``--auth-params``' token."""
    import pulsar

    token = token_of(args)
    auth = pulsar.AuthenticationToken(token) if token is not None else None
    return pulsar.Client(args.url, authentication=auth, logger=_quiet_logger())


def _quiet_logger() -> Any:
    """The client library's own console logger, errors only (a Python logger would be
    called from the library's threads, also while the interpreter exits)."""
    import pulsar

    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


def run(args: argparse.Namespace) -> int:
    fn = getattr(args, "_client_run", None)
    if fn is None:
        args._client_parser.print_help(sys.stderr)
        return 2
    try:
        return int(fn(args))
    except argparse.ArgumentTypeError as exc:
        print(f"magnetar client: error: {exc}", file=sys.stderr)
        return 2


register_command(Command(
    "client",
    "produce or consume messages (like pulsar-client)",
    _add_arguments,
    run,
    "Produce and consume with the Pulsar client library.",
))
