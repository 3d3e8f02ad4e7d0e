"""``/admin/v2/clusters``: list, get, create, update, delete (ClusterData JSON)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from ._common import RestError, body_object, cluster_of, endpoint, json_body

__all__ = ["routes"]

_FIELDS = ("serviceUrl", "serviceUrlTls", "brokerServiceUrl", "brokerServiceUrlTls", "peerClusterNames")


def _cluster_data(body: Any) -> dict[str, Any]:
    data = body_object(body, "ClusterData")
    unknown = sorted(set(data) - set(_FIELDS) - {"proxyServiceUrl", "proxyProtocol", "authenticationPlugin",
                                                  "authenticationParameters", "brokerClientTlsEnabled",
                                                  "tlsAllowInsecureConnection", "listenerName"})
    if unknown:
        raise RestError(400, f"Unknown ClusterData fields: {', '.join(unknown)}")
    return data


def routes(broker: Any) -> list[Route]:
    policies = broker.policies

    @endpoint
    async def list_clusters(request: Request) -> Any:
        return policies.clusters()

    @endpoint
    async def get_cluster(request: Request) -> Any:
        name = cluster_of(request)
        data = policies.get_cluster(name)
        if data is None:
            raise RestError(404, "Cluster does not exist")
        if name == broker.cluster:
            # The serving broker's bound addresses (a configured port may be 0).
            data = {**data, "serviceUrl": broker.web_service_url or data.get("serviceUrl"),
                    "brokerServiceUrl": broker.pulsar_service_url or data.get("brokerServiceUrl")}
        return data

    @endpoint
    async def create_cluster(request: Request) -> Any:
        name = cluster_of(request)
        policies.create_cluster(name, _cluster_data(await json_body(request)))
        return None

    @endpoint
    async def update_cluster(request: Request) -> Any:
        name = cluster_of(request)
        if policies.get_cluster(name) is None:
            raise RestError(404, "Cluster does not exist")
        policies.update_cluster(name, _cluster_data(await json_body(request)))
        return None

    @endpoint
    async def delete_cluster(request: Request) -> Any:
        name = cluster_of(request)
        if name == broker.cluster:
            raise RestError(412, "Cannot delete the cluster this broker serves")
        policies.delete_cluster(name)
        return None

    return [
        Route("/admin/v2/clusters", list_clusters, methods=["GET"]),
        Route("/admin/v2/clusters/{cluster}", get_cluster, methods=["GET"]),
        Route("/admin/v2/clusters/{cluster}", create_cluster, methods=["PUT"]),
        Route("/admin/v2/clusters/{cluster}", update_cluster, methods=["POST"]),
        Route("/admin/v2/clusters/{cluster}", delete_cluster, methods=["DELETE"]),
    ]
