"""Clusters, brokers, bookies, tenants: Pulsar's paths, JSON shapes and status codes."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pulsar

from gateway._admin_cli import AdminClient
from tests._standalone import Standalone

from .conftest import status_of


def test_health_is_plain_ok(server: Standalone) -> None:
    with urllib.request.urlopen(server.addresses["web"][0] + "/admin/v2/brokers/health") as r:
        assert r.status == 200
        assert r.read() == b"ok"


def test_clusters_and_brokers(admin: AdminClient, server: Standalone) -> None:
    assert admin.get("/admin/v2/clusters") == ["standalone"]
    data = admin.get("/admin/v2/clusters/standalone")
    assert data["brokerServiceUrl"] == server.pulsar_url
    assert data["serviceUrl"] == server.addresses["web"][0]
    web_host_port = server.addresses["web"][0].removeprefix("http://")
    assert admin.get("/admin/v2/brokers/standalone") == [web_host_port]
    assert status_of(admin.get, "/admin/v2/clusters/nowhere")[0] == 404
    assert status_of(admin.get, "/admin/v2/brokers/nowhere")[0] == 404


def test_cluster_create_update_delete(admin: AdminClient, unique: str) -> None:
    name = f"c-{unique}"
    admin.put(f"/admin/v2/clusters/{name}", {"serviceUrl": "http://x:8080", "brokerServiceUrl": "pulsar://x:6650"})
    assert status_of(admin.put, f"/admin/v2/clusters/{name}", {"serviceUrl": "http://x:8080"})[0] == 409
    admin.post(f"/admin/v2/clusters/{name}", {"serviceUrl": "http://y:8080"})
    assert admin.get(f"/admin/v2/clusters/{name}") == {"serviceUrl": "http://y:8080"}
    assert status_of(admin.put, f"/admin/v2/clusters/{name}2", {"bogus": 1})[0] == 400
    admin.delete(f"/admin/v2/clusters/{name}")
    assert name not in admin.get("/admin/v2/clusters")
    assert status_of(admin.delete, "/admin/v2/clusters/standalone")[0] == 412


def test_bookies_lists_the_standalone_bookie(admin: AdminClient, server: Standalone) -> None:
    assert admin.get("/admin/v2/bookies/all") == {"bookies": [{"bookieId": server.addresses["bookies"][0]}]}
    assert admin.get("/admin/v2/bookies/state") == {"readWrite": server.addresses["bookies"], "readOnly": []}


def test_tenant_lifecycle(admin: AdminClient, unique: str) -> None:
    t = f"tenant-{unique}"
    admin.put(f"/admin/v2/tenants/{t}", {"adminRoles": ["admin"], "allowedClusters": ["standalone"]})
    assert t in admin.get("/admin/v2/tenants")
    assert admin.get(f"/admin/v2/tenants/{t}") == {"adminRoles": ["admin"], "allowedClusters": ["standalone"]}
    admin.post(f"/admin/v2/tenants/{t}", {"adminRoles": ["a", "b"], "allowedClusters": ["standalone"]})
    assert admin.get(f"/admin/v2/tenants/{t}")["adminRoles"] == ["a", "b"]
    admin.put(f"/admin/v2/namespaces/{t}/ns")
    assert status_of(admin.delete, f"/admin/v2/tenants/{t}") == (409, "The tenant still has active namespaces")
    admin.delete(f"/admin/v2/namespaces/{t}/ns")
    admin.delete(f"/admin/v2/tenants/{t}")
    assert t not in admin.get("/admin/v2/tenants")


def test_tenant_errors(admin: AdminClient, unique: str) -> None:
    t = f"tenant-{unique}"
    assert status_of(admin.get, f"/admin/v2/tenants/{t}") == (404, "Tenant does not exist")
    assert status_of(admin.put, f"/admin/v2/tenants/{t}", {"allowedClusters": ["nowhere"]})[0] == 412
    assert status_of(admin.put, f"/admin/v2/tenants/{t}", {"adminRoles": "not-a-list"})[0] == 400
    assert status_of(admin.put, "/admin/v2/tenants/bad%20name", {})[0] == 412
    admin.put(f"/admin/v2/tenants/{t}", {"allowedClusters": ["standalone"]})
    assert status_of(admin.put, f"/admin/v2/tenants/{t}", {"allowedClusters": ["standalone"]}) == \
        (409, "Tenant already exists")
    assert status_of(admin.post, f"/admin/v2/tenants/{t}-missing", {})[0] == 404
    assert status_of(admin.delete, f"/admin/v2/tenants/{t}-missing")[0] == 404


def test_malformed_json_is_400_not_500(admin: AdminClient, server: Standalone, unique: str) -> None:
    req = urllib.request.Request(server.addresses["web"][0] + f"/admin/v2/tenants/x-{unique}",
                                 data=b"{not json", method="PUT")
    try:
        urllib.request.urlopen(req)
    except urllib.error.HTTPError as exc:
        assert exc.code == 400
        assert "reason" in __import__("json").loads(exc.read())
    else:
        raise AssertionError("accepted malformed JSON")


def test_unknown_path_has_pulsar_error_shape(admin: AdminClient) -> None:
    assert status_of(admin.get, "/admin/v2/nothing/here") == (404, "Not found")
    assert status_of(admin.request, "PATCH", "/admin/v2/tenants")[0] == 405


def test_force_delete_tenant_removes_namespaces_and_topics(admin: AdminClient, unique: str) -> None:
    t = f"tenant-{unique}"
    admin.put(f"/admin/v2/tenants/{t}", {"allowedClusters": ["standalone"]})
    admin.put(f"/admin/v2/namespaces/{t}/ns")
    admin.put(f"/admin/v2/persistent/{t}/ns/topic")
    admin.put(f"/admin/v2/persistent/{t}/ns/parts/partitions", 2)
    admin.delete(f"/admin/v2/tenants/{t}", force="true")
    assert t not in admin.get("/admin/v2/tenants")
    admin.put(f"/admin/v2/tenants/{t}", {"allowedClusters": ["standalone"]})
    admin.put(f"/admin/v2/namespaces/{t}/ns")
    assert admin.get(f"/admin/v2/persistent/{t}/ns") == []
    assert admin.get(f"/admin/v2/persistent/{t}/ns/partitioned") == []


def test_recreated_namespace_starts_without_old_topic_policies(admin: AdminClient, unique: str) -> None:
    t = f"tenant-{unique}"
    admin.put(f"/admin/v2/tenants/{t}", {"allowedClusters": ["standalone"]})
    admin.put(f"/admin/v2/namespaces/{t}/ns")
    admin.put(f"/admin/v2/persistent/{t}/ns/topic")
    admin.post(f"/admin/v2/persistent/{t}/ns/topic/messageTTL", messageTTL=5)
    admin.delete(f"/admin/v2/namespaces/{t}/ns", force="true")
    admin.put(f"/admin/v2/namespaces/{t}/ns")
    admin.put(f"/admin/v2/persistent/{t}/ns/topic")
    assert admin.get(f"/admin/v2/persistent/{t}/ns/topic/messageTTL") is None


def test_broker_version_leader_and_racks(admin: AdminClient, server: Standalone) -> None:
    from importlib import metadata

    assert admin.request("GET", "/admin/v2/brokers/version").body.decode() == metadata.version("magnetar")
    assert admin.get("/admin/v2/brokers/leaderBroker")["serviceUrl"] == server.addresses["web"][0]
    bookie = server.addresses["bookies"][0]
    assert admin.get("/admin/v2/bookies/racks-info") == \
        {"default": {bookie: {"rack": "/default-rack", "hostname": bookie.rsplit(":", 1)[0]}}}
    owned = admin.get(f"/admin/v2/brokers/standalone/{server.addresses['web'][0].removeprefix('http://')}"
                      "/ownedNamespaces")
    assert "public/default/0x00000000_0xffffffff" in owned


def test_a_bookie_registers_under_the_advertised_address(tmp_path: Path) -> None:
    """advertisedAddress names the bookie too, as BookKeeper's does: it registers as
    host:port under that host, ledgers name it so, and the broker writes through it."""
    with Standalone(tmp_path, conf={"advertisedAddress": "localhost"}) as server:
        admin = AdminClient(server.addresses["web"][0], timeout=30)
        [bookie] = admin.get("/admin/v2/bookies/state")["readWrite"]
        assert bookie.startswith("localhost:")
        client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=10)
        try:
            producer = client.create_producer("advertised", batching_enabled=False)
            producer.send(b"stored")
            stats = admin.get("/admin/v2/persistent/public/default/advertised/internalStats",
                              metadata="true")
            assert bookie in stats["ledgers"][-1]["metadata"]  # its ensemble names it so
        finally:
            client.close()
