"""``magnetar admin <noun> <verb>``: pulsar-admin's nouns, verbs and flags over the
admin REST API (``--admin-url``, default ``http://127.0.0.1:8080``).

Output follows pulsar-admin: lists print one item per line, objects as JSON the way its
Jackson pretty printer writes them (:func:`pretty_json`), plain values as they are, and a get of something unset as ``null``. A failed call prints the broker's ``reason`` on stderr and
exits with 1; usage errors exit with 2.

Each verb is one small function registered with :func:`verb`; its flags are declared
next to it, so ``magnetar admin <noun> <verb> --help`` documents exactly what it takes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import quote, urlencode

from ._cli import Command, register_command
from ._tokens_cli import add_auth_arguments, token_of

__all__ = ["AdminClient", "AdminError", "parse_size", "parse_relative_time", "pretty_json", "NOUNS",
           "main", "completion_script"]

DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"
REQUEST_TIMEOUT = 60.0


# --------------------------------------------------------------------------------------
# HTTP


class AdminError(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body) if self.body.strip() else None


class AdminClient:
    """A minimal client of the admin REST API (the standard library's urllib only)."""

    def __init__(self, url: str, timeout: float = REQUEST_TIMEOUT, token: str | None = None):
        self.url = url.rstrip("/")
        self.timeout = timeout
        #: Sent as ``Authorization: Bearer <token>`` (Pulsar's token authentication).
        self.token = token

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Reply:
        url = self.url + path
        if query:
            url += "?" + urlencode({k: str(v).lower() if isinstance(v, bool) else v
                                    for k, v in query.items() if v is not None})
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return Reply(resp.status, resp.read(), dict(resp.headers.items()))
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            reason = raw.decode(errors="replace")
            try:
                reason = str(json.loads(raw).get("reason", reason))
            except (ValueError, AttributeError):
                pass
            raise AdminError(exc.code, reason or exc.reason) from None
        except (urllib.error.URLError, OSError) as exc:
            raise AdminError(0, f"cannot reach {self.url}: {getattr(exc, 'reason', exc)}") from None

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query).json()

    def put(self, path: str, body: Any = None, **query: Any) -> Any:
        return self.request("PUT", path, body, query).json()

    def post(self, path: str, body: Any = None, **query: Any) -> Any:
        return self.request("POST", path, body, query).json()

    def delete(self, path: str, **query: Any) -> Any:
        return self.request("DELETE", path, query=query).json()


# --------------------------------------------------------------------------------------
# Values as pulsar-admin spells them

_SIZE = re.compile(r"^(-?\d+)([kKmMgGtT]?)$")
_TIME = re.compile(r"^(-?\d+)([smhdwy]?)$")
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3, "t": 1024 ** 4}
_TIME_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def parse_size(text: str) -> int:
    """``10G`` -> bytes (k, m, g, t: powers of 1024); ``-1`` stays -1."""
    m = _SIZE.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: e.g. 512M, 10G, -1")
    n = int(m.group(1))
    return -1 if n < 0 else n * _SIZE_UNITS[m.group(2).lower()]


def parse_relative_time(text: str) -> int:
    """``3d`` -> seconds (s, m, h, d, w, y; a bare number is seconds); ``-1`` stays -1."""
    m = _TIME.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid time {text!r}: e.g. 30s, 10m, 3h, 3d, 1w, -1")
    n = int(m.group(1))
    return -1 if n < 0 else n * _TIME_UNITS[m.group(2)]


def _message_id(text: str) -> dict[str, int]:
    if text == "latest":
        return {"ledgerId": 0x7FFFFFFFFFFFFFFF, "entryId": 0x7FFFFFFFFFFFFFFF}
    if text == "earliest":
        return {"ledgerId": -1, "entryId": -1}
    parts = text.split(":")
    try:
        if len(parts) in (2, 3):
            out = {"ledgerId": int(parts[0]), "entryId": int(parts[1])}
            if len(parts) == 3:
                out["partitionIndex"] = int(parts[2])
            return out
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"invalid message id {text!r}: ledgerId:entryId, latest or earliest")


def _topic_path(topic: str) -> str:
    from core.naming import InvalidNameError, TopicName

    try:
        t = TopicName.parse(topic)
    except InvalidNameError as exc:
        raise AdminError(0, str(exc)) from None
    return f"/admin/v2/{t.domain}/{t.tenant}/{t.namespace}/{quote(t.local_name, safe='')}"


def _ns_path(ns: str) -> str:
    if ns.count("/") != 1 or not all(ns.split("/")):
        raise AdminError(0, f"Invalid namespace name {ns!r}: expected tenant/namespace")
    return f"/admin/v2/namespaces/{ns}"


def _schema_path(topic: str) -> str:
    from core.naming import TopicName

    t = TopicName.parse(topic)
    return f"/admin/v2/schemas/{t.tenant}/{t.namespace}/{quote(t.local_name, safe='')}"


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"invalid property {text!r}: key=value")
    return key, value


# --------------------------------------------------------------------------------------
# The verb table


@dataclass
class Verb:
    name: str
    help: str
    run: Callable[[AdminClient, argparse.Namespace], Any]
    args: list[tuple[tuple[str, ...], dict[str, Any]]] = field(default_factory=list)


#: noun -> verb name -> Verb, in registration order.
NOUNS: dict[str, dict[str, Verb]] = {}
NOUN_HELP = {
    "clusters": "clusters of this instance",
    "brokers": "active brokers, health",
    "bookies": "bookies (storage servers)",
    "tenants": "tenants: admin roles and allowed clusters",
    "namespaces": "namespaces and their policies",
    "topics": "topics, their stats, subscriptions and policies",
    "subscriptions": "a topic's subscriptions (also under topics)",
    "schemas": "topic schemas",
    "amqp": "AMQP vhosts: their exchanges, queues and bindings",
    "mqtt": "MQTT sessions and retained topics",
}


def A(*flags: str, **kw: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    return flags, kw


def verb(noun: str, name: str, help: str, *args: tuple[tuple[str, ...], dict[str, Any]],
         aliases: tuple[tuple[str, str], ...] = ()) -> Callable[[Any], Any]:
    def register(fn: Callable[[AdminClient, argparse.Namespace], Any]) -> Any:
        v = Verb(name, help, fn, list(args))
        NOUNS.setdefault(noun, {})[name] = v
        for alias_noun, alias_name in aliases:
            NOUNS.setdefault(alias_noun, {})[alias_name] = v
        return fn

    return register


TOPIC = A("topic", help="topic name: persistent://tenant/namespace/topic (or a short name)")
NS = A("namespace", help="tenant/namespace")
SUB = A("-s", "--subscription", required=True, help="subscription name")
FORCE = A("-f", "--force", action="store_true", help="also when clients are connected")

# -- clusters ---------------------------------------------------------------------------------


@verb("clusters", "list", "list clusters")
def _clusters_list(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get("/admin/v2/clusters")


@verb("clusters", "get", "get a cluster's data", A("cluster"))
def _clusters_get(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(f"/admin/v2/clusters/{a.cluster}")


def _cluster_data(a: argparse.Namespace) -> dict[str, Any]:
    data = {"serviceUrl": a.url, "brokerServiceUrl": a.broker_url,
            "serviceUrlTls": a.url_secure, "brokerServiceUrlTls": a.broker_url_secure}
    return {k: v for k, v in data.items() if v}


_CLUSTER_ARGS = (A("cluster"), A("--url", help="web service URL"), A("--broker-url", help="broker service URL"),
                 A("--url-secure", help="TLS web service URL"), A("--broker-url-secure", help="TLS broker URL"))


@verb("clusters", "create", "create a cluster", *_CLUSTER_ARGS)
def _clusters_create(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.put(f"/admin/v2/clusters/{a.cluster}", _cluster_data(a))


@verb("clusters", "update", "update a cluster", *_CLUSTER_ARGS)
def _clusters_update(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.post(f"/admin/v2/clusters/{a.cluster}", _cluster_data(a))


@verb("clusters", "delete", "delete a cluster", A("cluster"))
def _clusters_delete(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.delete(f"/admin/v2/clusters/{a.cluster}")


# -- brokers ----------------------------------------------------------------------------------


@verb("brokers", "list", "list the active brokers of a cluster", A("cluster", nargs="?"))
def _brokers_list(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(f"/admin/v2/brokers/{a.cluster}" if a.cluster else "/admin/v2/brokers")


@verb("brokers", "healthcheck", "run the broker health check", A("--topic-version", help="ignored (V1/V2)"))
def _brokers_health(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.request("GET", "/admin/v2/brokers/health").body.decode()


@verb("brokers", "version", "the broker's version")
def _brokers_version(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.request("GET", "/admin/v2/brokers/version").body.decode()


@verb("brokers", "leader-broker", "the leader broker")
def _brokers_leader(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get("/admin/v2/brokers/leaderBroker")


@verb("brokers", "namespaces", "namespaces owned by a broker", A("cluster"), A("--url", required=True))
def _brokers_namespaces(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(f"/admin/v2/brokers/{a.cluster}/{a.url}/ownedNamespaces")


_CONFIG = "/admin/v2/brokers/configuration"
CONFIG_NAME = A("-c", "--config", required=True, help="service-configuration name")


def _key_lines(values: dict[str, Any]) -> list[str]:
    """A map as pulsar-admin prints one: a ``key    value`` line per entry."""
    return [f"{k}    {v}" for k, v in sorted(values.items())]


@verb("brokers", "update-dynamic-config", "update a dynamic configuration key of the broker",
      CONFIG_NAME, A("-v", "--value", required=True, help="service-configuration value"))
def _brokers_update_config(c: AdminClient, a: argparse.Namespace) -> Any:
    c.post(f"{_CONFIG}/{quote(a.config, safe='')}/{quote(a.value, safe='')}")


@verb("brokers", "delete-dynamic-config", "take a dynamic configuration key back to its static value",
      CONFIG_NAME)
def _brokers_delete_config(c: AdminClient, a: argparse.Namespace) -> Any:
    c.delete(f"{_CONFIG}/{quote(a.config, safe='')}")


@verb("brokers", "list-dynamic-config", "the configuration keys that can be updated at runtime")
def _brokers_list_config(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_CONFIG)


@verb("brokers", "get-all-dynamic-config", "the dynamic configuration values set at runtime")
def _brokers_all_config(c: AdminClient, a: argparse.Namespace) -> Any:
    return _key_lines(c.get(f"{_CONFIG}/values"))


@verb("brokers", "get-runtime-config", "every configuration key's value in effect")
def _brokers_runtime_config(c: AdminClient, a: argparse.Namespace) -> Any:
    return _key_lines(c.get(f"{_CONFIG}/runtime"))


@verb("brokers", "get-internal-config", "the broker's internal configuration (its metadata stores)")
def _brokers_internal_config(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get("/admin/v2/brokers/internal-configuration")


@verb("brokers", "backlog-quota-check", "run the backlog quota check now")
def _brokers_backlog_quota_check(c: AdminClient, a: argparse.Namespace) -> Any:
    c.request("GET", "/admin/v2/brokers/backlog-quota-check")
    return "ok"


# -- bookies ----------------------------------------------------------------------------------


@verb("bookies", "list-bookies", "list bookies (read-write and read-only)",
      A("-rw", "--rw", action="store_true", help="read-write bookies only"),
      A("-ro", "--ro", action="store_true", help="read-only bookies only"),
      aliases=(("bookies", "list"),))
def _bookies_list(c: AdminClient, a: argparse.Namespace) -> Any:
    if a.rw or a.ro:
        state = c.get("/admin/v2/bookies/state")
        return (state["readWrite"] if a.rw else []) + (state["readOnly"] if a.ro else [])
    return c.get("/admin/v2/bookies/all")


@verb("bookies", "racks-placement", "bookie rack placement")
def _bookies_racks(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get("/admin/v2/bookies/racks-info")


# -- amqp -------------------------------------------------------------------------------------

VHOST = A("-v", "--vhost", default="/", help="the vhost (default: /)")


@verb("amqp", "vhosts", "list the AMQP vhosts that hold declarations")
def _amqp_vhosts(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get("/admin/v2/amqp/vhosts")


@verb("amqp", "exchanges", "list a vhost's exchanges", VHOST)
def _amqp_exchanges(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(f"/admin/v2/amqp/vhosts/{quote(a.vhost, safe='')}/exchanges")


@verb("amqp", "queues", "list a vhost's queues: messages ready, unacknowledged, consumers", VHOST)
def _amqp_queues(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(f"/admin/v2/amqp/vhosts/{quote(a.vhost, safe='')}/queues")


@verb("amqp", "bindings", "list a vhost's bindings", VHOST)
def _amqp_bindings(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(f"/admin/v2/amqp/vhosts/{quote(a.vhost, safe='')}/bindings")


# -- mqtt -------------------------------------------------------------------------------------


@verb("mqtt", "sessions", "list MQTT sessions: connected, persistent, expiry, subscriptions, "
      "messages queued offline")
def _mqtt_sessions(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get("/admin/v2/mqtt/sessions")


@verb("mqtt", "retained", "list the MQTT topics with a retained message, and its size")
def _mqtt_retained(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get("/admin/v2/mqtt/retained")


# -- tenants ----------------------------------------------------------------------------------

_TENANT_ARGS = (A("tenant"),
                A("-r", "--admin-roles", type=_csv, default=[], help="comma-separated admin roles"),
                A("-c", "--allowed-clusters", type=_csv, default=[], help="comma-separated cluster names"))


@verb("tenants", "list", "list tenants")
def _tenants_list(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get("/admin/v2/tenants")


@verb("tenants", "get", "get a tenant's admin roles and allowed clusters", A("tenant"))
def _tenants_get(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(f"/admin/v2/tenants/{a.tenant}")


@verb("tenants", "create", "create a tenant (allowed in every cluster unless --allowed-clusters)",
      *_TENANT_ARGS)
def _tenants_create(c: AdminClient, a: argparse.Namespace) -> Any:
    # As pulsar-admin: no --allowed-clusters means every cluster there is.
    clusters = a.allowed_clusters or c.get("/admin/v2/clusters")
    return c.put(f"/admin/v2/tenants/{a.tenant}", {"adminRoles": a.admin_roles, "allowedClusters": clusters})


@verb("tenants", "update", "update a tenant", *_TENANT_ARGS)
def _tenants_update(c: AdminClient, a: argparse.Namespace) -> Any:
    current = c.get(f"/admin/v2/tenants/{a.tenant}") or {}
    return c.post(f"/admin/v2/tenants/{a.tenant}", {
        "adminRoles": a.admin_roles or current.get("adminRoles", []),
        "allowedClusters": a.allowed_clusters or current.get("allowedClusters", [])})


@verb("tenants", "delete", "delete a tenant", A("tenant"), FORCE)
def _tenants_delete(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.delete(f"/admin/v2/tenants/{a.tenant}", force=a.force or None)


# -- namespaces -------------------------------------------------------------------------------


@verb("namespaces", "list", "list a tenant's namespaces", A("tenant"))
def _ns_list(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(f"/admin/v2/namespaces/{a.tenant}")


@verb("namespaces", "create", "create a namespace", NS,
      A("-c", "--clusters", type=_csv, help="replication clusters"),
      A("-b", "--bundles", type=int, help="number of bundles (accepted; one bundle is used)"))
def _ns_create(c: AdminClient, a: argparse.Namespace) -> Any:
    body = {"replication_clusters": a.clusters} if a.clusters else None
    return c.put(_ns_path(a.namespace), body)


@verb("namespaces", "delete", "delete a namespace", NS, FORCE)
def _ns_delete(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.delete(_ns_path(a.namespace), force=a.force or None)


@verb("namespaces", "policies", "a namespace's policies", NS)
def _ns_policies(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_ns_path(a.namespace))


@verb("namespaces", "topics", "a namespace's topics", NS)
def _ns_topics(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_ns_path(a.namespace) + "/topics")


@verb("namespaces", "unload", "unload a namespace's topics", NS)
def _ns_unload(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.put(_ns_path(a.namespace) + "/unload")


@verb("namespaces", "clear-backlog", "clear the backlog of every (or one) subscription", NS,
      A("-s", "--sub", help="only this subscription"), A("-force", "--force", action="store_true"))
def _ns_clear_backlog(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.post(_ns_path(a.namespace) + "/clearBacklog" + (f"/{quote(a.sub, safe='')}" if a.sub else ""))


@verb("namespaces", "unsubscribe", "delete a subscription on every topic", NS, A("-s", "--sub", required=True))
def _ns_unsubscribe(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.post(_ns_path(a.namespace) + f"/unsubscribe/{quote(a.sub, safe='')}")


def _permission_verbs(noun: str, target: tuple[tuple[str, ...], dict[str, Any]], path_of: Callable[[argparse.Namespace], str]) -> None:
    """``permissions``, ``grant-permission`` and ``revoke-permission`` of ``noun``
    (namespaces, topics), on the resource whose path ``path_of`` gives."""

    @verb(noun, "permissions", "roles and their actions", target)
    def _permissions(c: AdminClient, a: argparse.Namespace) -> Any:
        return c.get(path_of(a) + "/permissions")

    @verb(noun, "grant-permission", "grant actions to a role", target, A("--role", required=True),
          A("--actions", type=_csv, required=True, help="produce,consume,..."))
    def _grant(c: AdminClient, a: argparse.Namespace) -> Any:
        return c.post(path_of(a) + f"/permissions/{quote(a.role, safe='')}", a.actions)

    @verb(noun, "revoke-permission", "revoke a role's actions", target, A("--role", required=True))
    def _revoke(c: AdminClient, a: argparse.Namespace) -> Any:
        return c.delete(path_of(a) + f"/permissions/{quote(a.role, safe='')}")


_permission_verbs("namespaces", NS, lambda a: _ns_path(a.namespace))


@verb("namespaces", "grant-subscription-permission", "let only these roles consume with a subscription",
      NS, A("--subscription", required=True), A("--roles", type=_csv, required=True, help="role1,role2"))
def _ns_grant_subscription(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.post(_ns_path(a.namespace) + f"/permissions/subscription/{quote(a.subscription, safe='')}",
                  a.roles)


@verb("namespaces", "revoke-subscription-permission", "revoke a role's use of a subscription", NS,
      A("--subscription", required=True), A("--role", required=True))
def _ns_revoke_subscription(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.delete(_ns_path(a.namespace) + f"/permissions/{quote(a.subscription, safe='')}/"
                    f"{quote(a.role, safe='')}")


@verb("namespaces", "set-subscription-auth-mode", "require subscription names prefixed by the role (Prefix)",
      NS, A("-m", "--subscription-auth-mode", required=True, choices=["None", "Prefix"]))
def _ns_set_subscription_auth_mode(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.post(_ns_path(a.namespace) + "/subscriptionAuthMode", a.subscription_auth_mode)


@verb("namespaces", "get-subscription-auth-mode", "the subscription auth mode", NS)
def _ns_get_subscription_auth_mode(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_ns_path(a.namespace) + "/subscriptionAuthMode")


@verb("namespaces", "set-clusters", "set replication clusters", NS, A("-c", "--clusters", type=_csv, required=True))
def _ns_set_clusters(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.post(_ns_path(a.namespace) + "/replication", a.clusters)


@verb("namespaces", "get-clusters", "replication clusters", NS)
def _ns_get_clusters(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_ns_path(a.namespace) + "/replication")


@verb("namespaces", "set-property", "set a property of the namespace", NS,
      A("-k", "--key", required=True), A("-v", "--value", required=True))
def _ns_set_property(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.put(_ns_path(a.namespace) + f"/property/{quote(a.key, safe='')}/{quote(a.value, safe='')}")


def _property_text(reply: Reply) -> str | None:
    """A single property's value, which the broker answers as plain text (None: unset)."""
    return reply.body.decode() if reply.status != 204 else None


@verb("namespaces", "get-property", "a property of the namespace", NS, A("-k", "--key", required=True))
def _ns_get_property(c: AdminClient, a: argparse.Namespace) -> Any:
    return _property_text(c.request("GET", _ns_path(a.namespace) + f"/property/{quote(a.key, safe='')}"))


@verb("namespaces", "remove-property", "remove a property of the namespace (prints its value)", NS,
      A("-k", "--key", required=True))
def _ns_remove_property(c: AdminClient, a: argparse.Namespace) -> Any:
    # as pulsar-admin: prints the value removed, null when there was none
    value = _property_text(c.request("DELETE", _ns_path(a.namespace) + f"/property/{quote(a.key, safe='')}"))
    return "null" if value is None else value


def _key_values(text: str) -> list[tuple[str, str]]:
    """``a=1,b=2`` as pulsar-admin's map options take it."""
    return [_key_value(part) for part in text.split(",") if part]


@verb("namespaces", "set-properties", "set properties of the namespace", NS,
      A("-p", "--properties", dest="properties", type=_key_values, action="append", required=True,
        help="key=value[,key=value...] (repeat for more)"))
def _ns_set_properties(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.put(_ns_path(a.namespace) + "/properties", dict(kv for group in a.properties for kv in group))


@verb("namespaces", "get-properties", "the namespace's properties", NS)
def _ns_get_properties(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_ns_path(a.namespace) + "/properties")


@verb("namespaces", "clear-properties", "remove every property of the namespace", NS)
def _ns_clear_properties(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.delete(_ns_path(a.namespace) + "/properties")


def _enabled(a: argparse.Namespace) -> bool:
    """The value of a ``--enable``/``--disable`` pair, exactly one of which is given."""
    if a.enable == a.disable:
        raise AdminError(0, "Need to specify either --enable or --disable")
    return bool(a.enable)


# Policies that a namespace and a topic both carry: (noun, path) is the scope.

def _scope(noun: str, a: argparse.Namespace) -> str:
    return _ns_path(a.namespace) if noun == "namespaces" else _topic_path(a.topic)


def _policy_verbs(noun: str) -> None:
    target = NS if noun == "namespaces" else TOPIC
    applied = (A("-ap", "--applied", action="store_true",
                 help="the effective value (the topic's, else its namespace's, else the broker's)"),) \
        if noun == "topics" else ()

    def getter(suffix: str) -> Callable[[AdminClient, argparse.Namespace], Any]:
        def run(c: AdminClient, a: argparse.Namespace) -> Any:
            q = {"applied": True} if getattr(a, "applied", False) else {}
            return c.get(_scope(noun, a) + "/" + suffix, **q)
        return run

    def remover(suffix: str) -> Callable[[AdminClient, argparse.Namespace], Any]:
        def run(c: AdminClient, a: argparse.Namespace) -> Any:
            return c.delete(_scope(noun, a) + "/" + suffix)
        return run

    def simple(name: str, suffix: str, what: str) -> None:
        verb(noun, f"get-{name}", f"get the {what}", target, *applied)(getter(suffix))
        verb(noun, f"remove-{name}", f"remove the {what}", target)(remover(suffix))

    def value_setter(suffix: str) -> Callable[[AdminClient, argparse.Namespace], Any]:
        """A setter that posts the ``value`` argument."""
        def run(c: AdminClient, a: argparse.Namespace) -> Any:
            return c.post(_scope(noun, a) + "/" + suffix, a.value)
        return run

    # retention
    @verb(noun, "set-retention", "set the retention policy", target,
          A("-s", "--size", required=True, help="retention size, e.g. 10G; -1 unlimited"),
          A("-t", "--time", required=True, help="retention time, e.g. 3d, 10h; -1 forever"))
    def set_retention(c: AdminClient, a: argparse.Namespace) -> Any:
        size = parse_size(a.size)
        secs = parse_relative_time(a.time)
        body = {"retentionSizeInMB": -1 if size < 0 else size // (1024 * 1024),
                "retentionTimeInMinutes": -1 if secs < 0 else secs // 60}
        return c.post(_scope(noun, a) + "/retention", body)

    simple("retention", "retention", "retention policy")

    # message TTL
    ttl_flags = ("-ttl", "--messageTTL") if noun == "namespaces" else ("-t", "--ttl", "--messageTTL")

    @verb(noun, "set-message-ttl", "set the message TTL", target,
          A(*ttl_flags, dest="ttl", required=True, help="TTL in seconds (or 1h, 3d, ...)"))
    def set_ttl(c: AdminClient, a: argparse.Namespace) -> Any:
        ttl = parse_relative_time(a.ttl)
        if noun == "namespaces":
            return c.post(_scope(noun, a) + "/messageTTL", ttl)
        return c.post(_scope(noun, a) + "/messageTTL", messageTTL=ttl)

    simple("message-ttl", "messageTTL", "message TTL")

    # backlog quota
    @verb(noun, "set-backlog-quota", "set a backlog quota", target,
          A("-l", "--limit", help="size limit, e.g. 5G"),
          A("-lt", "--limitTime", dest="limit_time", help="age limit, e.g. 1h"),
          A("-p", "--policy", required=True,
            choices=["producer_request_hold", "producer_exception", "consumer_backlog_eviction"]),
          A("-t", "--type", default="destination_storage", choices=["destination_storage", "message_age"]))
    def set_quota(c: AdminClient, a: argparse.Namespace) -> Any:
        body: dict[str, Any] = {"policy": a.policy}
        if a.limit is not None:
            body["limitSize"] = parse_size(a.limit)
        if a.limit_time is not None:
            body["limitTime"] = parse_relative_time(a.limit_time)
        return c.post(_scope(noun, a) + "/backlogQuota", body, backlogQuotaType=a.type)

    verb(noun, "get-backlog-quotas", "get the backlog quotas", target, *applied)(getter("backlogQuotaMap"))

    @verb(noun, "remove-backlog-quota", "remove a backlog quota", target,
          A("-t", "--type", default="destination_storage", choices=["destination_storage", "message_age"]))
    def remove_quota(c: AdminClient, a: argparse.Namespace) -> Any:
        return c.delete(_scope(noun, a) + "/backlogQuota", backlogQuotaType=a.type)

    # deduplication
    dedup_suffix = "deduplication" if noun == "namespaces" else "deduplicationEnabled"

    @verb(noun, "set-deduplication", "enable or disable deduplication", target,
          A("-e", "--enable", action="store_true"), A("-d", "--disable", action="store_true"))
    def set_dedup(c: AdminClient, a: argparse.Namespace) -> Any:
        return c.post(_scope(noun, a) + "/" + dedup_suffix, _enabled(a))

    simple("deduplication", dedup_suffix, "deduplication setting")

    # max producers / consumers
    for what, flag, short in (("producers", "--max-producers", "-p"), ("consumers", "--max-consumers", "-c")):
        ns_suffix = f"max{what.capitalize()}PerTopic"
        suffix = ns_suffix if noun == "namespaces" else f"max{what.capitalize()}"
        name = f"max-{what}-per-topic" if noun == "namespaces" else f"max-{what}"
        flags = (short, f"{flag}-per-topic") if noun == "namespaces" else (short, flag)

        verb(noun, f"set-{name}", f"set the maximum {what} per topic", target,
             A(*flags, dest="value", type=int, required=True))(value_setter(suffix))
        simple(name, suffix, f"maximum {what} per topic")

    @verb(noun, "set-persistence", "set the replication of new ledgers and the mark-delete rate",
          target, A("-e", "--bookkeeper-ensemble", type=int, required=True),
          A("-w", "--bookkeeper-write-quorum", type=int, required=True),
          A("-a", "--bookkeeper-ack-quorum", type=int, required=True),
          A("-r", "--ml-mark-delete-max-rate", type=float, default=0.0))
    def set_persistence(c: AdminClient, a: argparse.Namespace) -> Any:
        return c.post(_scope(noun, a) + "/persistence", {
            "bookkeeperEnsemble": a.bookkeeper_ensemble, "bookkeeperWriteQuorum": a.bookkeeper_write_quorum,
            "bookkeeperAckQuorum": a.bookkeeper_ack_quorum,
            "managedLedgerMaxMarkDeleteRate": a.ml_mark_delete_max_rate})

    simple("persistence", "persistence", "persistence policy")

    @verb(noun, "set-subscription-types-enabled", "set the subscription types consumers may use",
          target, A("-t", "--types", required=True,
                    help="comma-separated: Exclusive, Shared, Failover, Key_Shared"))
    def set_sub_types(c: AdminClient, a: argparse.Namespace) -> Any:
        types = [t.strip() for t in a.types.split(",") if t.strip()]
        return c.post(_scope(noun, a) + "/subscriptionTypesEnabled", types)

    simple("subscription-types-enabled", "subscriptionTypesEnabled", "subscription types enabled")

    verb(noun, "set-subscription-expiration-time",
         "set the minutes an unused subscription is kept (0 keeps them)", target,
         A("-t", "--time", dest="value", type=int, required=True,
           help="minutes"))(value_setter("subscriptionExpirationTime"))
    simple("subscription-expiration-time", "subscriptionExpirationTime", "subscription expiration time")

    verb(noun, "set-compaction-threshold",
         "set the backlog past the last compaction that starts one (0: never automatically)",
         target, A("-t", "--threshold", dest="value", type=parse_size, required=True,
                   help="bytes, e.g. 10M, 16G, 3T; 0 disables automatic compaction"),
         )(value_setter("compactionThreshold"))
    simple("compaction-threshold", "compactionThreshold", "compaction threshold")

    @verb(noun, "set-inactive-topic-policies", "set when an inactive topic is deleted", target,
          A("-e", "--enable-delete-while-inactive", dest="enable", action="store_true"),
          A("-d", "--disable-delete-while-inactive", dest="disable", action="store_true"),
          A("-t", "--max-inactive-duration", required=True, help="e.g. 1s, 10m, 5h, 3d"),
          A("-m", "--delete-mode", required=True,
            choices=["delete_when_no_subscriptions", "delete_when_subscriptions_caught_up"]))
    def set_inactive(c: AdminClient, a: argparse.Namespace) -> Any:
        if a.enable == a.disable:
            raise AdminError(0, "Need to specify either enable-delete-while-inactive or "
                                "disable-delete-while-inactive")
        return c.post(_scope(noun, a) + "/inactiveTopicPolicies", {
            "inactiveTopicDeleteMode": a.delete_mode,
            "maxInactiveDurationSeconds": parse_relative_time(a.max_inactive_duration),
            "deleteWhileInactive": bool(a.enable)})

    simple("inactive-topic-policies", "inactiveTopicPolicies", "inactive topic policies")

    # subscriptions per topic and consumers per subscription (the same names and flags on
    # both scopes)
    for name, suffix, flags, what in (
            ("max-subscriptions-per-topic", "maxSubscriptionsPerTopic",
             ("-m", "--max-subscriptions-per-topic"), "maximum subscriptions per topic"),
            ("max-consumers-per-subscription", "maxConsumersPerSubscription",
             ("-c", "--max-consumers-per-subscription"), "maximum consumers per subscription")):
        verb(noun, f"set-{name}", f"set the {what}", target,
             A(*flags, dest="value", type=int, required=True))(value_setter(suffix))
        simple(name, suffix, what)

    # unacknowledged-message limits (pulsar-admin's flags differ between the scopes)
    for what, ns_flag, ns_short in (("consumer", "--maxUnackedMessagesPerConsumer", "-c"),
                                    ("subscription", "--maxUnackedMessagesPerSubscription", "-m")):
        unacked_suffix = (f"maxUnackedMessagesPer{what.capitalize()}" if noun == "namespaces"
                          else f"maxUnackedMessagesOn{what.capitalize()}")
        unacked_flags = (ns_short, ns_flag) if noun == "namespaces" else ("-m", "--maxNum")
        verb(noun, f"set-max-unacked-messages-per-{what}",
             f"set the maximum unacknowledged messages per {what}", target,
             A(*unacked_flags, dest="value", type=int, required=True))(value_setter(unacked_suffix))
        simple(f"max-unacked-messages-per-{what}", unacked_suffix,
               f"maximum unacknowledged messages per {what}")

    # dispatch rates (of the topic, and of each subscription) and the publish rate
    for name, suffix, what in (("dispatch-rate", "dispatchRate", "dispatch rate"),
                               ("subscription-dispatch-rate", "subscriptionDispatchRate",
                                "dispatch rate of each subscription")):
        def set_dispatch(c: AdminClient, a: argparse.Namespace, suffix: str = suffix) -> Any:
            return c.post(_scope(noun, a) + "/" + suffix, {
                "dispatchThrottlingRateInMsg": a.msg_dispatch_rate,
                "dispatchThrottlingRateInByte": a.byte_dispatch_rate,
                "ratePeriodInSecond": a.dispatch_rate_period,
                "relativeToPublishRate": a.relative_to_publish_rate})

        verb(noun, f"set-{name}", f"set the {what}", target,
             A("-md", "--msg-dispatch-rate", type=int, default=-1),
             A("-bd", "--byte-dispatch-rate", type=int, default=-1),
             A("-dt", "--dispatch-rate-period", type=int, default=1),
             A("-rp", "--relative-to-publish-rate", action="store_true"))(set_dispatch)
        simple(name, suffix, what)

    @verb(noun, "set-publish-rate", "set the publish rate", target,
          A("-m", "--msg-publish-rate", type=int, default=-1), A("-b", "--byte-publish-rate", type=int, default=-1))
    def set_publish(c: AdminClient, a: argparse.Namespace) -> Any:
        return c.post(_scope(noun, a) + "/publishRate", {
            "publishThrottlingRateInMsg": a.msg_publish_rate, "publishThrottlingRateInByte": a.byte_publish_rate})

    simple("publish-rate", "publishRate", "publish rate")

    # delayed delivery: pulsar-admin's times are relative (1s, 10m, 3d), sent in ms
    @verb(noun, "set-delayed-delivery", "enable or disable delayed delivery", target,
          A("-e", "--enable", action="store_true"), A("-d", "--disable", action="store_true"),
          A("-t", "--time", default="1s",
            help="tick time of the delay tracker, e.g. 1s, 10s, 1m (default 1s)"),
          A("-md", "--maxDelay", dest="max_delay", default="0",
            help="the longest delay a message may ask for, e.g. 1h, 3d (default 0: no limit)"))
    def set_delayed(c: AdminClient, a: argparse.Namespace) -> Any:
        return c.post(_scope(noun, a) + "/delayedDelivery", {
            "active": _enabled(a), "tickTime": parse_relative_time(a.time) * 1000,
            "maxDeliveryDelayInMillis": parse_relative_time(a.max_delay) * 1000})

    simple("delayed-delivery", "delayedDelivery", "delayed delivery policy")

    if noun == "topics":
        verb(noun, "set-max-message-size", "set the largest message the topic takes", target,
             A("-m", "--max-message-size", dest="value", type=int, required=True,
               help="bytes"))(value_setter("maxMessageSize"))
        simple("max-message-size", "maxMessageSize", "maximum message size")

    if noun != "namespaces":
        return
    # policies pulsar-admin sets on a namespace only
    verb(noun, "set-max-topics-per-namespace", "set the maximum topics in a namespace", target,
         A("-t", "--max-topics-per-namespace", dest="value", type=int,
           required=True))(value_setter("maxTopicsPerNamespace"))
    simple("max-topics-per-namespace", "maxTopicsPerNamespace", "maximum topics in a namespace")

    @verb(noun, "set-auto-subscription-creation",
          "override auto subscription creation (disabled unless --enable)", target,
          A("-e", "--enable", action="store_true"))
    def set_auto_sub(c: AdminClient, a: argparse.Namespace) -> Any:
        return c.post(_scope(noun, a) + "/autoSubscriptionCreation",
                      {"allowAutoSubscriptionCreation": bool(a.enable)})

    simple("auto-subscription-creation", "autoSubscriptionCreation",
           "auto subscription creation override")

    for name, suffix, what in (
            ("schema-validation-enforce", "schemaValidationEnforced", "schema validation enforcement"),
            ("is-allow-auto-update-schema", "isAllowAutoUpdateSchema", "auto update of schemas"),
            ("encryption-required", "encryptionRequired", "required message encryption")):
        def set_flag(c: AdminClient, a: argparse.Namespace, suffix: str = suffix) -> Any:
            return c.post(_scope(noun, a) + "/" + suffix, _enabled(a))

        verb(noun, f"set-{name}", f"enable or disable {what}", target,
             A("-e", "--enable", action="store_true"), A("-d", "--disable", action="store_true"))(set_flag)
        verb(noun, f"get-{name}", f"whether {what} is on", target)(getter(suffix))


_policy_verbs("namespaces")


@verb("namespaces", "set-schema-compatibility-strategy", "set the schema compatibility strategy", NS,
      A("-c", "--compatibility", required=True, help="e.g. FULL, BACKWARD, FORWARD_TRANSITIVE"))
def _ns_set_strategy(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.put(_ns_path(a.namespace) + "/schemaCompatibilityStrategy", a.compatibility.upper())


@verb("namespaces", "get-schema-compatibility-strategy", "the schema compatibility strategy", NS)
def _ns_get_strategy(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_ns_path(a.namespace) + "/schemaCompatibilityStrategy")


@verb("namespaces", "set-auto-topic-creation", "override auto topic creation", NS,
      A("-e", "--enable", action="store_true"), A("-d", "--disable", action="store_true"),
      A("-t", "--type", default="non-partitioned", choices=["partitioned", "non-partitioned"]),
      A("-n", "--num-partitions", type=int))
def _ns_set_auto(c: AdminClient, a: argparse.Namespace) -> Any:
    body: dict[str, Any] = {"allowAutoTopicCreation": _enabled(a), "topicType": a.type}
    if a.num_partitions is not None:
        body["defaultNumPartitions"] = a.num_partitions
    return c.post(_ns_path(a.namespace) + "/autoTopicCreation", body)


@verb("namespaces", "get-auto-topic-creation", "the auto topic creation override", NS)
def _ns_get_auto(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_ns_path(a.namespace) + "/autoTopicCreation")


@verb("namespaces", "remove-auto-topic-creation", "remove the auto topic creation override", NS)
def _ns_remove_auto(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.delete(_ns_path(a.namespace) + "/autoTopicCreation")


# -- topics ------------------------------------------------------------------------------------


@verb("topics", "list", "list a namespace's topics (persistent and non-persistent)", NS)
def _topics_list(c: AdminClient, a: argparse.Namespace) -> Any:
    _ns_path(a.namespace)
    return c.get(f"/admin/v2/persistent/{a.namespace}") + c.get(f"/admin/v2/non-persistent/{a.namespace}")


@verb("topics", "list-partitioned-topics",
      "list a namespace's partitioned topics (persistent and non-persistent)", NS)
def _topics_list_partitioned(c: AdminClient, a: argparse.Namespace) -> Any:
    return (c.get(f"/admin/v2/persistent/{a.namespace}/partitioned")
            + c.get(f"/admin/v2/non-persistent/{a.namespace}/partitioned"))


METADATA = A("-m", "--metadata", type=_key_value, action="append", default=[],
             help="a property of the topic, key=value (repeat for more)")


@verb("topics", "create", "create a non-partitioned topic", TOPIC, METADATA)
def _topics_create(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.put(_topic_path(a.topic), dict(a.metadata))


@verb("topics", "create-partitioned-topic", "create a partitioned topic", TOPIC,
      A("-p", "--partitions", type=int, required=True), METADATA)
def _topics_create_partitioned(c: AdminClient, a: argparse.Namespace) -> Any:
    # as pulsar-admin: the count alone, or PartitionedTopicMetadata when there are properties
    body = {"partitions": a.partitions, "properties": dict(a.metadata)} if a.metadata else a.partitions
    return c.put(_topic_path(a.topic) + "/partitions", body)


@verb("topics", "get-properties", "the topic's properties", TOPIC)
def _topics_get_properties(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_topic_path(a.topic) + "/properties")


@verb("topics", "update-properties", "add or replace properties of the topic", TOPIC,
      A("-p", "--property", dest="properties", type=_key_value, action="append", default=[],
        help="key=value (repeat for more)"))
def _topics_update_properties(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.put(_topic_path(a.topic) + "/properties", dict(a.properties))


@verb("topics", "remove-properties", "remove a property of the topic", TOPIC,
      A("-k", "--key", required=True, help="the property to remove"))
def _topics_remove_properties(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.delete(_topic_path(a.topic) + "/properties", key=a.key)


@verb("topics", "create-missed-partitions", "create the partitions of a partitioned topic that do not exist",
      TOPIC)
def _topics_create_missed(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.post(_topic_path(a.topic) + "/createMissedPartitions")


@verb("topics", "update-partitioned-topic", "raise a partitioned topic's partition count", TOPIC,
      A("-p", "--partitions", type=int, required=True))
def _topics_update_partitioned(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.post(_topic_path(a.topic) + "/partitions", a.partitions)


@verb("topics", "get-partitioned-topic-metadata", "a topic's partition count", TOPIC)
def _topics_partition_md(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_topic_path(a.topic) + "/partitions")


@verb("topics", "delete", "delete a topic", TOPIC, FORCE)
def _topics_delete(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.delete(_topic_path(a.topic), force=a.force or None)


@verb("topics", "delete-partitioned-topic", "delete a partitioned topic", TOPIC, FORCE)
def _topics_delete_partitioned(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.delete(_topic_path(a.topic) + "/partitions", force=a.force or None)


@verb("topics", "lookup", "the broker serving a topic", TOPIC)
def _topics_lookup(c: AdminClient, a: argparse.Namespace) -> Any:
    from core.naming import TopicName

    t = TopicName.parse(a.topic)
    data = c.get(f"/lookup/v2/topic/{t.domain}/{t.tenant}/{t.namespace}/{quote(t.local_name, safe='')}")
    return data.get("brokerUrl") if isinstance(data, dict) else data


@verb("topics", "partitioned-lookup", "the broker serving each partition", TOPIC)
def _topics_partitioned_lookup(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_topic_path(a.topic) + "/lookup/partitions")


_STATS_ARGS = (
    A("-gpb", "--get-precise-backlog", action="store_true", help="accepted: backlogs are always precise"),
    A("-sbs", "--get-subscription-backlog-size", action="store_true",
      help="accepted: each subscription's backlogSize is always given"),
    A("-etb", "--get-earliest-time-in-backlog", action="store_true",
      help="give the publish time of the oldest message each subscription holds"))


def _stats_query(a: argparse.Namespace) -> dict[str, Any]:
    return {"getPreciseBacklog": a.get_precise_backlog, "subscriptionBacklogSize": a.get_subscription_backlog_size,
            "getEarliestTimeInBacklog": a.get_earliest_time_in_backlog}


_permission_verbs("topics", TOPIC, lambda a: _topic_path(a.topic))


@verb("topics", "stats", "a topic's stats", TOPIC, *_STATS_ARGS)
def _topics_stats(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_topic_path(a.topic) + "/stats", **_stats_query(a))


@verb("topics", "partitioned-stats", "a partitioned topic's stats", TOPIC,
      A("--per-partition", action="store_true", help="include each partition's stats"), *_STATS_ARGS)
def _topics_partitioned_stats(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_topic_path(a.topic) + "/partitioned-stats", perPartition=a.per_partition, **_stats_query(a))


@verb("topics", "stats-internal", "a topic's internal (storage) stats", TOPIC)
def _topics_stats_internal(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_topic_path(a.topic) + "/internalStats")


@verb("topics", "partitioned-stats-internal", "each partition's internal (storage) stats", TOPIC)
def _topics_partitioned_stats_internal(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_topic_path(a.topic) + "/partitioned-internalStats")


@verb("topics", "last-message-id", "the last message's id", TOPIC)
def _topics_last_id(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_topic_path(a.topic) + "/lastMessageId")


def _epoch_ms_of(text: str) -> int:
    """An ISO 8601 date-time with its offset (as pulsar-admin's ``-d`` takes it, e.g.
    2021-06-28T16:53:08Z) as epoch milliseconds."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"invalid datetime {text!r}: ISO 8601 with an offset, e.g. 2021-06-28T16:53:08Z")
    return (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


@verb("topics", "get-message-id", "the id of the first message published at or after a time", TOPIC,
      A("-d", "--datetime", dest="timestamp", type=_epoch_ms_of, required=True,
        help="ISO 8601 with an offset, e.g. 2021-06-28T16:53:08Z or 2021-06-28T16:53:08.123+08:00"))
def _topics_message_id(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_topic_path(a.topic) + f"/messageid/{a.timestamp}")


@verb("topics", "get-backlog-size", "the bytes stored after a message id", TOPIC,
      A("-m", "--messageId", dest="message_id", type=_message_id, default={"ledgerId": -1, "entryId": -1},
        help="ledgerId:entryId (default: the whole topic)"))
def _topics_backlog_size(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.put(_topic_path(a.topic) + "/backlogSize", a.message_id)


@verb("topics", "terminate", "take no more messages on the topic", TOPIC)
def _topics_terminate(c: AdminClient, a: argparse.Namespace) -> Any:
    mid = c.post(_topic_path(a.topic) + "/terminate")
    return f"Topic successfully terminated at {mid['ledgerId']}:{mid['entryId']}"


@verb("topics", "unload", "unload a topic (clients reconnect)", TOPIC)
def _topics_unload(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.put(_topic_path(a.topic) + "/unload")


@verb("topics", "compact", "compact the topic (keep the latest message of each key)", TOPIC)
def _topics_compact(c: AdminClient, a: argparse.Namespace) -> Any:
    c.put(_topic_path(a.topic) + "/compaction")
    return "Topic compaction requested for " + a.topic


@verb("topics", "trim-topic", "delete the ledgers every subscription has passed and retention no longer keeps",
      TOPIC)
def _topics_trim(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.post(_topic_path(a.topic) + "/trim")


@verb("topics", "compaction-status", "the status of the last compaction", TOPIC,
      A("-w", "--wait-complete", action="store_true", help="wait until it is no longer running"),
      A("--timeout", type=float, default=300.0, help="seconds to wait at most (default 300)"))
def _topics_compaction_status(c: AdminClient, a: argparse.Namespace) -> Any:
    deadline = time.monotonic() + a.timeout
    while True:
        st = c.get(_topic_path(a.topic) + "/compaction")
        if not a.wait_complete or st["status"] != "RUNNING" or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if st["status"] == "ERROR":
        raise AdminError(0, f"Error in compaction: {st.get('lastError', '')}")
    return {"NOT_RUN": "Compaction has not been run for " + a.topic + " since broker startup",
            "RUNNING": "Compaction is currently running",
            "SUCCESS": "Compaction was a success"}.get(st["status"], st["status"])


@verb("topics", "subscriptions", "a topic's subscriptions", TOPIC, aliases=(("subscriptions", "list"),))
def _topics_subscriptions(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_topic_path(a.topic) + "/subscriptions")


def _sub_path(a: argparse.Namespace) -> str:
    return _topic_path(a.topic) + f"/subscription/{quote(a.subscription, safe='')}"


@verb("topics", "create-subscription", "create a subscription", TOPIC, SUB,
      A("-m", "--messageId", dest="message_id", type=_message_id, default=None,
        help="where it starts: latest (default), earliest or ledgerId:entryId"),
      aliases=(("subscriptions", "create"),))
def _topics_create_sub(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.put(_sub_path(a), a.message_id)


@verb("topics", "unsubscribe", "delete a subscription", TOPIC, SUB, FORCE,
      aliases=(("subscriptions", "delete"),))
def _topics_unsubscribe(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.delete(_sub_path(a), force=a.force or None)


@verb("topics", "reset-cursor", "move a subscription to a time or message id", TOPIC, SUB,
      A("-t", "--time", help="go back this long, e.g. 10m, 1h"),
      A("-m", "--messageId", dest="message_id", type=_message_id, help="ledgerId:entryId"),
      A("-e", "--exclude-message", action="store_true", help="start after the message id"),
      aliases=(("subscriptions", "reset-cursor"),))
def _topics_reset(c: AdminClient, a: argparse.Namespace) -> Any:
    if (a.time is None) == (a.message_id is None):
        raise AdminError(0, "Need to specify either --time or --messageId")
    if a.time is not None:
        ts = int(time.time() * 1000) - parse_relative_time(a.time) * 1000
        return c.post(_sub_path(a) + f"/resetcursor/{ts}")
    return c.post(_sub_path(a) + "/resetcursor", a.message_id, isExcluded=a.exclude_message or None)


@verb("topics", "skip", "skip messages of a subscription", TOPIC, SUB, A("-n", "--count", type=int, required=True),
      aliases=(("subscriptions", "skip"),))
def _topics_skip(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.post(_sub_path(a) + f"/skip/{a.count}")


@verb("topics", "clear-backlog", "skip all messages of a subscription", TOPIC, SUB,
      aliases=(("topics", "skip-all"), ("subscriptions", "skip-all"), ("subscriptions", "clear-backlog")))
def _topics_clear_backlog(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.post(_sub_path(a) + "/skip_all")


@verb("topics", "expire-messages", "expire messages older than a time", TOPIC, SUB,
      A("-t", "--expireTime", dest="expire_time", required=True, help="seconds (or 10m, 1h, ...)"),
      aliases=(("subscriptions", "expire"),))
def _topics_expire(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.post(_sub_path(a) + f"/expireMessages/{parse_relative_time(a.expire_time)}")


@verb("topics", "expire-messages-all-subscriptions", "expire messages on every subscription", TOPIC,
      A("-t", "--expireTime", dest="expire_time", required=True, help="seconds (or 10m, 1h, ...)"))
def _topics_expire_all(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.post(_topic_path(a.topic) + f"/all_subscription/expireMessages/{parse_relative_time(a.expire_time)}")


#: What pulsar-admin prints between two messages (peek-messages).
_MESSAGE_SEPARATOR = "\n" + "-" * 73 + "\n\n"


def _epoch_ms(header: str | None) -> int:
    """A ``X-Pulsar-*-time`` header (ISO 8601) as epoch milliseconds, the way pulsar-admin
    prints times; 0 when absent or unreadable."""
    if not header:
        return 0
    try:
        return round(datetime.fromisoformat(header).timestamp() * 1000)
    except ValueError:
        return 0


def _message_blocks(reply: Reply, limit: int | None = None) -> list[str]:
    """The message(s) of an entry as pulsar-admin prints them, one block each: its admin
    client splits a batched entry into its messages (at most `limit` here), each under
    ``Batch Message ID: ledger:entry:index`` with its own properties."""
    h = {k.lower(): v for k, v in reply.headers.items()}
    message_id = h.get("x-pulsar-message-id", "")
    head = [f"Publish time: {_epoch_ms(h.get('x-pulsar-publish-time'))}",
            f"Event time: {_epoch_ms(h.get('x-pulsar-event-time'))}"]
    deliver_at = _epoch_ms(h.get("x-pulsar-deliver-at-time"))
    if deliver_at:
        head.append(f"Deliver at time: {deliver_at}")
    if "x-pulsar-broker-entry-metadata-timestamp" in h:
        head.append("Broker entry metadata timestamp: "
                    f"{_epoch_ms(h['x-pulsar-broker-entry-metadata-timestamp'])}")
    if "x-pulsar-broker-entry-metadata-index" in h:
        head.append(f"Broker entry metadata index: {h['x-pulsar-broker-entry-metadata-index']}")
    if "x-pulsar-num-batch-message" not in h:
        props = _header_properties(h)
        return ["\n".join([f"Message ID: {message_id}", *head, *_properties(props), _hexdump(reply.body)])]
    singles = _batch_messages(reply.body, int(h["x-pulsar-num-batch-message"]))[:limit] or [(reply.body, None, {})]
    return ["\n".join([f"Batch Message ID: {message_id}:{i}", *head, *_properties(props), _hexdump(payload)])
            for i, (payload, _, props) in enumerate(singles)]


def _header_properties(h: dict[str, str]) -> dict[str, str]:
    """A message's properties from its admin response headers (lower-cased names): the
    one JSON header of Pulsar 3.1+ (PIP-279), which keeps the names as they are, or else
    one header per property."""
    if "x-pulsar-property" in h:
        try:
            props = json.loads(h["x-pulsar-property"])
        except ValueError:
            props = None
        if isinstance(props, dict):
            return {str(k): str(v) for k, v in props.items()}
    return {k[len("x-pulsar-property-"):]: v for k, v in h.items() if k.startswith("x-pulsar-property-")}


def _properties(props: dict[str, str]) -> list[str]:
    return ["Properties:", json.dumps(props, indent=2)] if props else []


def _batch_messages(body: bytes, n: int) -> list[tuple[bytes, str | None, dict[str, str]]]:
    """A batch payload's messages: (payload, key, properties) each."""
    from core.format import EntryFormatError, MessageMetadata, iter_batch

    md = MessageMetadata(producer_name="", sequence_id=0, publish_time=0, num_messages_in_batch=n,
                         uncompressed_size=len(body))
    try:
        singles = iter_batch(md, body)
    except EntryFormatError:
        return [(body, None, {})]
    return [(bytes(m.payload), m.metadata.partition_key if m.metadata.HasField("partition_key") else None,
             {kv.key: kv.value for kv in m.metadata.properties}) for m in singles]


def _split_batch(body: bytes, n: int) -> list[bytes]:
    """A batch payload's message payloads."""
    return [payload for payload, _, _ in _batch_messages(body, n)]


def _hexdump(data: bytes) -> str:
    rows = ["         +-------------------------------------------------+",
            "         |  0  1  2  3  4  5  6  7  8  9  a  b  c  d  e  f |",
            "+--------+-------------------------------------------------+----------------+"]
    for off in range(0, len(data), 16):
        chunk = data[off:off + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk).ljust(47)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk).ljust(16)
        rows.append(f"|{off:08x}| {hexes} |{text}|")
    rows.append("+--------+-------------------------------------------------+----------------+")
    return "\n".join(rows)


@verb("topics", "peek-messages", "show messages of a subscription without consuming them", TOPIC, SUB,
      A("-n", "--count", type=int, default=1), aliases=(("subscriptions", "peek"),))
def _topics_peek(c: AdminClient, a: argparse.Namespace) -> Any:
    # As pulsar-admin: -n counts messages, not entries (a batch's messages each count), and
    # the listing ends at the end of the backlog rather than failing there.
    blocks: list[str] = []
    left, position = a.count, 1
    while left > 0:
        try:
            reply = c.request("GET", _sub_path(a) + f"/position/{position}")
        except AdminError as exc:
            if exc.status == 404 and (blocks or exc.reason.startswith("No message found")):
                break
            raise
        blocks += _message_blocks(reply, left)
        h = {k.lower(): v for k, v in reply.headers.items()}
        left -= int(h.get("x-pulsar-num-batch-message", 1))
        position += 1
    return _MESSAGE_SEPARATOR.join(blocks)


@verb("topics", "get-message-by-id", "show a message by its id", TOPIC,
      A("-l", "--ledgerId", dest="ledger", type=int, required=True),
      A("-e", "--entryId", dest="entry", type=int, required=True))
def _topics_message_by_id(c: AdminClient, a: argparse.Namespace) -> Any:
    # pulsar-admin's getMessageById keeps the first message of a batched entry
    reply = c.request("GET", _topic_path(a.topic) + f"/ledger/{a.ledger}/entry/{a.entry}")
    return _message_blocks(reply, 1)[0]


@verb("topics", "examine-message", "show the message at a position from the start or end", TOPIC,
      A("-i", "--initialPosition", dest="initial", default="latest", choices=["earliest", "latest"]),
      A("-m", "--messagePosition", dest="position", type=int, default=1))
def _topics_examine(c: AdminClient, a: argparse.Namespace) -> Any:
    # pulsar-admin's examineMessage keeps the first message of a batched entry
    return _message_blocks(c.request("GET", _topic_path(a.topic) + "/examinemessage",
                                     query={"initialPosition": a.initial, "messagePosition": a.position}), 1)[0]


@verb("topics", "set-replication-clusters", "set the topic's replication clusters", TOPIC,
      A("-c", "--clusters", type=_csv, required=True))
def _topics_set_replication(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.post(_topic_path(a.topic) + "/replication", a.clusters)


@verb("topics", "get-replication-clusters", "the topic's replication clusters", TOPIC,
      A("-ap", "--applied", action="store_true"))
def _topics_get_replication(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.get(_topic_path(a.topic) + "/replication", applied=a.applied or None)


_policy_verbs("topics")

# -- schemas -----------------------------------------------------------------------------------


def _schema_info(topic: str, reply: dict[str, Any]) -> dict[str, Any]:
    """A GetSchemaResponse as pulsar-admin prints the SchemaInfo it makes of it: named
    after the topic, the definition of an AVRO, JSON or PROTOBUF schema as a JSON object
    (other types' as the string they are; a KeyValue schema's as its key's and value's
    SchemaInfo), properties sorted."""
    from core.naming import TopicName

    definition: Any = reply.get("data", "")
    properties = reply.get("properties") or {}
    if reply.get("type") in ("AVRO", "JSON", "PROTOBUF", "KEY_VALUE"):
        try:
            definition = json.loads(definition)
        except ValueError:
            pass
    if reply.get("type") == "KEY_VALUE" and isinstance(definition, dict):
        definition = {side: _key_value_side(side, definition.get(side, ""), properties)
                      for side in ("key", "value")}
    return {"name": TopicName.parse(topic).local_name, "schema": definition, "type": reply.get("type"),
            "timestamp": reply.get("timestamp", 0), "properties": dict(sorted(properties.items()))}


def _key_value_side(side: str, definition: Any, properties: dict[str, str]) -> dict[str, Any]:
    """The SchemaInfo of a KeyValue schema's key or value, as pulsar-admin prints it: its
    name, type and properties are the KeyValue schema's ``<side>.schema.*`` properties."""
    try:
        own = json.loads(properties.get(f"{side}.schema.properties") or "{}")
    except ValueError:
        own = {}
    return {"name": properties.get(f"{side}.schema.name", ""), "schema": definition,
            "type": properties.get(f"{side}.schema.type", "BYTES"), "timestamp": 0,
            "properties": dict(sorted(own.items())) if isinstance(own, dict) else {}}


@verb("schemas", "get", "a topic's schema (latest, with its version, or one version's)", TOPIC,
      A("-v", "--version", type=int))
def _schemas_get(c: AdminClient, a: argparse.Namespace) -> Any:
    path = _schema_path(a.topic) + "/schema"
    if a.version is not None:
        return _schema_info(a.topic, c.get(f"{path}/{a.version}"))
    reply = c.get(path)
    return {"version": reply.get("version"), "schemaInfo": _schema_info(a.topic, reply)}


@verb("schemas", "upload", "upload a schema", TOPIC,
      A("-f", "--filename", required=True, help='JSON file: {"type": "AVRO", "schema": "...", "properties": {}}'))
def _schemas_upload(c: AdminClient, a: argparse.Namespace) -> Any:
    try:
        with open(a.filename, encoding="utf-8") as f:
            payload = json.load(f)
    except (OSError, ValueError) as exc:
        raise AdminError(0, f"cannot read schema file {a.filename}: {exc}") from None
    c.post(_schema_path(a.topic) + "/schema", payload)
    return None


@verb("schemas", "delete", "delete a topic's schema", TOPIC)
def _schemas_delete(c: AdminClient, a: argparse.Namespace) -> Any:
    c.delete(_schema_path(a.topic) + "/schema")
    return None


@verb("schemas", "compatibility", "test a schema's compatibility", TOPIC, A("-f", "--filename", required=True))
def _schemas_compat(c: AdminClient, a: argparse.Namespace) -> Any:
    try:
        with open(a.filename, encoding="utf-8") as f:
            payload = json.load(f)
    except (OSError, ValueError) as exc:
        raise AdminError(0, f"cannot read schema file {a.filename}: {exc}") from None
    return c.post(_schema_path(a.topic) + "/compatibility", payload)


# --------------------------------------------------------------------------------------
# The command


def _java_double(value: float) -> str:
    """A double as Java's ``Double.toString`` writes it, and so Jackson: the shortest
    digits that read back, in scientific notation (``1.0E7``) below 10^-3 and from 10^7."""
    magnitude = abs(value)
    if not math.isfinite(value) or magnitude == 0 or 1e-3 <= magnitude < 1e7:
        return json.dumps(value)
    shortest = Decimal(repr(magnitude))
    digits = "".join(map(str, shortest.as_tuple().digits)).rstrip("0") or "0"
    return f"{'-' if value < 0 else ''}{digits[0]}.{digits[1:] or '0'}E{shortest.adjusted()}"


def pretty_json(value: Any, level: int = 0) -> str:
    """``value`` as pulsar-admin prints an object: Jackson's default pretty printer, with
    ``"key" : value`` one per line, two spaces a level, arrays on one line (``[ 1, 2 ]``,
    an object in one opening on the same line) and empty ones as ``{ }`` and ``[ ]``."""
    if isinstance(value, dict):
        if not value:
            return "{ }"
        pad = "  " * (level + 1)
        fields = (f"{pad}{json.dumps(str(k), ensure_ascii=False)} : {pretty_json(v, level + 1)}"
                  for k, v in value.items())
        return "{\n" + ",\n".join(fields) + "\n" + "  " * level + "}"
    if isinstance(value, list | tuple):
        return "[ " + ", ".join(pretty_json(v, level) for v in value) + " ]" if value else "[ ]"
    if isinstance(value, float):
        return _java_double(value)
    return json.dumps(value, ensure_ascii=False)


def _print(result: Any) -> None:
    if result is None:
        return
    if isinstance(result, str):
        print(result)
    elif isinstance(result, list):
        for item in result:
            print(item if isinstance(item, str) else pretty_json(item))
    else:
        print(pretty_json(result))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--admin-url", default=os.environ.get("MAGNETAR_ADMIN_URL", DEFAULT_ADMIN_URL),
                   help=f"admin REST URL (default {DEFAULT_ADMIN_URL}, or $MAGNETAR_ADMIN_URL)")
    add_auth_arguments(p)
    nouns = p.add_subparsers(dest="noun", metavar="NOUN", title="nouns")
    for noun, verbs in NOUNS.items():
        np = nouns.add_parser(noun, help=NOUN_HELP.get(noun, noun), description=NOUN_HELP.get(noun, noun))
        vs = np.add_subparsers(dest="verb", metavar="VERB", title="verbs")
        for name, v in verbs.items():
            vp = vs.add_parser(name, help=v.help, description=v.help)
            for flags, kw in v.args:
                vp.add_argument(*flags, **kw)
            vp.set_defaults(_verb=v)
        np.set_defaults(_noun_parser=np)
    p.set_defaults(_admin_parser=p)


def run(args: argparse.Namespace) -> int:
    v: Verb | None = getattr(args, "_verb", None)
    if v is None:
        parser = getattr(args, "_noun_parser", None) or args._admin_parser
        parser.print_help(sys.stderr)
        return 2
    try:
        client = AdminClient(args.admin_url, token=token_of(args))
        result = v.run(client, args)
        # pulsar-admin prints what a get returns, an unset policy included, as JSON: null.
        _print("null" if result is None and v.name.startswith("get") else result)
    except AdminError as exc:
        status = f" (HTTP {exc.status})" if exc.status else ""
        print(f"{exc.reason}{status}", file=sys.stderr)
        return 1
    except argparse.ArgumentTypeError as exc:
        print(f"magnetar admin: error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    from ._cli import main as cli_main

    return cli_main(["admin", *(sys.argv[1:] if argv is None else argv)])


register_command(Command(
    "admin",
    "administer tenants, namespaces, topics, subscriptions, schemas (like pulsar-admin)",
    add_arguments,
    run,
    "Talk to a broker's admin REST API the way pulsar-admin does.",
))


# --------------------------------------------------------------------------------------
# Shell completion for the whole ``magnetar`` command line


def completion_script(shell: str) -> str:
    """A bash (or zsh, through bashcompinit) completion script for every registered
    command, noun, verb and flag, generated from the argument parsers themselves."""
    from ._cli import build_parser

    words: dict[str, list[str]] = {}

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        found: list[str] = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found.append(name)
                    walk(sub, f"{path}/{name}")
            else:
                found.extend(o for o in action.option_strings if o.startswith("--") or len(o) == 2)
                if action.choices and not action.option_strings:
                    found.extend(str(c) for c in action.choices)
        words[path] = found

    walk(build_parser(), "_")
    table = "\n".join(f'  ["{k}"]="{" ".join(v)}"' for k, v in sorted(words.items()))
    script = f"""# magnetar shell completion ({shell}); load with: source <(magnetar completion {shell})
declare -gA _magnetar_words=(
{table}
)
_magnetar() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" path="_" w i
  for ((i = 1; i < COMP_CWORD; i++)); do
    w="${{COMP_WORDS[i]}}"
    if [[ "$w" != -* && -n "${{_magnetar_words[$path/$w]+set}}" ]]; then
      path="$path/$w"
    fi
  done
  COMPREPLY=($(compgen -W "${{_magnetar_words[$path]}}" -- "$cur"))
}}
complete -o default -F _magnetar magnetar
"""
    if shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    return script


def _completion_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete for")


def _run_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(completion_script(args.shell))
    return 0


from . import _client_cli  # noqa: E402,F401  (registers `magnetar client`)

register_command(Command(
    "completion",
    "print a shell completion script (bash or zsh)",
    _completion_arguments,
    _run_completion,
    "Print a completion script: source <(magnetar completion bash)",
))
