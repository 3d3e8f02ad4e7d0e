"""`magnetar admin` / `magnetar client` / `magnetar completion` without a broker:
value parsing, the verb table, --help everywhere, output format, completion."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

import pytest

from gateway._admin_cli import (
    NOUNS,
    _header_properties,
    _message_id,
    _print,
    completion_script,
    parse_relative_time,
    parse_size,
    pretty_json,
)
from gateway._cli import build_parser, main


@pytest.mark.parametrize(("text", "expected"), [
    ("10G", 10 * 1024 ** 3), ("5g", 5 * 1024 ** 3), ("512M", 512 * 1024 ** 2), ("1k", 1024),
    ("100", 100), ("1T", 1024 ** 4), ("-1", -1),
])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("3d", 3 * 86400), ("10m", 600), ("1h", 3600), ("30s", 30), ("45", 45), ("1w", 7 * 86400),
    ("1y", 365 * 86400), ("-1", -1),
])
def test_parse_relative_time(text: str, expected: int) -> None:
    assert parse_relative_time(text) == expected


@pytest.mark.parametrize("bad", ["", "10X", "G", "1.5G", "ten"])
def test_bad_values(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_relative_time(bad)


def test_message_ids() -> None:
    assert _message_id("3:7") == {"ledgerId": 3, "entryId": 7}
    assert _message_id("3:7:1") == {"ledgerId": 3, "entryId": 7, "partitionIndex": 1}
    assert _message_id("earliest") == {"ledgerId": -1, "entryId": -1}
    assert _message_id("latest")["ledgerId"] == 0x7FFFFFFFFFFFFFFF
    with pytest.raises(argparse.ArgumentTypeError):
        _message_id("3-7")


def test_seed_verbs_exist() -> None:
    wanted = {
        "tenants": {"create", "update", "get", "list", "delete"},
        "namespaces": {"create", "delete", "list", "policies", "set-retention", "set-backlog-quota",
                       "set-message-ttl", "set-deduplication", "set-schema-compatibility-strategy",
                       "set-auto-topic-creation", "set-max-producers-per-topic", "set-max-consumers-per-topic",
                       "set-max-unacked-messages-per-consumer", "set-max-unacked-messages-per-subscription",
                       "set-dispatch-rate", "set-publish-rate", "grant-permission", "permissions"},
        "topics": {"create", "create-partitioned-topic", "update-partitioned-topic", "list", "delete", "lookup",
                   "partitioned-lookup", "stats", "partitioned-stats", "stats-internal", "subscriptions",
                   "create-subscription", "unsubscribe", "reset-cursor", "skip", "clear-backlog", "skip-all",
                   "expire-messages", "expire-messages-all-subscriptions", "peek-messages", "get-message-by-id",
                   "examine-message", "terminate", "unload", "set-message-ttl", "set-retention",
                   "set-backlog-quota", "set-replication-clusters"},
        "subscriptions": {"list", "create", "delete", "reset-cursor", "skip", "skip-all", "expire", "peek"},
        "schemas": {"get", "upload", "delete"},
        "brokers": {"list", "healthcheck"},
        "bookies": {"list-bookies"},
        "clusters": {"list", "get", "create"},
    }
    for noun, verbs in wanted.items():
        assert verbs <= set(NOUNS[noun]), (noun, verbs - set(NOUNS[noun]))


def test_help_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["admin", "--help"]) == 0
    assert main(["client", "produce", "--help"]) == 0
    assert main(["client", "consume", "--help"]) == 0
    for noun, verbs in NOUNS.items():
        assert main(["admin", noun, "--help"]) == 0
        for name in verbs:
            assert main(["admin", noun, name, "--help"]) == 0, (noun, name)
    capsys.readouterr()


def test_seed_flags_parse() -> None:
    parser = build_parser()
    a = parser.parse_args(["admin", "tenants", "create", "my-tenant", "--admin-roles", "my-admin-role",
                           "--allowed-clusters", "pulsar-cluster"])
    assert (a.admin_roles, a.allowed_clusters) == (["my-admin-role"], ["pulsar-cluster"])
    a = parser.parse_args(["admin", "namespaces", "set-backlog-quota", "t/n", "--limit", "5G", "--policy",
                           "producer_exception"])
    assert (a.limit, a.policy, a.type) == ("5G", "producer_exception", "destination_storage")
    a = parser.parse_args(["admin", "topics", "set-message-ttl", "persistent://t/n/x", "--messageTTL", "3600"])
    assert a.ttl == "3600"
    a = parser.parse_args(["client", "produce", "persistent://t/n/x", "--messages", "Hello Pulsar",
                           "--num-produce", "10"])
    assert (a.messages, a.num_produce) == (["Hello Pulsar"], 10)
    a = parser.parse_args(["client", "consume", "persistent://t/n/x", "--subscription-name", "s",
                           "--num-messages", "10", "-t", "Shared", "-p", "Earliest"])
    assert (a.subscription_name, a.num_messages, a.subscription_type) == ("s", 10, "Shared")


@pytest.mark.parametrize("verb", ["get-message-ttl", "get-retention", "get-backlog-quotas",
                                  "get-replication-clusters", "get-max-producers"])
def test_applied_takes_pulsar_admins_short_flag(verb: str) -> None:
    """pulsar-admin spells --applied also -ap on every topic-level get."""
    a = build_parser().parse_args(["admin", "topics", verb, "persistent://t/n/x", "-ap"])
    assert a.applied is True


def test_missing_verb_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["admin"]) == 2
    assert main(["admin", "topics"]) == 2
    assert main(["client"]) == 2
    assert main(["admin", "topics", "stats"]) == 2  # the topic is required
    capsys.readouterr()


def test_output_format(capsys: pytest.CaptureFixture[str]) -> None:
    _print(["a", "b"])
    _print({"k": 1})
    _print("ok")
    _print(None)
    assert capsys.readouterr().out == 'a\nb\n{\n  "k" : 1\n}\nok\n'


def test_message_properties_keep_their_names_from_the_json_header() -> None:
    # header names arrive lower-cased; Pulsar 3.1+'s JSON header keeps the names as sent
    both = {"x-pulsar-property": '{"Mixed-Case":"v","city=shanghai":"tag"}',
            "x-pulsar-property-mixed-case": "v"}
    assert _header_properties(both) == {"Mixed-Case": "v", "city=shanghai": "tag"}
    assert _header_properties({"x-pulsar-property-color": "red", "x-pulsar-message-id": "1:2"}) == \
        {"color": "red"}


def test_objects_print_as_pulsar_admins_jackson_printer_writes_them() -> None:
    stats = {"msgRateIn": 0.0, "msgThroughputIn": 12345678.5, "backlogSize": 3,
             "publishers": [], "subscriptions": {}, "replication": {"a": None},
             "consumers": [{"consumerName": "c", "metadata": {}}, {"unackedMessages": 1}],
             "tiny": 0.00025, "name": "naïve \"q\""}
    assert pretty_json(stats) == """{
  "msgRateIn" : 0.0,
  "msgThroughputIn" : 1.23456785E7,
  "backlogSize" : 3,
  "publishers" : [ ],
  "subscriptions" : { },
  "replication" : {
    "a" : null
  },
  "consumers" : [ {
    "consumerName" : "c",
    "metadata" : { }
  }, {
    "unackedMessages" : 1
  } ],
  "tiny" : 2.5E-4,
  "name" : "naïve \\"q\\""
}"""
    assert pretty_json(["a", 1, True]) == '[ "a", 1, true ]'
    assert pretty_json(1e7) == "1.0E7" and pretty_json(-0.001) == "-0.001" and pretty_json(9999999.0) == "9999999.0"


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.parametrize(("words", "expected"), [
    (["magnetar", "ad"], {"admin"}),
    (["magnetar", "admin", "top"], {"topics"}),
    (["magnetar", "admin", "topics", "peek"], {"peek-messages"}),
    (["magnetar", "admin", "topics", "skip", "--c"], {"--count"}),
    (["magnetar", "client", "consume", "x", "--subscription-t"], {"--subscription-type"}),
])
def test_bash_completion(words: list[str], expected: set[str]) -> None:
    script = completion_script("bash")
    quoted = " ".join(f"'{w}'" for w in words)
    probe = f'{script}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _magnetar; printf "%s\\n" "${{COMPREPLY[@]}}"'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True, timeout=30).stdout
    assert set(out.split()) == expected


def test_completion_command() -> None:
    out = subprocess.run([sys.executable, "-m", "gateway", "completion", "zsh"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.startswith("autoload") and "complete -o default -F _magnetar magnetar" in out
