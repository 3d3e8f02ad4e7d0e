"""``/admin/v2/brokers``: the active brokers of a cluster, health check, version, the
broker's configuration (its dynamic keys changed at runtime, as in Pulsar's BrokersBase),
and the backlog quota check on request."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gateway._config import ConfigError
from gateway._runtime_config import NotDynamicError, as_text, dynamic_names

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
        return dynamic_names()

    @endpoint
    async def dynamic_config_values(request: Request) -> Any:
        return broker.config.stored()

    @endpoint
    async def runtime_config(request: Request) -> Any:
        return {name: as_text(value) for name, value in broker.config.as_dict().items()}

    @endpoint
    async def update_dynamic_config(request: Request) -> Any:
        name, value = request.path_params["configName"], request.path_params["configValue"]
        try:
            broker.config.update(name, value)
        except NotDynamicError:
            raise RestError(412, "Can't update non-dynamic configuration") from None
        except ConfigError as exc:
            raise RestError(412, f"Invalid dynamic-config value: {exc}") from None
        return Response(status_code=200)

    @endpoint
    async def delete_dynamic_config(request: Request) -> Any:
        try:
            broker.config.delete(request.path_params["configName"])
        except NotDynamicError:
            raise RestError(412, "Can't delete non-dynamic configuration") from None
        return Response(status_code=200)

    @endpoint
    async def internal_config(request: Request) -> Any:
        # Pulsar's InternalConfigurationData: its older names carry the same stores, and
        # the bookies' metadata lives in the one store, under /ledgers.
        store = str(broker.config.get("metadataStoreUrl"))
        return {
            "zookeeperServers": store,
            "configurationStoreServers": store,
            "metadataStoreUrl": store,
            "configurationMetadataStoreUrl": store,
            "ledgersRootPath": "/ledgers",
            "bookkeeperMetadataServiceUri": None,
            "stateStorageServiceUrl": None,
        }

    @endpoint
    async def backlog_quota_check(request: Request) -> Any:
        await broker.check_backlog_quotas()
        return None

    return [
        Route("/admin/v2/brokers/health", health, methods=["GET"]),
        Route("/admin/v2/brokers/ready", ready, methods=["GET"]),
        Route("/admin/v2/brokers/version", version, methods=["GET"]),
        Route("/admin/v2/brokers/leaderBroker", leader, methods=["GET"]),
        Route("/admin/v2/brokers/configuration", dynamic_config_names, methods=["GET"]),
        Route("/admin/v2/brokers/configuration/values", dynamic_config_values, methods=["GET"]),
        Route("/admin/v2/brokers/configuration/runtime", runtime_config, methods=["GET"]),
        Route("/admin/v2/brokers/configuration/{configName}/{configValue}", update_dynamic_config,
              methods=["POST"]),
        Route("/admin/v2/brokers/configuration/{configName}", delete_dynamic_config, methods=["DELETE"]),
        Route("/admin/v2/brokers/backlog-quota-check", backlog_quota_check, methods=["GET"]),
        Route("/admin/v2/brokers/internal-configuration", internal_config, methods=["GET"]),
        Route("/admin/v2/brokers", list_brokers, methods=["GET"]),
        Route("/admin/v2/brokers/{cluster}", list_brokers, methods=["GET"]),
        Route("/admin/v2/brokers/{cluster}/{broker}/ownedNamespaces", owned_namespaces, methods=["GET"]),
    ]
