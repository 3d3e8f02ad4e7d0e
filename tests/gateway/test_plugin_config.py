"""A protocol plugin's own configuration keys (gateway.config): declared by its handler's
``config_keys``, loaded, defaulted and checked like the core keys when
``messagingProtocols`` names it."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest
import trio

from gateway._config import KEYS, ConfigError, load_config
from gateway._plugins import BUILTIN_PROTOCOLS, load_protocol, protocol_keys
from gateway._runtime_config import RuntimeConfig
from gateway.config import Key, int_key, listeners_key, str_key
from tests._standalone import Standalone

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = __name__


class ToyProtocolHandler:
    """A user's protocol: it serves nothing, and reports the values of its keys."""

    name = "toy"
    config_keys = (
        int_key("toyMaxLine", 4096, "Longest line a toy client may send, in bytes.", 1, 65536),
        str_key("toyGreeting", "hello", "What the toy protocol says first."),
        listeners_key("toyListeners", ("toy://127.0.0.1:7007",), "Toy listener URLs.", "toy"),
    )

    def __init__(self, config, broker):
        self.config = config

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started([f"{self.config.get('toyGreeting')}:{self.config.get('toyMaxLine')}"])
        await trio.sleep_forever()


class RivalProtocolHandler:
    """Declares a key the toy protocol declares."""

    name = "rival"
    config_keys = (int_key("toyMaxLine", 80, "Longest line, again.", 1),)


class KafkaTenantThief:
    config_keys = (str_key("kafkaTenant", "mine", "A key of the Kafka protocol."),)


class CoreKeyThief:
    config_keys = (str_key("clusterName", "mine", "A core key."),)


class Stutter:
    config_keys = (str_key("stutterA", "", "Once."), str_key("stutterA", "", "Twice."))


class Dynamic:
    config_keys = (Key("dynamicA", "int", 1, "Changeable at runtime.", dynamic=True),)


class NotKeys:
    config_keys = ("toyMaxLine",)


class NoKeys:
    """A protocol that declares no keys at all."""


TOY = f"{HERE}:ToyProtocolHandler"
RIVAL = f"{HERE}:RivalProtocolHandler"


def _load(protocols: str, path: str | None = None, overrides: dict[str, str] | None = None,
          environ: dict[str, str] | None = None):
    return load_config(path, {"messagingProtocols": protocols, **(overrides or {})},
                       environ=environ or {})


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "plugin.conf"
    path.write_text(text, encoding="utf-8")
    return str(path)


# --- a plugin's keys load like the core keys


def test_a_plugins_keys_take_their_defaults():
    cfg = _load(f"pulsar,{TOY}")
    assert (cfg.toyMaxLine, cfg.get("toyGreeting")) == (4096, "hello")
    assert cfg["toyListeners"] == ("toy://127.0.0.1:7007",)
    assert not cfg.is_set("toyMaxLine")
    assert cfg.unknown == {}
    assert list(cfg.keys)[-3:] == ["toyMaxLine", "toyGreeting", "toyListeners"]
    assert list(cfg) == list(cfg.keys)


def test_a_plugins_keys_load_from_the_file_and_the_environment(tmp_path):
    path = _write(tmp_path, f"messagingProtocols=pulsar,{TOY}\n"
                            "toyMaxLine=512\n"
                            "toyGreeting=hi\n"
                            "toyListeners=toy://127.0.0.1:17007\n")
    cfg = load_config(path, environ={})
    assert (cfg.toyMaxLine, cfg.toyGreeting, cfg.is_set("toyMaxLine")) == (512, "hi", True)
    assert [str(x) for x in cfg.listeners("toyListeners")] == ["toy://127.0.0.1:17007"]
    # The environment, as for a core key: PULSAR_PREFIX_<key> sets any key, <key> only one
    # present in the file; the protocol list itself may come from there too.
    cfg = load_config(path, environ={"PULSAR_PREFIX_toyGreeting": "hey", "toyMaxLine": "1024"})
    assert (cfg.toyMaxLine, cfg.toyGreeting) == (1024, "hey")
    cfg = load_config(None, environ={"PULSAR_PREFIX_messagingProtocols": TOY,
                                     "PULSAR_PREFIX_toyMaxLine": "2048", "toyGreeting": "no"})
    assert (cfg.toyMaxLine, cfg.toyGreeting) == (2048, "hello")
    # An override wins over both.
    assert load_config(path, {"toyMaxLine": "7"}, environ={"PULSAR_PREFIX_toyMaxLine": "8"}) \
        .toyMaxLine == 7


def test_an_empty_value_means_the_plugin_keys_default(tmp_path):
    path = _write(tmp_path, f"messagingProtocols={TOY}\ntoyMaxLine=\n")
    cfg = load_config(path, environ={})
    assert cfg.toyMaxLine == 4096 and not cfg.is_set("toyMaxLine")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("toyMaxLine", "lots", "toyMaxLine: 'lots' is not an integer (expected an integer 1-65536)"),
    ("toyMaxLine", "0", "toyMaxLine: '0' is out of range (expected an integer 1-65536)"),
    ("toyListeners", "127.0.0.1:7007",
     "toyListeners: '127.0.0.1:7007' contains '127.0.0.1:7007', which is not a listener URL "
     "(expected a comma-separated list of toy://host:port)"),
    # the same message as a core key's
    ("standaloneBookies", "lots",
     "standaloneBookies: 'lots' is not an integer (expected an integer 1-16)"),
])
def test_a_bad_value_of_a_plugins_key_is_refused_like_a_core_keys(key, value, message):
    with pytest.raises(ConfigError) as info:
        _load(f"pulsar,{TOY}", overrides={key: value})
    assert str(info.value) == message


def test_a_bad_value_from_the_environment_is_refused():
    with pytest.raises(ConfigError, match="^toyMaxLine: 'x' is not an integer"):
        load_config(None, {"messagingProtocols": TOY}, environ={"PULSAR_PREFIX_toyMaxLine": "x"})


def test_the_runtime_configuration_reads_a_plugins_keys():
    runtime = RuntimeConfig(_load(f"pulsar,{TOY}", overrides={"toyMaxLine": "99"}))
    assert (runtime.get("toyMaxLine"), runtime.toyMaxLine) == (99, 99)
    assert runtime.as_dict()["toyGreeting"] == "hello"


# --- one owner per key


@pytest.mark.parametrize(("protocols", "message"), [
    (f"pulsar,{TOY},{RIVAL}",
     f"toyMaxLine: declared by protocol '{TOY}' and by protocol '{RIVAL}'; a key has one owner"),
    (f"kafka,{HERE}:KafkaTenantThief",
     f"kafkaTenant: declared by protocol 'kafka' and by protocol '{HERE}:KafkaTenantThief'; "
     "a key has one owner"),
    (f"{HERE}:CoreKeyThief",
     f"clusterName: declared by protocol '{HERE}:CoreKeyThief', but it is a core key; a key "
     "has one owner"),
    (f"{HERE}:Stutter", f"stutterA: declared twice by protocol '{HERE}:Stutter'"),
    (f"{HERE}:Dynamic",
     f"dynamicA: declared dynamic by protocol '{HERE}:Dynamic', but only core keys can change "
     "while the broker runs"),
    (f"{HERE}:NotKeys",
     f"messagingProtocols: protocol '{HERE}:NotKeys' declares config_keys that are not a "
     "sequence of gateway.config.Key"),
    ("pulsar,nosuch", "messagingProtocols: unknown protocol 'nosuch'"),
    (f"{HERE}:Absent", f"messagingProtocols: cannot load '{HERE}:Absent'"),
])
def test_a_declaration_that_cannot_be_used_is_refused_at_load(protocols, message):
    with pytest.raises(ConfigError) as info:
        _load(protocols)
    assert str(info.value).startswith(message)


def test_a_protocol_named_twice_declares_its_keys_once():
    assert _load(f"{TOY},{TOY}").toyMaxLine == 4096


def test_a_protocol_may_declare_no_keys():
    cfg = _load(f"pulsar,{HERE}:NoKeys")
    assert dict(cfg.keys) == dict(KEYS)


def test_a_duplicate_declaration_stops_the_broker_at_start(tmp_path):
    """A real ``magnetar standalone``: it exits 2 before starting anything, naming both."""
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "standalone", "--config", _write(tmp_path, ""),
         "--data-dir", str(tmp_path / "data"), "-c", f"messagingProtocols=pulsar,{TOY},{RIVAL}",
         "-c", "brokerServicePort=0", "-c", "webServicePort=0", "-c", "bookiePort=0"],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"magnetar: error: toyMaxLine: declared by protocol '{TOY}' and by protocol '{RIVAL}'; "
        "a key has one owner")


def test_a_plugin_serving_in_a_broker_reads_its_keys(tmp_path):
    with Standalone(tmp_path / "data", conf={"messagingProtocols": f"pulsar,{TOY}",
                                             "toyMaxLine": 77, "toyGreeting": "ahoy"}) as s:
        assert s.addresses[TOY] == ["ahoy:77"]


# --- keys of protocols that are not loaded


def test_keys_of_a_built_in_protocol_not_loaded_are_ignored_with_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="magnetar.config"):
        cfg = _load("pulsar,kafka", overrides={"mqttListeners": "nonsense", "mqttTenant": "t",
                                               "amqpFrameMax": "4096", "someOtherKey": "1"})
    assert "mqttTenant" not in cfg.keys
    assert cfg.unknown == {"mqttListeners": "nonsense", "mqttTenant": "t", "amqpFrameMax": "4096",
                           "someOtherKey": "1"}
    assert cfg.get("amqpFrameMax") == "4096"  # the raw string, as for any unknown key
    assert [r.getMessage() for r in caplog.records] == [
        "configuration keys of protocol mqtt ignored, as messagingProtocols does not load it: "
        "mqttListeners, mqttTenant",
        "configuration keys of protocol amqp ignored, as messagingProtocols does not load it: "
        "amqpFrameMax",
        "unknown configuration key 'someOtherKey' ignored",
    ]


def test_a_key_of_a_plugin_not_loaded_is_an_unknown_key(caplog):
    with caplog.at_level(logging.WARNING, logger="magnetar.config"):
        cfg = _load("pulsar", overrides={"toyMaxLine": "12"})
    assert cfg.unknown == {"toyMaxLine": "12"}
    assert caplog.messages == ["unknown configuration key 'toyMaxLine' ignored"]


# --- the built-in protocols' keys


@pytest.mark.parametrize(("key", "default"), [
    ("kafkaListeners", ("PLAINTEXT://127.0.0.1:9092",)),
    ("kafkaTenant", "public"),
    ("kafkaNamespace", "default"),
    ("group.initial.rebalance.delay.ms", 0),
    ("log.retention.hours", 168),
    ("mqttListeners", ("mqtt://127.0.0.1:1883",)),
    ("mqttMaxPacketSize", 1048576),
    ("mqttMaxQueuedMessages", 1000),
    ("amqpListeners", ("amqp://127.0.0.1:5672",)),
    ("amqpFrameMax", 131072),
    ("amqpDefaultUser", "guest"),
])
def test_the_built_in_protocols_keys_load_with_their_defaults(key, default):
    cfg = load_config(None, environ={})
    assert key not in KEYS
    assert cfg.get(key) == default and not cfg.is_set(key)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("amqpFrameMax", "1024", "amqpFrameMax: '1024' is out of range (expected an integer >= 4096)"),
    ("mqttMaxPacketSize", "big", "mqttMaxPacketSize: 'big' is not an integer"),
    ("kafkaListeners", "127.0.0.1:9092", "kafkaListeners: '127.0.0.1:9092' contains"),
])
def test_the_built_in_protocols_keys_are_checked(key, value, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        load_config(None, {key: value}, environ={})


@pytest.mark.parametrize("name", sorted(BUILTIN_PROTOCOLS))
def test_a_built_in_protocols_keys_are_what_its_class_declares(name):
    assert protocol_keys(name) == tuple(getattr(load_protocol(name), "config_keys", ()))


def test_reading_a_configuration_does_not_load_the_protocols():
    """A bookie reads the same configuration and serves no protocol: the built-in
    protocols' keys come without their implementations."""
    code = ("import sys\n"
            "from gateway._config import load_config\n"
            "cfg = load_config(None, environ={})\n"
            "assert cfg.get('amqpFrameMax') == 131072\n"
            "print(sorted(m for m in sys.modules if m.startswith(('handlers.', 'core.'))))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == ("['handlers.amqp', 'handlers.amqp._settings', 'handlers.kafka', "
                           "'handlers.kafka._settings', 'handlers.mqtt', 'handlers.mqtt._settings']")
