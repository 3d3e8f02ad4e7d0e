"""gateway._config: the key table, the file format, environment and override precedence."""

from __future__ import annotations

import logging
import os

import pytest

from gateway._config import (
    KEYS,
    MAX_FRAME_SIZE,
    MESSAGE_FRAME_PADDING,
    MIN_FRAME_SIZE,
    Config,
    ConfigError,
    Listener,
    check_frame_holds_message,
    load_config,
    parse_config_text,
    parse_duration,
    parse_listener,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXPECTED_DEFAULTS = {
    "clusterName": "standalone",
    "brokerServicePort": 6650,
    "webServicePort": 8080,
    "bindAddress": "127.0.0.1",
    "advertisedAddress": "",
    "metadataStoreUrl": "sqlite:data/metadata.db",
    "messagingProtocols": ("pulsar", "kafka", "amqp", "mqtt"),
    "kafkaListeners": ("PLAINTEXT://127.0.0.1:9092",),
    "kafkaTenant": "public",
    "kafkaNamespace": "default",
    "maxMessageSize": 5242880,
    "keepAliveIntervalSeconds": 30,
    "allowAutoTopicCreation": True,
    "allowAutoTopicCreationType": "non-partitioned",
    "defaultNumPartitions": 1,
    "brokerDeduplicationEnabled": False,
    "defaultRetentionTimeInMinutes": 0,
    "defaultRetentionSizeInMB": 0,
    "ttlDurationDefaultInSeconds": 0,
    "backlogQuotaDefaultLimitGB": -1.0,
    "backlogQuotaDefaultRetentionPolicy": "producer_request_hold",
    "managedLedgerDefaultEnsembleSize": 1,
    "managedLedgerDefaultWriteQuorum": 1,
    "managedLedgerDefaultAckQuorum": 1,
    "managedLedgerMaxEntriesPerLedger": 50000,
    "managedLedgerMinLedgerRolloverTimeMinutes": 10,
    "managedLedgerMaxLedgerRolloverTimeMinutes": 240,
    "managedLedgerMaxSizePerLedgerMbytes": 2048,
    "managedLedgerDefaultMarkDeleteRateLimit": 1.0,
    "bookiePort": 3181,
    "journalSyncData": True,
    "journalMaxGroupWaitMSec": 2,
    "journalFlushWhenQueueEmpty": True,
    "journalBufferedWritesThreshold": 524288,
    "journalMaxSizeMB": 2048,
    "nettyMaxFrameSizeBytes": 5253120,
    "standaloneBookies": 1,
    "dataDirectory": "data",
    "logLevel": "info",
    "logFormat": "text",
}


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "test.conf"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(("key", "expected"), sorted(EXPECTED_DEFAULTS.items()))
def test_built_in_defaults(key, expected):
    cfg = load_config(None, environ={})
    assert getattr(cfg, key) == expected
    assert cfg.get(key) == expected
    assert not cfg.is_set(key)


def _render(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


#: Every key of a configuration that loads every built-in protocol: the core keys and theirs.
ALL_KEYS = load_config(None, environ={}).keys


@pytest.mark.parametrize("name", list(ALL_KEYS))
def test_every_key_is_documented_and_its_default_parses_back(name):
    key = ALL_KEYS[name]
    assert key.doc and key.doc[0].isupper()
    assert key.type in {"str", "int", "float", "bool", "list", "duration"}
    if key.default not in ("", ()):
        assert key.parse(_render(key.default)) == key.default


def test_file_comments_blank_lines_whitespace_and_empty_values(tmp_path):
    path = _write(
        tmp_path,
        "# a comment\n"
        "\n"
        "   brokerServicePort =  7000  \n"
        "  # indented comment=ignored\n"
        "clusterName=\n"
        "kafkaListeners = PLAINTEXT://127.0.0.1:19092 , PLAINTEXT://127.0.0.1:19093\n"
        "allowAutoTopicCreation=FALSE\n"
        "advertisedAddress=broker=1\n",
    )
    cfg = load_config(path, environ={})
    assert cfg.brokerServicePort == 7000
    assert cfg.clusterName == "standalone"
    assert not cfg.is_set("clusterName")
    assert cfg.kafkaListeners == ("PLAINTEXT://127.0.0.1:19092", "PLAINTEXT://127.0.0.1:19093")
    assert cfg.listeners("kafkaListeners")[1] == Listener("PLAINTEXT", "127.0.0.1", 19093)
    assert cfg.allowAutoTopicCreation is False
    assert cfg.advertisedAddress == "broker=1"
    assert cfg.is_set("brokerServicePort")
    assert cfg.path == path


def test_later_line_wins():
    assert parse_config_text("a=1\na=2\n") == {"a": "2"}


def test_malformed_line_names_file_and_line(tmp_path):
    path = _write(tmp_path, "clusterName=x\nthis line has no equals sign\n")
    with pytest.raises(ConfigError, match=r"test\.conf:2: expected key=value"):
        load_config(path, environ={})


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        load_config(str(tmp_path / "absent.conf"), environ={})


def test_precedence_file_then_environment_then_overrides(tmp_path):
    path = _write(tmp_path, "brokerServicePort=7001\nwebServicePort=7002\nbookiePort=7003\n")
    environ = {"PULSAR_PREFIX_webServicePort": "7012", "PULSAR_PREFIX_bookiePort": "7013"}
    cfg = load_config(path, {"bookiePort": "7023"}, environ=environ)
    assert (cfg.brokerServicePort, cfg.webServicePort, cfg.bookiePort) == (7001, 7012, 7023)


def test_plain_environment_name_applies_only_to_keys_in_the_file(tmp_path):
    # Pulsar's apply-config-from-env: a variable named exactly like a key replaces that
    # key's line in the file; PULSAR_PREFIX_<key> sets any key.
    path = _write(tmp_path, "brokerServicePort=7001\n")
    environ = {"brokerServicePort": "7101", "webServicePort": "7102"}
    cfg = load_config(path, environ=environ)
    assert cfg.brokerServicePort == 7101
    assert cfg.webServicePort == 8080
    assert load_config(None, environ=environ).brokerServicePort == 6650


def test_prefixed_environment_wins_over_plain_name(tmp_path):
    path = _write(tmp_path, "clusterName=a\n")
    cfg = load_config(path, environ={"clusterName": "b", "PULSAR_PREFIX_clusterName": "c"})
    assert cfg.clusterName == "c"


def test_keys_of_pulsar_that_mean_nothing_here_say_why(tmp_path, caplog):
    """A Pulsar or BookKeeper file carries keys Magnetar has no use for: each is kept, like
    any unknown key, but the warning says why it is ignored instead of calling it unknown."""
    path = _write(tmp_path, "PULSAR_MEM=-Xms4g -Xmx4g\n"
                            "ledgerStorageClass=org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage\n"
                            "dbStorage_writeCacheMaxSizeMb=1024\n"
                            "loadBalancerEnabled=true\n"
                            "batchingMaxMessages=1000\n"
                            "maxConcurrentNonPersistentMessagePerConnection=1000\n"
                            "brokerClientAuthenticationPlugin=org.apache.pulsar.client.impl.auth.AuthenticationToken\n"
                            "someFuturePulsarKey=1\n")
    with caplog.at_level(logging.WARNING, logger="magnetar.config"):
        cfg = load_config(path, environ={})
    lines = {r.getMessage().split("'")[1]: r.getMessage() for r in caplog.records}
    assert "runs no JVM" in lines["PULSAR_MEM"]
    assert "one ledger storage" in lines["ledgerStorageClass"]
    assert "DbLedgerStorage" in lines["dbStorage_writeCacheMaxSizeMb"]
    assert "no load balancer" in lines["loadBalancerEnabled"]
    assert "set it in the client" in lines["batchingMaxMessages"]
    assert "none is ever in flight" in lines["maxConcurrentNonPersistentMessagePerConnection"]
    assert "makes no such calls" in lines["brokerClientAuthenticationPlugin"]
    assert lines["someFuturePulsarKey"] == "unknown configuration key 'someFuturePulsarKey' ignored"
    assert "unknown" not in lines["PULSAR_MEM"]
    assert cfg.unknown["dbStorage_writeCacheMaxSizeMb"] == "1024"


def test_unknown_key_is_logged_and_kept(tmp_path, caplog):
    path = _write(tmp_path, "someFuturePulsarKey=42\nclusterName=c1\n")
    with caplog.at_level(logging.WARNING, logger="magnetar.config"):
        cfg = load_config(path, environ={})
    assert "someFuturePulsarKey" in caplog.text
    assert cfg.unknown == {"someFuturePulsarKey": "42"}
    assert cfg.get("someFuturePulsarKey") == "42"
    assert cfg.clusterName == "c1"
    with pytest.raises(AttributeError):
        _ = cfg.someFuturePulsarKey


def test_bad_integer_message_names_key_value_and_form():
    with pytest.raises(ConfigError) as info:
        load_config(None, {"brokerServicePort": "abc"}, environ={})
    assert str(info.value) == (
        "brokerServicePort: 'abc' is not an integer (expected an integer port 0-65535)"
    )


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("brokerServicePort", "70000", "'70000' is out of range (expected an integer port 0-65535)"),
        ("webServicePort", "-1", "is out of range"),
        ("allowAutoTopicCreation", "maybe", "'maybe' is not a boolean (expected true or false)"),
        ("allowAutoTopicCreationType", "sometimes", "expected one of partitioned, non-partitioned"),
        ("managedLedgerDefaultMarkDeleteRateLimit", "fast", "is not a number"),
        ("managedLedgerDefaultMarkDeleteRateLimit", "nan", "is not a finite number"),
        ("kafkaListeners", "127.0.0.1:9092", "is not a listener URL"),
        ("metadataStoreUrl", "etcd:foo", "expected sqlite:PATH, memory: or zk:"),
        ("logFormat", "xml", "expected one of text, json"),
        ("standaloneBookies", "0", "expected an integer 1-16"),
        ("managedLedgerCacheEvictionWatermark", "1.5", "is out of range (expected a number 0-1)"),
        ("defaultNumPartitions", "1.5", "is not an integer"),
        ("zookeeperServers", "zookeeper", "is not a ZooKeeper connect string"),
        ("zkServers", "zk:zookeeper:2181", "expected host:port[,host:port][/chroot]"),
        ("advertisedListeners", "pulsar://h:6650", "is not name:pulsar://host:port"),
        ("advertisedListeners", "ext:http://h:8080", "has scheme 'http', not pulsar or pulsar+ssl"),
        ("advertisedListeners", "a:pulsar://h:1,a:pulsar://h:2", "'a' has two pulsar:// URLs"),
        ("nettyMaxFrameSizeBytes", "4095",
         "'4095' is out of range (expected an integer 4096-16778240)"),
        ("nettyMaxFrameSizeBytes", "16778241", "is out of range"),
        ("nettyMaxFrameSizeBytes", "5MB", "is not an integer"),
        # a check every 0 minutes would run without pause
        ("messageExpiryCheckIntervalInMinutes", "0", "is out of range"),
        ("backlogQuotaCheckIntervalInSeconds", "0", "is out of range"),
        ("max.request.partition.size.limit", "lots", "is not an integer"),
    ],
)
def test_bad_values_are_rejected_with_the_expected_form(key, value, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, {key: value}, environ={})
    assert str(info.value).startswith(f"{key}: ")
    assert fragment in str(info.value)


def test_bad_value_from_environment_is_rejected():
    with pytest.raises(ConfigError, match="bookiePort"):
        load_config(None, environ={"PULSAR_PREFIX_bookiePort": "x"})


def test_config_is_immutable():
    cfg = load_config(None, environ={})
    with pytest.raises(AttributeError):
        cfg.brokerServicePort = 1
    with pytest.raises(AttributeError):
        del cfg.clusterName
    copy = cfg.as_dict()
    copy["clusterName"] = "x"
    assert cfg.clusterName == "standalone"


def test_get_with_default_and_mapping_access():
    cfg = load_config(None, environ={})
    assert cfg.get("noSuchKey", 5) == 5
    assert cfg["kafkaTenant"] == "public"
    assert "kafkaTenant" in cfg
    assert list(cfg) == list(cfg.keys)
    assert list(cfg.keys)[:len(KEYS)] == list(KEYS)
    assert cfg.as_dict()["bookiePort"] == 3181


def test_paths_derive_from_data_directory_unless_set():
    cfg = load_config(None, {"dataDirectory": "/srv/m"}, environ={})
    assert cfg.metadataStoreUrl == "sqlite:/srv/m/metadata.db"
    cfg = load_config(None, {"dataDirectory": "/srv/m", "metadataStoreUrl": "memory:"}, environ={})
    assert cfg.metadataStoreUrl == "memory:"


def test_zookeeper_servers_under_pulsar_and_bookkeeper_names_set_the_metadata_store(tmp_path):
    cfg = load_config(None, {"zookeeperServers": "zk1:2181,zk2:2181"}, environ={})
    assert cfg.metadataStoreUrl == "zk:zk1:2181,zk2:2181"
    # A bookkeeper.conf with zkServers present, set from the environment as Pulsar's
    # container scripts do.
    path = _write(tmp_path, "zkServers=\njournalDirectory=/data/journal\n")
    cfg = load_config(path, environ={"zkServers": "zookeeper:2181/ledgers"})
    assert cfg.metadataStoreUrl == "zk:zookeeper:2181/ledgers"
    # metadataStoreUrl, when set, wins over both (as in Pulsar).
    cfg = load_config(None, {"zookeeperServers": "zk1:2181", "metadataStoreUrl": "memory:"},
                      environ={})
    assert cfg.metadataStoreUrl == "memory:"


def test_a_configuration_store_may_only_be_the_metadata_store():
    same = load_config(None, {"zookeeperServers": "zk1:2181",
                              "configurationStoreServers": "zk1:2181",
                              "configurationMetadataStoreUrl": "zk:zk1:2181"}, environ={})
    assert same.metadataStoreUrl == "zk:zk1:2181"
    for key, value in (("configurationStoreServers", "zk2:2181"),
                       ("configurationMetadataStoreUrl", "zk:zk2:2181")):
        with pytest.raises(ConfigError) as info:
            load_config(None, {"zookeeperServers": "zk1:2181", key: value}, environ={})
        assert str(info.value).startswith(f"{key}: '{value}' is not the metadata store "
                                          "('zk:zk1:2181')")
        assert "a separate configuration store is not supported" in str(info.value)


def test_the_internal_listener_must_be_an_advertised_one_with_a_pulsar_url():
    listeners = "int:pulsar://10.0.0.5:6650,ext:pulsar+ssl://broker.example:6651"
    cfg = load_config(None, {"advertisedListeners": listeners}, environ={})
    assert cfg.advertisedListeners == ("int:pulsar://10.0.0.5:6650",
                                       "ext:pulsar+ssl://broker.example:6651")
    with pytest.raises(ConfigError, match="internalListenerName: 'other' is not one of "
                                          r"advertisedListeners \(int, ext\)"):
        load_config(None, {"advertisedListeners": listeners, "internalListenerName": "other"},
                    environ={})
    with pytest.raises(ConfigError, match="the internal listener 'ext' has no pulsar:// URL"):
        load_config(None, {"advertisedListeners": listeners, "internalListenerName": "ext"},
                    environ={})


def test_netty_max_frame_size_follows_max_message_size_unless_set():
    """Pulsar's pairing: a frame holds a message of maxMessageSize and 10 KiB of headers
    (its bookkeeper.conf ships 5253120); capped at what a frame may hold at most."""
    assert load_config(None, {"maxMessageSize": "1048576"}, environ={}).nettyMaxFrameSizeBytes \
        == 1048576 + 10240
    assert load_config(None, {"maxMessageSize": "104857600"},
                       environ={}).nettyMaxFrameSizeBytes == MAX_FRAME_SIZE
    cfg = load_config(None, {"nettyMaxFrameSizeBytes": "65536"}, environ={})
    assert cfg.nettyMaxFrameSizeBytes == 65536 and cfg.is_set("nettyMaxFrameSizeBytes")
    # BookKeeper's bookie.conf and bookkeeper.conf spellings are the same key.
    path = os.path.join(REPO, "conf", "bookie.conf")
    assert load_config(path, environ={}).nettyMaxFrameSizeBytes == 5253120


@pytest.mark.parametrize(("overrides", "message"), [
    ({}, None),
    ({"maxMessageSize": "1048576"}, None),
    ({"nettyMaxFrameSizeBytes": "5253120"}, None),
    ({"nettyMaxFrameSizeBytes": "5242880"},
     "nettyMaxFrameSizeBytes: 5242880 cannot hold a message of maxMessageSize (5242880) and its "
     "headers: set it to at least 5253120 (maxMessageSize + 10240, as Pulsar pairs them), or "
     "lower maxMessageSize"),
    ({"maxMessageSize": "16777216"},
     "maxMessageSize: 16777216 needs bookie frames of 16787456 bytes (maxMessageSize + 10240), "
     "more than the 16778240 a frame may have (nettyMaxFrameSizeBytes); set maxMessageSize to "
     "at most 16768000"),
])
def test_a_broker_needs_frames_that_hold_its_largest_message(overrides, message):
    cfg = load_config(None, overrides, environ={})
    if message is None:
        check_frame_holds_message(cfg)
    else:
        with pytest.raises(ConfigError) as info:
            check_frame_holds_message(cfg)
        assert str(info.value) == message


def test_frame_limits_agree_with_the_native_core_and_the_pulsar_codec():
    from core import _native
    from handlers.pulsar._codec import FRAME_HEADER_ALLOWANCE

    assert (MIN_FRAME_SIZE, MAX_FRAME_SIZE) == (_native.MIN_FRAME_SIZE, _native.MAX_FRAME_SIZE)
    assert MESSAGE_FRAME_PADDING == FRAME_HEADER_ALLOWANCE


def test_list_values_are_trimmed_and_empty_items_dropped():
    cfg = load_config(None, {"messagingProtocols": " pulsar, kafka ,,mqtt "}, environ={})
    assert cfg.messagingProtocols == ("pulsar", "kafka", "mqtt")


@pytest.mark.parametrize("name", ["standalone.conf", "broker.conf", "bookie.conf"])
def test_shipped_conf_files_load_cleanly(name, caplog):
    path = os.path.join(REPO, "conf", name)
    with caplog.at_level(logging.WARNING, logger="magnetar.config"):
        cfg = load_config(path, environ={})
    assert cfg.unknown == {}
    assert caplog.records == []
    assert cfg.bindAddress == "127.0.0.1"
    for key in ("kafkaListeners",):
        assert all(listener.host == "127.0.0.1" for listener in cfg.listeners(key))


def test_standalone_conf_keeps_the_built_in_defaults():
    cfg = load_config(os.path.join(REPO, "conf", "standalone.conf"), environ={})
    assert cfg.as_dict() == load_config(None, environ={}).as_dict()


def test_parse_listener_forms():
    assert parse_listener("mqtt://127.0.0.1:1883") == Listener("mqtt", "127.0.0.1", 1883)
    assert parse_listener("PLAINTEXT://[::1]:9092") == Listener("PLAINTEXT", "::1", 9092)
    assert str(parse_listener("PLAINTEXT://[::1]:9092")) == "PLAINTEXT://[::1]:9092"
    assert parse_listener("amqp://:5672") == Listener("amqp", "", 5672)
    for bad in ("127.0.0.1:9092", "kafka://host", "x://h:99999", "://h:1"):
        with pytest.raises(ValueError):
            parse_listener(bad)


def test_parse_duration_units():
    assert parse_duration("30") == 30.0
    assert parse_duration("250ms") == 0.25
    assert parse_duration("1.5h") == 5400.0
    assert parse_duration(" 2d ") == 172800.0
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_config_repr_names_the_set_keys():
    cfg = load_config(None, {"clusterName": "c"}, environ={})
    assert "clusterName" in repr(cfg)
    assert isinstance(cfg, Config)


def test_a_one_bookie_standalone_says_when_it_overrides_the_quorums(caplog):
    from gateway._standalone import _standalone_config

    cfg = load_config(None, {"managedLedgerDefaultEnsembleSize": "3", "managedLedgerDefaultWriteQuorum": "2"},
                      environ={})
    with caplog.at_level(logging.WARNING):
        runtime = _standalone_config(cfg, 1)
    assert (runtime.get("managedLedgerDefaultEnsembleSize"), runtime.get("managedLedgerDefaultWriteQuorum")) == (1, 1)
    assert "managedLedgerDefaultEnsembleSize=3, managedLedgerDefaultWriteQuorum=2" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _standalone_config(load_config(None, environ={}), 1)
    assert caplog.text == ""
