"""``/admin/v2/namespaces``: create, delete, list, the Policies document, each policy
(retention, backlog quota, message TTL, deduplication, schema compatibility strategy,
auto-topic-creation, max producers/consumers per topic, dispatch and publish rate,
permissions, replication clusters), properties, and namespace-wide unload / clear-backlog."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from core.naming import NamespaceName, TopicName
from core.policies import default_policies

from ._common import (
    RestError,
    body_object,
    endpoint,
    json_body,
    json_list,
    namespace_of,
    replication_clusters,
    tenant_of,
)
from ._permissions import actions_of, auth_policies, namespace_routes
from ._policies import (
    POLICY_SPECS,
    PolicySpec,
    backlog_quota_body,
    quota_within_retention,
    read_body,
)
from .tenants import delete_namespace_everything

__all__ = ["routes"]



def _properties(value: Any) -> dict[str, str]:
    """A namespace's properties from a request: a JSON object of strings (400 otherwise)."""
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise RestError(400, "Properties must be a JSON object of string values")
    return value


def _text(value: str | None) -> Response:
    """A single property's value as Pulsar answers it: the string itself (not JSON
    quoted, which its admin client would keep), or 204 when there is none."""
    if value is None:
        return Response(status_code=204)
    return Response(value, media_type="application/json")

def routes(broker: Any) -> list[Route]:
    policies = broker.policies

    def existing(request: Request) -> tuple[NamespaceName, dict[str, Any]]:
        ns = namespace_of(request)
        if policies.get_tenant(ns.tenant) is None:
            raise RestError(404, "Tenant does not exist")
        pol = policies.get_namespace(ns)
        if pol is None:
            raise RestError(404, "Namespace does not exist")
        return ns, pol

    async def changed(ns: NamespaceName, spec: PolicySpec | None = None) -> None:
        broker.refresh_policies(ns)
        if spec is not None and spec.reload:
            for key in [k for k, t in broker.topics.items() if t.name.namespace_name == ns]:
                await broker.unload_topic(TopicName.parse(key))

    @endpoint
    async def list_namespaces(request: Request) -> Any:
        tenant = tenant_of(request)
        if policies.get_tenant(tenant) is None:
            raise RestError(404, "Tenant does not exist")
        return policies.namespaces(tenant)

    @endpoint
    async def create_namespace(request: Request) -> Any:
        ns = namespace_of(request)
        if policies.get_tenant(ns.tenant) is None:
            raise RestError(404, "Tenant does not exist")
        body = await json_body(request, required=False)
        initial: dict[str, Any] = {}
        if body is not None:
            data = body_object(body, "Policies")
            base = default_policies([broker.cluster])
            unknown = sorted(k for k in data if k not in base)
            if unknown:
                raise RestError(400, f"Unknown Policies fields: {', '.join(unknown)}")
            if "replication_clusters" in data:
                replication_clusters(policies, ns.tenant, data["replication_clusters"])
            if data.get("properties") is not None:
                _properties(data["properties"])
            initial = {k: v for k, v in data.items() if v is not None}
        policies.create_namespace(ns, initial)
        return None

    @endpoint
    async def get_policies(request: Request) -> Any:
        _, pol = existing(request)
        return {**pol, "properties": pol.get("properties") or {}}

    @endpoint
    async def delete_namespace(request: Request) -> Any:
        ns, _ = existing(request)
        force = request.query_params.get("force", "false").lower() == "true"
        if force:
            await delete_namespace_everything(broker, ns)
            return None
        if await broker.topic_names(ns) or await broker.topic_names(ns, "non-persistent"):
            raise RestError(409, "Cannot delete non empty namespace")
        policies.delete_namespace(ns)
        return None

    @endpoint
    async def list_topics(request: Request) -> Any:
        ns, _ = existing(request)
        mode = request.query_params.get("mode", "PERSISTENT").upper()
        domains = {"PERSISTENT": ["persistent"], "NON_PERSISTENT": ["non-persistent"],
                   "ALL": ["persistent", "non-persistent"]}.get(mode)
        if domains is None:
            raise RestError(400, f"Invalid mode {mode!r}: PERSISTENT, NON_PERSISTENT or ALL")
        names: list[str] = []
        for domain in sorted(domains):  # non-persistent:// names sort before persistent://
            names += await broker.topic_names(ns, domain)
        return await json_list(names)

    def policy_routes(spec: PolicySpec) -> list[Route]:
        @endpoint
        async def get(request: Request) -> Any:
            _, pol = existing(request)
            value = pol.get(spec.key)
            return JSONResponse(spec.unset if value is None else value)

        @endpoint
        async def put(request: Request) -> Any:
            ns, pol = existing(request)
            value = spec.parse(await read_body(request), request)
            quotas = pol.get("backlog_quota_map") or {}
            if spec.key == "retention_policies" and quotas and not quota_within_retention(
                    broker.config, quotas.get("destination_storage"), value):
                raise RestError(412, "Retention Quota must exceed configured backlog quota for namespace.")
            policies.update_namespace(ns, lambda p: p.__setitem__(spec.key, value))
            await changed(ns, spec)
            return None

        @endpoint
        async def delete(request: Request) -> Any:
            ns, _ = existing(request)
            policies.update_namespace(ns, lambda p: p.__setitem__(spec.key, None))
            await changed(ns, spec)
            return None

        path = f"/admin/v2/namespaces/{{tenant}}/{{namespace}}/{spec.suffix}"
        return [Route(path, get, methods=["GET"]), Route(path, put, methods=list(spec.set_methods)),
                Route(path, delete, methods=["DELETE"])]

    # -- backlog quota -------------------------------------------------------------------------

    @endpoint
    async def get_backlog_quotas(request: Request) -> Any:
        _, pol = existing(request)
        return pol.get("backlog_quota_map") or {}

    @endpoint
    async def set_backlog_quota(request: Request) -> Any:
        ns, pol = existing(request)
        kind, quota = backlog_quota_body(await json_body(request), request)
        if not quota_within_retention(broker.config, quota if kind == "destination_storage" else None,
                                      pol.get("retention_policies")):
            raise RestError(412, "Backlog Quota exceeds configured retention quota for namespace."
                                 " Please increase retention quota and retry")

        def apply(p: dict[str, Any]) -> None:
            p["backlog_quota_map"] = {**(p.get("backlog_quota_map") or {}), kind: quota}

        policies.update_namespace(ns, apply)
        await changed(ns)
        return None

    @endpoint
    async def remove_backlog_quota(request: Request) -> Any:
        ns, _ = existing(request)
        kind = request.query_params.get("backlogQuotaType", "destination_storage")

        def apply(p: dict[str, Any]) -> None:
            p["backlog_quota_map"] = {k: v for k, v in (p.get("backlog_quota_map") or {}).items() if k != kind}

        policies.update_namespace(ns, apply)
        await changed(ns)
        return None

    # -- permissions -------------------------------------------------------------------------------

    @endpoint
    async def get_permissions(request: Request) -> Any:
        _, pol = existing(request)
        return ((pol.get("auth_policies") or {}).get("namespace_auth")) or {}

    @endpoint
    async def grant(request: Request) -> Any:
        ns, _ = existing(request)
        role = str(request.path_params["role"])
        actions = await actions_of(request)

        def apply(p: dict[str, Any]) -> None:
            auth_policies(p)["namespace_auth"][role] = actions

        policies.update_namespace(ns, apply)
        return None

    @endpoint
    async def revoke(request: Request) -> Any:
        ns, _ = existing(request)
        role = str(request.path_params["role"])

        def apply(p: dict[str, Any]) -> None:
            (p.get("auth_policies") or {}).get("namespace_auth", {}).pop(role, None)

        policies.update_namespace(ns, apply)
        return None

    # -- replication clusters ------------------------------------------------------------------------

    @endpoint
    async def get_replication(request: Request) -> Any:
        _, pol = existing(request)
        return pol.get("replication_clusters") or []

    @endpoint
    async def set_replication(request: Request) -> Any:
        ns, _ = existing(request)
        clusters = replication_clusters(policies, ns.tenant, await json_body(request))
        policies.update_namespace(ns, lambda p: p.__setitem__("replication_clusters", clusters))
        return None

    # -- properties --------------------------------------------------------------------------------

    def change_properties(request: Request, change: Any) -> dict[str, str]:
        """Apply ``change(properties)`` (mutating) to the namespace's properties; returns
        them as they were before."""
        ns, _ = existing(request)
        before: dict[str, str] = {}

        def apply(p: dict[str, Any]) -> None:
            properties = dict(p.get("properties") or {})
            before.clear()
            before.update(properties)
            change(properties)
            p["properties"] = properties

        policies.update_namespace(ns, apply)
        return before

    @endpoint
    async def set_property(request: Request) -> Any:
        key, value = str(request.path_params["key"]), str(request.path_params["value"])
        change_properties(request, lambda p: p.__setitem__(key, value))
        return None

    @endpoint
    async def get_property(request: Request) -> Any:
        _, pol = existing(request)
        return _text((pol.get("properties") or {}).get(str(request.path_params["key"])))

    @endpoint
    async def remove_property(request: Request) -> Any:
        key = str(request.path_params["key"])
        # as Pulsar: the answer is the value removed
        return _text(change_properties(request, lambda p: p.pop(key, None)).get(key))

    @endpoint
    async def set_properties(request: Request) -> Any:
        existing(request)
        properties = _properties(await json_body(request))
        change_properties(request, lambda p: p.update(properties))
        return None

    @endpoint
    async def get_properties(request: Request) -> Any:
        _, pol = existing(request)
        return pol.get("properties") or {}

    @endpoint
    async def clear_properties(request: Request) -> Any:
        change_properties(request, lambda p: p.clear())
        return None

    # -- namespace-wide operations -------------------------------------------------------------------

    @endpoint
    async def unload(request: Request) -> Any:
        ns, _ = existing(request)
        for key in [k for k, t in broker.topics.items() if t.name.namespace_name == ns]:
            await broker.unload_topic(TopicName.parse(key))
        return None

    @endpoint
    async def clear_backlog(request: Request) -> Any:
        ns, _ = existing(request)
        only = request.path_params.get("subscription")
        for name in await broker.topic_names(ns):
            topic = await broker.get_topic(TopicName.parse(name), create=False)
            for sub in list(topic.subscriptions.values()):
                if only is None or sub.name == only:
                    await sub.clear_backlog()
        return None

    @endpoint
    async def unsubscribe(request: Request) -> Any:
        ns, _ = existing(request)
        sub_name = str(request.path_params["subscription"])
        for name in await broker.topic_names(ns):
            topic = await broker.get_topic(TopicName.parse(name), create=False)
            if sub_name in topic.subscriptions:
                await topic.unsubscribe(sub_name)
        return None

    base = "/admin/v2/namespaces/{tenant}/{namespace}"
    out = [
        Route("/admin/v2/namespaces/{tenant}", list_namespaces, methods=["GET"]),
        Route(f"{base}/topics", list_topics, methods=["GET"]),
        Route(f"{base}/backlogQuotaMap", get_backlog_quotas, methods=["GET"]),
        Route(f"{base}/backlogQuota", set_backlog_quota, methods=["POST"]),
        Route(f"{base}/backlogQuota", remove_backlog_quota, methods=["DELETE"]),
        *namespace_routes(broker, base, existing),
        Route(f"{base}/permissions", get_permissions, methods=["GET"]),
        Route(f"{base}/permissions/{{role}}", grant, methods=["POST"]),
        Route(f"{base}/permissions/{{role}}", revoke, methods=["DELETE"]),
        Route(f"{base}/replication", get_replication, methods=["GET"]),
        Route(f"{base}/replication", set_replication, methods=["POST"]),
        Route(f"{base}/property/{{key}}/{{value}}", set_property, methods=["PUT"]),
        Route(f"{base}/property/{{key}}", get_property, methods=["GET"]),
        Route(f"{base}/property/{{key}}", remove_property, methods=["DELETE"]),
        Route(f"{base}/properties", set_properties, methods=["PUT"]),
        Route(f"{base}/properties", get_properties, methods=["GET"]),
        Route(f"{base}/properties", clear_properties, methods=["DELETE"]),
        Route(f"{base}/unload", unload, methods=["PUT"]),
        Route(f"{base}/clearBacklog", clear_backlog, methods=["POST"]),
        Route(f"{base}/clearBacklog/{{subscription}}", clear_backlog, methods=["POST"]),
        Route(f"{base}/unsubscribe/{{subscription}}", unsubscribe, methods=["POST"]),
    ]
    for spec in POLICY_SPECS:
        out.extend(policy_routes(spec))
    out += [
        Route(base, get_policies, methods=["GET"]),
        Route(base, create_namespace, methods=["PUT"]),
        Route(base, delete_namespace, methods=["DELETE"]),
    ]
    return out
