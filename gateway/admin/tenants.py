"""``/admin/v2/tenants``: list, get, create, update, delete (TenantInfo JSON:
``{"adminRoles": [...], "allowedClusters": [...]}``)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from core.naming import NamespaceName

from ._common import RestError, body_object, endpoint, existing_clusters, json_body, tenant_of

__all__ = ["routes"]


def routes(broker: Any) -> list[Route]:
    policies = broker.policies

    def tenant_info(body: Any) -> dict[str, Any]:
        data = body_object(body if body is not None else {}, "TenantInfo")
        roles = data.get("adminRoles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise RestError(400, "adminRoles must be a list of strings")
        clusters = existing_clusters(policies, data.get("allowedClusters", []), "allowedClusters",
                                     "Clusters do not exist")
        return {"adminRoles": roles, "allowedClusters": clusters}

    @endpoint
    async def list_tenants(request: Request) -> Any:
        return policies.tenants()

    @endpoint
    async def get_tenant(request: Request) -> Any:
        info = policies.get_tenant(tenant_of(request))
        if info is None:
            raise RestError(404, "Tenant does not exist")
        return info

    @endpoint
    async def create_tenant(request: Request) -> Any:
        tenant = tenant_of(request)
        info = tenant_info(await json_body(request, required=False))
        if not info["allowedClusters"]:
            info["allowedClusters"] = [broker.cluster]
        policies.create_tenant(tenant, info)
        return None

    @endpoint
    async def update_tenant(request: Request) -> Any:
        tenant = tenant_of(request)
        if policies.get_tenant(tenant) is None:
            raise RestError(404, "Tenant does not exist")
        policies.update_tenant(tenant, tenant_info(await json_body(request)))
        return None

    @endpoint
    async def delete_tenant(request: Request) -> Any:
        tenant = tenant_of(request)
        force = request.query_params.get("force", "false").lower() == "true"
        if force and policies.get_tenant(tenant) is not None:
            for ns in policies.namespaces(tenant):
                await delete_namespace_everything(broker, NamespaceName.parse(ns))
        policies.delete_tenant(tenant)
        return None

    return [
        Route("/admin/v2/tenants", list_tenants, methods=["GET"]),
        Route("/admin/v2/tenants/{tenant}", get_tenant, methods=["GET"]),
        Route("/admin/v2/tenants/{tenant}", create_tenant, methods=["PUT"]),
        Route("/admin/v2/tenants/{tenant}", update_tenant, methods=["POST"]),
        Route("/admin/v2/tenants/{tenant}", delete_tenant, methods=["DELETE"]),
    ]


async def delete_namespace_everything(broker: Any, ns: NamespaceName) -> None:
    """Force-delete a namespace: its topics (clients disconnected) and then itself."""
    from core.naming import TopicName

    for domain in ("persistent", "non-persistent"):
        for base in broker.policies.partitioned_topics(ns, domain):
            broker.policies.delete_partitioned(TopicName.parse(base))
        for name in broker.topics_of_namespace(ns, domain):
            await broker.delete_topic(TopicName.parse(name), force=True)
    broker.policies.delete_namespace(ns)
