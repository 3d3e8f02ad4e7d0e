"""Topic configs: given at CreateTopics or altered later, stored as Magnetar topic
policies, reported by DescribeConfigs and the admin REST API, and applied."""

from __future__ import annotations

import json
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)

from core.policies import exact_retention, size_retention_floor
from handlers.kafka._codec import Data
from handlers.kafka._configs import ConfigError, apply, validate
from handlers.kafka._errors import ErrorCode
from tests._standalone import Standalone
from tests.handlers.kafka._wire import Wire, bootstrap
from tests.handlers.kafka.conftest import KAFKA_CONF
from tests.handlers.kafka.test_clients import DEADLINE, drain_confluent, wait_for
from tests.handlers.kafka.test_delete_records import _ledgers, _watermarks
from tests.handlers.kafka.test_wire import PRODUCE, batch, produce_body

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import ConfigResourceType
    from kafka.admin import NewTopic as KNewTopic
    from kafka.errors import InvalidConfigurationError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:kafka")


def _rest(server: Standalone, path: str) -> Any:
    with urllib.request.urlopen(server.addresses["web"][0] + path, timeout=DEADLINE) as r:
        body = r.read()
    return json.loads(body) if body else None


def _describe(admin: AdminClient, topic: str) -> dict[str, Any]:
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return dict(admin.describe_configs([res])[res].result(DEADLINE))


# -- the mapping ----------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "value", "message"), [
    ("segment.jitter.ms", "1", "Unknown topic config name: segment.jitter.ms"),
    ("segment.bytes", "13", "at least 14"),
    ("segment.bytes", "2147483648", "Not a number of type INT"),
    ("segment.ms", "0", "at least 1"),
    ("message.timestamp.type", "logappendtime",
     "Invalid value logappendtime for configuration message.timestamp.type: "
     "String must be one of: CreateTime, LogAppendTime"),
    ("retention.ms", "soon", "Not a number"),
    ("retention.ms", "-2", "at least -1"),
    ("max.message.bytes", "-1", "at least 0"),
    ("cleanup.policy", "compact", "delete only"),
    ("retention.bytes", None, "Null value"),
])
def test_invalid_configs(name: str, value: str | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        validate(name, value)
    assert err.value.code == ErrorCode.INVALID_CONFIG


def test_min_insync_replicas_is_the_ack_quorum() -> None:
    pol: dict[str, Any] = {"persistence": {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 3}}
    apply(pol, [("min.insync.replicas", "2")])
    assert pol["persistence"] == {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 3,
                                  "bookkeeperAckQuorum": 2}
    apply(pol, [("min.insync.replicas", None)])
    assert pol["persistence"] == {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 3}
    alone: dict[str, Any] = {}
    apply(alone, [("min.insync.replicas", "1")])
    apply(alone, [("min.insync.replicas", None)])
    assert alone == {}
    with pytest.raises(ConfigError, match="at least 1"):
        validate("min.insync.replicas", "0")


def test_retention_maps_onto_the_retention_policy() -> None:
    pol: dict[str, Any] = {}
    # The half a Kafka client leaves unset is unlimited, as in Kafka.
    apply(pol, [("retention.ms", "90001"), ("max.message.bytes", "1000")])
    # rounded up to whole minutes for the retention policy, and kept as given beside it
    assert pol == {"retention_policies": {"retentionTimeInMinutes": 2, "retentionSizeInMB": -1},
                   "retention_exact": {"retentionTimeInMillis": 90001},
                   "max_message_size": 1000}
    assert exact_retention(pol) == (90001, None)
    apply(pol, [("retention.bytes", str(5 * 1024 * 1024 + 1))])
    assert pol["retention_policies"] == {"retentionTimeInMinutes": 2, "retentionSizeInMB": 6}
    assert exact_retention(pol) == (90001, 5 * 1024 * 1024 + 1)
    apply(pol, [("retention.ms", None)])
    assert pol["retention_policies"] == {"retentionTimeInMinutes": -1, "retentionSizeInMB": 6}
    assert pol["retention_exact"] == {"retentionSizeInBytes": 5 * 1024 * 1024 + 1}
    # a retention set later in whole minutes and MB (the admin API) takes over
    assert exact_retention({**pol, "retention_policies": {"retentionTimeInMinutes": 5,
                                                          "retentionSizeInMB": 7}}) == (None, None)
    # Both halves removed: back to the namespace's retention.
    apply(pol, [("retention.bytes", None), ("max.message.bytes", None)])
    assert pol == {}
    apply(pol, [("retention.ms", "-1"), ("retention.bytes", "-1")])
    assert pol == {"retention_policies": {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}}


def test_size_retention_keeps_the_newest_ledgers_holding_retention_bytes() -> None:
    """As Kafka deletes segments for retention.bytes: the oldest goes while what follows it
    still holds the limit; the ledger being written always stays."""
    ledgers = [{"size": 100, "firstIndex": 0}, {"size": 100, "firstIndex": 10},
               {"size": 100, "firstIndex": 20}, {"size": 50, "firstIndex": 30}]
    assert size_retention_floor(ledgers, 350) == 0
    assert size_retention_floor(ledgers, 250) == 10
    assert size_retention_floor(ledgers, 249) == 10
    assert size_retention_floor(ledgers, 150) == 20
    assert size_retention_floor(ledgers, 0) == 30
    assert size_retention_floor(ledgers[:1], 0) == 0


def test_segment_configs_map_onto_the_ledger_rollover_policy() -> None:
    pol: dict[str, Any] = {}
    apply(pol, [("segment.ms", validate("segment.ms", "250")),
                ("segment.bytes", validate("segment.bytes", "14")),
                ("message.timestamp.type", validate("message.timestamp.type", " LogAppendTime"))])
    # segment.bytes is rounded up to whole MiB, as the ledger's size limit is kept
    assert pol == {"ledger_rollover": {"rolloverTimeInMillis": 250, "rolloverSizeInMB": 1},
                   "message_timestamp_type": "LogAppendTime"}
    apply(pol, [("segment.bytes", str(5 * 1024 * 1024 + 1)), ("segment.ms", None)])
    assert pol["ledger_rollover"] == {"rolloverSizeInMB": 6}
    apply(pol, [("segment.bytes", None), ("message.timestamp.type", None)])
    assert pol == {}


# -- real clients ---------------------------------------------------------------------------


def test_a_topic_created_without_configs_describes_its_retention_as_the_default(
        kafka_broker: Standalone, boot: str, unique: str) -> None:
    """The week of retention a Kafka-created topic holds as its own policy is Kafka's
    default, and DescribeConfigs says so; a retention the client set is the topic's."""
    plain, kept = f"plain-{unique}", f"kept-{unique}"
    admin = AdminClient({"bootstrap.servers": boot})
    futures = admin.create_topics([NewTopic(plain, 1), NewTopic(kept, 1, config={"retention.bytes": "1048576"})])
    for f in futures.values():
        f.result(DEADLINE)
    week = str(7 * 24 * 3_600_000)
    described = _describe(admin, plain)
    assert (described["retention.ms"].value, described["retention.ms"].source) == (
        week, ConfigSource.DEFAULT_CONFIG.value)
    assert (described["retention.bytes"].value, described["retention.bytes"].source) == (
        "-1", ConfigSource.DEFAULT_CONFIG.value)
    # the storage keeps a week all the same: the topic's own retention policy says so
    assert _rest(kafka_broker, f"/admin/v2/persistent/public/default/{plain}/retention") == {
        "retentionTimeInMinutes": 7 * 24 * 60, "retentionSizeInMB": -1}
    described = _describe(admin, kept)
    assert (described["retention.bytes"].value, described["retention.bytes"].source) == (
        "1048576", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert described["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value


def test_create_topic_configs_are_stored_described_and_applied(
        kafka_broker: Standalone, boot: str, unique: str) -> None:
    topic = f"cfg-{unique}"
    admin = AdminClient({"bootstrap.servers": boot})
    configs = {"retention.ms": "7200000", "retention.bytes": str(3 * 1024 * 1024),
               "max.message.bytes": "2048", "cleanup.policy": "delete"}
    admin.create_topics([NewTopic(topic, 2, config=configs)])[topic].result(DEADLINE)

    described = _describe(admin, topic)
    for key, value in configs.items():
        assert described[key].value == value
    assert described["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert described["max.message.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value

    base = f"/admin/v2/persistent/public/default/{topic}"
    assert _rest(kafka_broker, base + "/retention") == {"retentionTimeInMinutes": 120,
                                                         "retentionSizeInMB": 3}
    assert _rest(kafka_broker, base + "/maxMessageSize") == 2048

    # max.message.bytes bounds a record batch on this topic (not on others).
    p = Producer({"bootstrap.servers": boot, "linger.ms": 0, "message.max.bytes": 1_000_000})
    errors: list[Any] = []
    for target, value in [(topic, b"x" * 4096), (topic, b"small"), (f"other-{unique}", b"x" * 4096)]:
        p.produce(target, value=value, partition=0, on_delivery=lambda e, m: errors.append(e))
        assert p.flush(DEADLINE) == 0
    codes = [e.code() if e is not None else None for e in errors]
    assert codes == [KafkaError.MSG_SIZE_TOO_LARGE, None, None]


def test_create_topic_invalid_configs_and_validate_only(boot: str, unique: str) -> None:
    admin = AdminClient({"bootstrap.servers": boot})
    bad = f"cfg-bad-{unique}"
    with pytest.raises(KafkaException) as err:
        admin.create_topics([NewTopic(bad, 1, config={"no.such.config": "1"})])[bad].result(DEADLINE)
    assert err.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert "no.such.config" in err.value.args[0].str()
    with pytest.raises(KafkaException) as err:
        admin.create_topics([NewTopic(bad, 1, config={"retention.ms": "x"})])[bad].result(DEADLINE)
    assert err.value.args[0].code() == KafkaError.INVALID_CONFIG
    # Neither attempt created the topic; nor does a valid validate_only request.
    checked = f"cfg-dry-{unique}"
    admin.create_topics([NewTopic(checked, 1, config={"retention.ms": "60000"})],
                        validate_only=True)[checked].result(DEADLINE)
    topics = admin.list_topics(timeout=DEADLINE).topics
    assert bad not in topics and checked not in topics


def test_incremental_alter_configs(kafka_broker: Standalone, boot: str, unique: str) -> None:
    topic = f"cfg-alter-{unique}"
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic(topic, 1, config={"max.message.bytes": "4096"})])[topic].result(DEADLINE)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "600000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("max.message.bytes", None, incremental_operation=AlterConfigOpType.DELETE)])
    admin.incremental_alter_configs([res])[res].result(DEADLINE)
    described = _describe(admin, topic)
    assert described["retention.ms"].value == "600000"
    # back to the broker's message.max.bytes (its maxMessageSize, in its configuration)
    assert described["max.message.bytes"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    base = f"/admin/v2/persistent/public/default/{topic}"
    assert _rest(kafka_broker, base + "/retention")["retentionTimeInMinutes"] == 10
    assert _rest(kafka_broker, base + "/maxMessageSize") is None

    # APPEND and SUBTRACT apply to list configs only: INVALID_CONFIG, in Kafka's words
    for op, word in ((AlterConfigOpType.APPEND, "APPEND"), (AlterConfigOpType.SUBTRACT, "SUBTRACT")):
        bad = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
            ConfigEntry("retention.ms", "1", incremental_operation=op)])
        with pytest.raises(KafkaException) as err:
            admin.incremental_alter_configs([bad])[bad].result(DEADLINE)
        assert (err.value.args[0].code(), err.value.args[0].str()) == (
            KafkaError.INVALID_CONFIG, f"Can't {word} to key retention.ms because its type is not LIST.")


def test_kafka_python_create_with_configs_and_alter(kafka_broker: Standalone, boot: str,
                                                    unique: str) -> None:
    topic = f"cfg-kp-{unique}"
    admin = KafkaAdminClient(bootstrap_servers=boot)
    try:
        admin.create_topics([KNewTopic(topic, 1, 1, topic_configs={"retention.bytes": "-1"})])
        base = f"/admin/v2/persistent/public/default/{topic}"
        assert _rest(kafka_broker, base + "/retention")["retentionSizeInMB"] == -1
        with pytest.raises(InvalidConfigurationError):
            admin.create_topics([KNewTopic(f"{topic}-x", 1, 1,
                                           topic_configs={"cleanup.policy": "compact"})])
        # kafka-python's alter_configs resends the configs already set with the new one.
        admin.alter_configs([KConfigResource(ConfigResourceType.TOPIC, topic,
                                             configs={"max.message.bytes": "10000"})])
        assert _rest(kafka_broker, base + "/maxMessageSize") == 10000
        assert _rest(kafka_broker, base + "/retention")["retentionSizeInMB"] == -1
    finally:
        admin.close()


def test_describe_configs_of_an_unknown_topic(boot: str, unique: str) -> None:
    with Wire(boot) as w:
        resp = w.call(32, 4, Data(resources=[Data(resource_type=2, resource_name=f"nope-{unique}",
                                                  configuration_keys=None)],
                                  include_synonyms=False, include_documentation=False))
        assert resp.results[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_describe_configs_gives_types_and_synonyms(boot: str, unique: str) -> None:
    """DescribeConfigs v3+ gives each config its ConfigDef type, and, asked for synonyms, a
    config set on the topic or the broker lists itself with its source, then a topic
    config its broker-level synonyms."""
    topic = f"cfg-types-{unique}"
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic(topic, 1, config={"retention.ms": "60000"})])[topic].result(DEADLINE)
    with Wire(boot) as w:
        def describe(resource_type: int, name: str, synonyms: bool) -> dict[str, Data]:
            resp = w.call(32, 4, Data(resources=[Data(resource_type=resource_type, resource_name=name,
                                                      configuration_keys=None)],
                                      include_synonyms=synonyms, include_documentation=False))
            return {c.name: c for c in resp.results[0].configs}

        configs = describe(2, topic, True)
        types = {k: c.config_type for k, c in configs.items()}
        assert types["retention.ms"] == 5 and types["max.message.bytes"] == 3
        assert types["cleanup.policy"] == 7 and types["message.timestamp.type"] == 2
        assert [(s.name, s.value, s.source) for s in configs["retention.ms"].synonyms] == [
            ("retention.ms", "60000", 1)]
        assert [(s.name, s.value, s.source) for s in configs["cleanup.policy"].synonyms] == [
            ("log.cleanup.policy", "delete", 5)]
        assert describe(2, topic, False)["retention.ms"].synonyms == []
        broker = describe(4, "0", True)
        assert broker["message.max.bytes"].config_type == 3
        assert broker["auto.create.topics.enable"].config_type == 1
        assert [s.source for s in broker["message.max.bytes"].synonyms] == [4]


def test_a_topic_config_lists_its_broker_synonyms(boot: str, unique: str) -> None:
    """As Kafka's: a topic config the topic does not set comes from its broker-level
    synonym, named as Kafka names it, from the broker's configuration (STATIC_BROKER_CONFIG)
    where the key behind it is set there, then its default (DEFAULT_CONFIG); the source of
    the topic config is the first of them. One set on the topic lists itself first.
    retention.ms lists none: Kafka lists log.retention.ms only when it is set."""
    topic = f"cfg-syn-{unique}"
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic(topic, 1, config={"max.message.bytes": "4096"})])[topic].result(DEADLINE)
    static, default, topic_own = (ConfigSource.STATIC_BROKER_CONFIG.value,
                                  ConfigSource.DEFAULT_CONFIG.value,
                                  ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    described = admin.describe_configs([res])[res].result(DEADLINE)
    assert set(described["max.message.bytes"].synonyms) == {"max.message.bytes",
                                                            "message.max.bytes"}
    assert (described["min.insync.replicas"].source,
            set(described["min.insync.replicas"].synonyms)) == (static, {"min.insync.replicas"})
    # A topic config is never read-only, wherever its value comes from (as in Kafka).
    assert not described["min.insync.replicas"].is_read_only
    assert described["cleanup.policy"].synonyms["log.cleanup.policy"].source == default

    with Wire(boot) as w:
        resp = w.call(32, 4, Data(resources=[Data(resource_type=2, resource_name=topic,
                                                  configuration_keys=None)],
                                  include_synonyms=True, include_documentation=False))
    configs = {c.name: c for c in resp.results[0].configs}

    def synonyms(name: str) -> list[tuple[str, str | None, int]]:
        return [(s.name, s.value, s.source) for s in configs[name].synonyms]

    size = str(5 * 1024 * 1024)  # maxMessageSize, in the broker's configuration and its default
    assert synonyms("max.message.bytes") == [("max.message.bytes", "4096", topic_own),
                                             ("message.max.bytes", size, static),
                                             ("message.max.bytes", size, default)]
    assert configs["max.message.bytes"].config_source == topic_own
    assert synonyms("min.insync.replicas") == [("min.insync.replicas", "1", static),
                                               ("min.insync.replicas", "1", default)]
    assert synonyms("retention.bytes") == [("log.retention.bytes", "-1", default)]
    assert synonyms("message.timestamp.type") == [("log.message.timestamp.type", "CreateTime",
                                                   default)]
    assert synonyms("compression.type") == [("compression.type", "producer", default)]
    assert [(n, s) for n, _, s in synonyms("segment.bytes")] == [("log.segment.bytes", static),
                                                                ("log.segment.bytes", default)]
    assert synonyms("retention.ms") == []
    assert configs["retention.ms"].config_source == default


def test_broker_synonym_defaults_are_the_brokers() -> None:
    """The default each broker synonym falls back to is the broker key's own default."""
    from gateway._config import load_config
    from handlers.kafka._configs import BROKER_SYNONYMS

    defaults = load_config(None, {}, environ={})
    for synonym in BROKER_SYNONYMS.values():
        if synonym.key is not None:
            assert defaults.get(synonym.key) == synonym.default, synonym


def test_describe_configs_of_the_broker_default_resource_is_empty(boot: str) -> None:
    """A BROKER resource with an empty name is the cluster-wide dynamic broker defaults
    (Kafka's ConfigHelper); Magnetar's broker configs are static, so it has none, while the
    broker's own id gives its configs."""
    with Wire(boot) as w:
        def describe(name: str) -> Data:
            return w.call(32, 4, Data(resources=[Data(resource_type=4, resource_name=name,
                                                      configuration_keys=None)],
                                      include_synonyms=False, include_documentation=False)).results[0]

        default = describe("")
        assert default.error_code == 0 and default.configs == []
        assert "message.max.bytes" in {c.name for c in describe("0").configs}
        assert describe("7").error_code == ErrorCode.INVALID_REQUEST


def test_alter_configs_replaces_the_topics_configs(kafka_broker: Standalone, boot: str,
                                                    unique: str) -> None:
    topic = f"cfg-replace-{unique}"
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic(topic, 1, config={"retention.ms": "-1"})])[topic].result(DEADLINE)
    base = f"/admin/v2/persistent/public/default/{topic}"
    with Wire(boot) as w:
        def alter(configs: dict[str, str], validate_only: bool = False) -> Data:
            return w.call(33, 2, Data(resources=[Data(
                resource_type=2, resource_name=topic,
                configs=[Data(name=k, value=v) for k, v in configs.items()])],
                validate_only=validate_only)).responses[0]

        assert alter({"max.message.bytes": "5000"}, validate_only=True).error_code == 0
        assert _rest(kafka_broker, base + "/maxMessageSize") is None
        assert alter({"max.message.bytes": "5000"}).error_code == 0
        assert _rest(kafka_broker, base + "/maxMessageSize") == 5000
        # retention.ms not given: back to Kafka's default, a week, held by the topic
        assert _rest(kafka_broker, base + "/retention") == {"retentionTimeInMinutes": 7 * 24 * 60,
                                                            "retentionSizeInMB": -1}
        bad = alter({"retention.ms": "-5"})
        assert bad.error_code == ErrorCode.INVALID_CONFIG and "retention.ms" in bad.error_message
        assert _rest(kafka_broker, base + "/maxMessageSize") == 5000


def test_retention_configs_are_applied_by_the_storage(tmp_path: Path, unique: str) -> None:
    """The namespace keeps nothing that has been consumed (retention 0); with
    log.retention.hours negative, Kafka's topics take that retention unless they set their
    own: a topic created with retention.ms=-1 keeps its ledgers while one without it loses
    them."""
    server = Standalone(tmp_path, conf={**KAFKA_CONF, "managedLedgerMaxEntriesPerLedger": 5,
                                        "managedLedgerMinLedgerRolloverTimeMinutes": 0,
                                        "retentionCheckIntervalInSeconds": 1,
                                        "log.retention.hours": -1}).start()
    try:
        boot = bootstrap(server.addresses)
        kept, plain = f"keep-{unique}", f"plain-{unique}"
        admin = AdminClient({"bootstrap.servers": boot})
        for topic, config in [(kept, {"retention.ms": "-1"}), (plain, {})]:
            admin.create_topics([NewTopic(topic, 1, config=config)])[topic].result(DEADLINE)
        # Written in this order, the kept topic is checked first in every retention pass.
        with Wire(boot) as w:
            for topic in (kept, plain):
                for i in range(20):
                    w.call(PRODUCE, 9, produce_body(topic, batch([b"r%d" % i])))
        wait_for(lambda: len(_ledgers(server, plain)) <= 2)
        assert len(_ledgers(server, kept)) >= 4
    finally:
        server.kill()


def test_retention_finer_than_minutes_and_mib_is_kept_shown_and_enforced(
        tmp_path: Path, unique: str) -> None:
    """retention.ms=1000 and retention.bytes=1 are kept as set (the admin API shows them
    rounded up to whole minutes and MB), described back exactly, after a restart too, and
    enforced at that resolution: records a second past their sealed ledger go at the next
    retention check, and only the newest ledger holding a byte stays for retention.bytes,
    while a topic with a whole minute of retention keeps its records."""
    conf = {**KAFKA_CONF, "managedLedgerMaxEntriesPerLedger": 5,
            "managedLedgerMinLedgerRolloverTimeMinutes": 0,
            "defaultRetentionTimeInMinutes": -1, "defaultRetentionSizeInMB": -1,
            "retentionCheckIntervalInSeconds": 1}
    second, byte, minute = f"ret-ms-{unique}", f"ret-bytes-{unique}", f"ret-min-{unique}"
    configs = {second: {"retention.ms": "1000"}, byte: {"retention.bytes": "1"},
               minute: {"retention.ms": "60000"}}
    server = Standalone(tmp_path, conf=conf).start()
    try:
        boot = bootstrap(server.addresses)
        admin = AdminClient({"bootstrap.servers": boot})
        for topic, config in configs.items():
            admin.create_topics([NewTopic(topic, 1, config=config)])[topic].result(DEADLINE)
        assert _describe(admin, second)["retention.ms"].value == "1000"
        assert _describe(admin, byte)["retention.bytes"].value == "1"
        base = "/admin/v2/persistent/public/default/"
        assert _rest(server, base + second + "/retention") == {"retentionTimeInMinutes": 1,
                                                               "retentionSizeInMB": -1}
        with Wire(boot) as w:
            for topic in configs:
                for i in range(20):
                    w.call(PRODUCE, 9, produce_body(topic, batch([b"r%d" % i])))
        # 20 records, 5 to a ledger: the four full ledgers are sealed
        wait_for(lambda: _watermarks(boot, second)[0] >= 15)
        wait_for(lambda: _watermarks(boot, byte)[0] >= 15)
        assert _watermarks(boot, minute) == (0, 20)
        assert len(_ledgers(server, minute)) >= 4
    finally:
        server.kill()
    again = Standalone(tmp_path, conf=conf).start()
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap(again.addresses)})
        assert _describe(admin, second)["retention.ms"].value == "1000"
        assert _describe(admin, byte)["retention.bytes"].value == "1"
        assert _describe(admin, minute)["retention.ms"].value == "60000"
    finally:
        again.kill()


def test_records_past_retention_ms_go_once_the_topic_stops_receiving_writes(
        tmp_path: Path, unique: str) -> None:
    """As Kafka rolls an active segment whose records have all passed retention.ms, the
    ledger being written is sealed once its newest record is older than the topic's
    retention and then deleted: a topic that stops receiving records loses them all (its
    log start offset reaches its end) instead of keeping its last ledger until that
    ledger's rollover age (hours). A topic with a longer retention keeps its records."""
    server = Standalone(tmp_path, conf={**KAFKA_CONF, "retentionCheckIntervalInSeconds": 1}).start()
    try:
        boot = bootstrap(server.addresses)
        short, kept = f"ret-idle-{unique}", f"ret-kept-{unique}"
        admin = AdminClient({"bootstrap.servers": boot})
        for topic, ms in [(short, "2000"), (kept, "600000")]:
            admin.create_topics([NewTopic(topic, 1, config={"retention.ms": ms})])[topic].result(DEADLINE)
        with Wire(boot) as w:
            for topic in (short, kept):
                for i in range(5):
                    w.call(PRODUCE, 9, produce_body(topic, batch([b"r%d" % i])))
        wait_for(lambda: _watermarks(boot, short) == (5, 5))
        assert [led["entries"] for led in _ledgers(server, short)] == [0]
        assert _watermarks(boot, kept) == (0, 5)
    finally:
        server.kill()


def test_a_retention_set_through_the_admin_api_replaces_the_exact_one(
        kafka_broker: Standalone, boot: str, unique: str) -> None:
    """retention.ms=90000 shows as 2 minutes to the admin API; setting the topic's retention
    there, even to those same 2 minutes, makes it the topic's retention, and DescribeConfigs
    then shows 120000."""
    topic = f"ret-admin-{unique}"
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic(topic, 1, config={"retention.ms": "90000"})])[topic].result(DEADLINE)
    assert _describe(admin, topic)["retention.ms"].value == "90000"
    url = f"{kafka_broker.addresses['web'][0]}/admin/v2/persistent/public/default/{topic}/retention"
    body = json.dumps({"retentionTimeInMinutes": 2, "retentionSizeInMB": -1}).encode()
    put = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(put, timeout=DEADLINE).close()
    assert _describe(admin, topic)["retention.ms"].value == "120000"


def test_a_topic_a_kafka_client_creates_keeps_a_week_of_records(tmp_path: Path, unique: str) -> None:
    """As Kafka keeps every topic's records for log.retention.hours (a week), whether or not
    anyone read them: consumer groups hold no subscription, so without a retention of its
    own the topic would keep nothing past its current ledger once its ledgers roll over."""
    server = Standalone(tmp_path, conf={**KAFKA_CONF, "managedLedgerMaxEntriesPerLedger": 5,
                                        "managedLedgerMinLedgerRolloverTimeMinutes": 0,
                                        "retentionCheckIntervalInSeconds": 1}).start()
    try:
        boot = bootstrap(server.addresses)
        created, auto, pulsar_side = f"made-{unique}", f"auto-{unique}", f"native-{unique}"
        admin = AdminClient({"bootstrap.servers": boot})
        admin.create_topics([NewTopic(created, 1)])[created].result(DEADLINE)
        week = {"retentionTimeInMinutes": 7 * 24 * 60, "retentionSizeInMB": -1}
        for topic in (created, auto):
            with Wire(boot) as w:  # the produce auto-creates the second topic
                for i in range(20):
                    w.call(PRODUCE, 9, produce_body(topic, batch([b"r%d" % i])))
            assert _rest(server, f"/admin/v2/persistent/public/default/{topic}/retention") == week
            assert _describe(admin, topic)["retention.ms"].value == str(7 * 24 * 3_600_000)
        # a topic made through the Pulsar side keeps Pulsar's retention (the namespace's)
        import pulsar

        client = pulsar.Client(server.pulsar_url)
        try:
            producer = client.create_producer(f"persistent://public/default/{pulsar_side}")
            for i in range(20):
                producer.send(b"p%d" % i)
        finally:
            client.close()
        native = f"/admin/v2/persistent/public/default/{pulsar_side}/internalStats"
        wait_for(lambda: len(_rest(server, native)["ledgers"]) <= 2)
        assert len(_ledgers(server, created)) >= 4 and len(_ledgers(server, auto)) >= 4
    finally:
        server.kill()


def test_the_replication_factor_is_the_number_of_bookies_each_record_is_written_to(
        tmp_path: Path, unique: str) -> None:
    server = Standalone(tmp_path, bookies=2, conf=KAFKA_CONF).start()
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap(server.addresses)})
        too_many, two = f"rf3-{unique}", f"rf2-{unique}"
        with pytest.raises(KafkaException) as err:
            admin.create_topics([NewTopic(too_many, 1, replication_factor=3)])[too_many].result(DEADLINE)
        assert err.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR
        assert "larger than available bookies: 2" in err.value.args[0].str()
        assert too_many not in admin.list_topics(timeout=DEADLINE).topics
        with pytest.raises(KafkaException) as err:  # more copies acknowledged than written
            admin.create_topics([NewTopic(two, 1, replication_factor=2, config={
                "min.insync.replicas": "3"})])[two].result(DEADLINE)
        assert err.value.args[0].code() == KafkaError.INVALID_CONFIG
        admin.create_topics([NewTopic(two, 1, replication_factor=2, config={
            "min.insync.replicas": "2"})])[two].result(DEADLINE)
        persistence = _rest(server, f"/admin/v2/persistent/public/default/{two}/persistence")
        assert (persistence["bookkeeperEnsemble"], persistence["bookkeeperWriteQuorum"],
                persistence["bookkeeperAckQuorum"]) == (2, 2, 2)
        insync = _describe(admin, two)["min.insync.replicas"]
        assert (insync.value, insync.source) == ("2", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
        bad = ConfigResource(ConfigResource.Type.TOPIC, two, incremental_configs=[
            ConfigEntry("min.insync.replicas", "3", incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(KafkaException) as err:
            admin.incremental_alter_configs([bad])[bad].result(DEADLINE)
        assert err.value.args[0].code() == KafkaError.INVALID_CONFIG
        assert "replication factor (2)" in err.value.args[0].str()
        producer = Producer({"bootstrap.servers": bootstrap(server.addresses)})
        producer.produce(two, b"copied twice")
        assert producer.flush(DEADLINE) == 0
        stats = _rest(server, f"/admin/v2/persistent/public/default/{two}-partition-0/"
                              "internalStats?metadata=true")
        record = json.loads(stats["ledgers"][-1]["metadata"])
        assert all(len(set(ensemble)) == 2 for _, ensemble in record["ensembles"]), record
    finally:
        server.kill()


def _segments(server: Standalone, topic: str, produce: Any) -> int:
    """Ledgers of the topic's partition 0 after one more record is written."""
    produce(topic)
    return len(_ledgers(server, topic))


def test_segment_ms_rolls_ledgers_over_by_age(kafka_broker: Standalone, boot: str,
                                              unique: str) -> None:
    """segment.ms is the age at which a ledger rolls over (at the topic's next write): set at
    creation, or later on a topic already open, which is reopened to take it. No minimum
    rollover time holds this rule back."""
    created, altered, plain = f"seg-ms-{unique}", f"seg-ms-alt-{unique}", f"seg-ms-none-{unique}"
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic(created, 1, config={"segment.ms": "100"}),
                         NewTopic(altered, 1), NewTopic(plain, 1)])[created].result(DEADLINE)
    p = Producer({"bootstrap.servers": boot, "linger.ms": 0})

    def produce(topic: str) -> None:
        p.produce(topic, b"r", partition=0)
        assert p.flush(DEADLINE) == 0

    produce(altered)  # its partition is open with the broker's rollover (4 hours)
    res = ConfigResource(ConfigResource.Type.TOPIC, altered, incremental_configs=[
        ConfigEntry("segment.ms", "100", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(DEADLINE)

    wait_for(lambda: min(_segments(kafka_broker, t, produce) for t in (created, altered)) >= 3)
    assert _segments(kafka_broker, plain, produce) == 1
    for topic in (created, altered):
        ms = _describe(admin, topic)["segment.ms"]
        assert (ms.value, ms.source) == ("100", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
        assert _rest(kafka_broker, f"/admin/v2/persistent/public/default/{topic}/ledgerRollover") \
            == {"rolloverTimeInMillis": 100}

    # deleted: back to the broker's rollover, managedLedgerMaxLedgerRolloverTimeMinutes
    res = ConfigResource(ConfigResource.Type.TOPIC, altered, incremental_configs=[
        ConfigEntry("segment.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    admin.incremental_alter_configs([res])[res].result(DEADLINE)
    ms = _describe(admin, altered)["segment.ms"]
    assert (ms.value, ms.source) == (str(240 * 60_000), ConfigSource.DEFAULT_CONFIG.value)
    assert _rest(kafka_broker, f"/admin/v2/persistent/public/default/{altered}/ledgerRollover") is None


def test_segment_bytes_rolls_ledgers_over_by_size(kafka_broker: Standalone, tmp_path: Path,
                                                  unique: str) -> None:
    """segment.bytes, rounded up to whole MiB, is the size at which a ledger rolls over,
    once the ledger is managedLedgerMinLedgerRolloverTimeMinutes old: with the shipped 10
    minutes a young ledger takes the same writes whole."""
    value = b"x" * 400_000
    config = {"segment.bytes": "14"}

    def write(boot: str, topic: str) -> None:
        p = Producer({"bootstrap.servers": boot, "linger.ms": 0})
        for _ in range(6):  # 2.4 MB; a ledger takes writes until it holds 1 MiB: 3 each
            p.produce(topic, value, partition=0)
            assert p.flush(DEADLINE) == 0

    young = f"seg-bytes-young-{unique}"
    boot = bootstrap(kafka_broker.addresses)
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic(young, 1, config=config)])[young].result(DEADLINE)
    write(boot, young)
    assert [ledger["entries"] for ledger in _ledgers(kafka_broker, young)] == [6]

    server = Standalone(tmp_path, conf={**KAFKA_CONF, "managedLedgerMinLedgerRolloverTimeMinutes": 0}).start()
    try:
        boot = bootstrap(server.addresses)
        admin = AdminClient({"bootstrap.servers": boot})
        sized, plain = f"seg-bytes-{unique}", f"seg-bytes-none-{unique}"
        admin.create_topics([NewTopic(sized, 1, config=config), NewTopic(plain, 1)])[sized].result(DEADLINE)
        for topic in (sized, plain):
            write(boot, topic)
        assert [ledger["entries"] for ledger in _ledgers(server, sized)] == [3, 3]
        assert [ledger["entries"] for ledger in _ledgers(server, plain)] == [6]
        described = _describe(admin, sized)["segment.bytes"]
        assert (described.value, described.source) == (str(1024 * 1024),
                                                       ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
        assert _rest(server, f"/admin/v2/persistent/public/default/{sized}/ledgerRollover") \
            == {"rolloverSizeInMB": 1}
        # the broker's 2048 MiB (managedLedgerMaxSizePerLedgerMbytes, in its configuration)
        # is past Kafka's INT: it shows as the largest INT
        default = _describe(admin, plain)["segment.bytes"]
        assert (default.value, default.source) == ("2147483647",
                                                   ConfigSource.STATIC_BROKER_CONFIG.value)
    finally:
        server.kill()


def test_log_append_time_shows_the_broker_time(kafka_broker: Standalone, boot: str,
                                               unique: str) -> None:
    """With message.timestamp.type=LogAppendTime the produce response and the fetched
    records carry the broker's append time, typed LOG_APPEND_TIME, whatever time the
    producer gave; set back to CreateTime, the producer's own times show again."""
    topic, plain = f"lat-{unique}", f"lat-none-{unique}"
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic(topic, 1, config={"message.timestamp.type": "LogAppendTime"}),
                         NewTopic(plain, 1)])[topic].result(DEADLINE)
    described = _describe(admin, topic)["message.timestamp.type"]
    assert (described.value, described.source) == ("LogAppendTime",
                                                   ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert _rest(kafka_broker, f"/admin/v2/persistent/public/default/{topic}/messageTimestampType") \
        == "LogAppendTime"
    old = 1_000_000_000_000  # 2001
    before = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": boot, "linger.ms": 0})
    delivered: list[Any] = []
    for target in (topic, plain):
        for i in range(3):
            p.produce(target, b"v%d" % i, partition=0, timestamp=old + i,
                      on_delivery=lambda err, msg: delivered.append((err, msg.timestamp())))
        assert p.flush(DEADLINE) == 0
    assert all(err is None for err, _ in delivered)
    appended = [ts for _, ts in delivered[:3]]
    assert all(kind == TIMESTAMP_LOG_APPEND_TIME and at >= before for kind, at in appended)
    assert [ts for _, ts in delivered[3:]] == [(TIMESTAMP_CREATE_TIME, old + i) for i in range(3)]

    def fetched(name: str, n: int = 3) -> list[tuple[int, int]]:
        c = Consumer({"bootstrap.servers": boot, "group.id": f"g-{name}-{time.monotonic_ns()}",
                      "auto.offset.reset": "earliest"})
        try:
            c.subscribe([name])
            return [m.timestamp() for m in drain_confluent(c, n)]
        finally:
            c.close()

    assert fetched(topic) == appended
    assert fetched(plain) == [(TIMESTAMP_CREATE_TIME, old + i) for i in range(3)]
    # offsets by time search the append times
    c = Consumer({"bootstrap.servers": boot, "group.id": f"g-times-{unique}"})
    try:
        [found] = c.offsets_for_times([TopicPartition(topic, 0, before)], timeout=DEADLINE)
    finally:
        c.close()
    assert found.offset == 0

    # deleted: the default (CreateTime) again, and the stored producer times with it; then
    # LogAppendTime again, for a message a Pulsar producer wrote too (no Kafka batch of it
    # is cached: its batch is built from storage)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("message.timestamp.type", None, incremental_operation=AlterConfigOpType.DELETE)])
    admin.incremental_alter_configs([res])[res].result(DEADLINE)
    described = _describe(admin, topic)["message.timestamp.type"]
    assert (described.value, described.source) == ("CreateTime", ConfigSource.DEFAULT_CONFIG.value)
    assert fetched(topic) == [(TIMESTAMP_CREATE_TIME, old + i) for i in range(3)]
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("message.timestamp.type", "LogAppendTime", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(DEADLINE)
    import pulsar

    client = pulsar.Client(kafka_broker.pulsar_url)
    try:
        client.create_producer(f"persistent://public/default/{topic}-partition-0").send(
            b"from pulsar", event_timestamp=old)
    finally:
        client.close()
    *kafka_side, (kind, at) = fetched(topic, 4)
    assert kafka_side == appended
    assert kind == TIMESTAMP_LOG_APPEND_TIME and at >= appended[-1][1]
