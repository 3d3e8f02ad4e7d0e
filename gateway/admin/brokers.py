"""``/admin/v2/brokers``: the active brokers of a cluster, health check, version, and
the broker's own configuration view."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ._common import RestError, cluster_of, endpoint
from .bookies import bookies

__all__ = ["routes", "broker_id"]


def broker_id(broker: Any) -> str:
    """``host:webServicePort``, the way Pulsar names a broker in ``brokers list``."""
    url = urlparse(broker.web_service_url or "")
    return f"{url.hostname}:{url.port}" if url.hostname else ""


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("magnetar")
    except metadata.PackageNotFoundError:
        import gateway

        return str(getattr(gateway, "__version__", "0+unknown"))


def routes(broker: Any) -> list[Route]:
    @endpoint
    async def health(request: Request) -> Any:
        topic = request.query_params.get("topic")
        if topic is not None:
            from core.naming import TopicName

            TopicName.parse(topic)
        if broker.storage is None:
            raise RestError(503, "Broker is not ready")
        if not bookies(broker.metadata)["readWrite"]:
            raise RestError(503, "No writable bookie is available")
        return PlainTextResponse("ok")

    @endpoint
    async def ready(request: Request) -> Any:
        return PlainTextResponse("ok")

    @endpoint
    async def version(request: Request) -> Any:
        return PlainTextResponse(_version())

    @endpoint
    async def list_brokers(request: Request) -> Any:
        cluster = cluster_of(request, broker.cluster)
        if cluster != broker.cluster and broker.policies.get_cluster(cluster) is None:
            raise RestError(404, f"Cluster {cluster} does not exist")
        return [broker_id(broker)] if cluster == broker.cluster else []

    @endpoint
    async def leader(request: Request) -> Any:
        return {"serviceUrl": broker.web_service_url, "brokerId": broker_id(broker)}

    @endpoint
    async def owned_namespaces(request: Request) -> Any:
        cluster = cluster_of(request)
        if cluster != broker.cluster:
            raise RestError(404, f"Cluster {cluster} does not exist")
        out: dict[str, Any] = {}
        for tenant in broker.policies.tenants():
            for ns in broker.policies.namespaces(tenant):
                out[f"{ns}/0x00000000_0xffffffff"] = {
                    "broker_assignment": "primary", "is_controlled": False, "is_active": True}
        return out

    @endpoint
    async def dynamic_config_names(request: Request) -> Any:
        return []

    @endpoint
    async def internal_config(request: Request) -> Any:
        return {
            "zookeeperServers": None,
            "configurationStoreServers": None,
            "metadataStoreUrl": str(broker.config.get("metadataStoreUrl")),
            "clusterName": broker.cluster,
        }

    return [
        Route("/admin/v2/brokers/health", health, methods=["GET"]),
        Route("/admin/v2/brokers/ready", ready, methods=["GET"]),
        Route("/admin/v2/brokers/version", version, methods=["GET"]),
        Route("/admin/v2/brokers/leaderBroker", leader, methods=["GET"]),
        Route("/admin/v2/brokers/configuration", dynamic_config_names, methods=["GET"]),
        Route("/admin/v2/brokers/internal-configuration", internal_config, methods=["GET"]),
        Route("/admin/v2/brokers", list_brokers, methods=["GET"]),
        Route("/admin/v2/brokers/{cluster}", list_brokers, methods=["GET"]),
        Route("/admin/v2/brokers/{cluster}/{broker}/ownedNamespaces", owned_namespaces, methods=["GET"]),
    ]
