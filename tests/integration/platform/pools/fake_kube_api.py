"""A stand-in for the Kubernetes API server (not for any Kiln component), for the ``kubernetes``
pool backend's tests: an in-process aiohttp server with only the endpoints the backend calls.

It stores Deployments and Pods and answers like the API server does (JSON objects, ``Status``
errors, JSON merge patches, equality label selectors). It runs no controllers: the tests play
the Deployment controller and the kubelet by adding and changing pods themselves.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

DEPLOYMENTS = "/apis/apps/v1/namespaces/{ns}/deployments"
TOKEN = "fake-service-account-token"


@dataclass
class FakeKubeAPI:
    """The stored objects and every request seen (method, path, content type)."""

    url: str = ""
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    _version: int = 0

    def add_pod(
        self,
        deployment: str,
        name: str,
        ip: str | None = "127.0.0.2",
        *,
        ready: bool = True,
        waiting: str | None = None,
        created: str = "2026-01-01T00:00:00Z",
    ) -> dict[str, Any]:
        """A pod of ``deployment``'s template (what its ReplicaSet would make), as the kubelet
        reports it: Ready or not, an IP or none, a container waiting for ``waiting``."""
        template = self.deployments[deployment]["spec"]["template"]
        state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "kiln", "creationTimestamp": created,
                         "labels": dict(template["metadata"]["labels"])},
            "spec": copy.deepcopy(template["spec"]),
            "status": {
                "phase": "Running",
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": str(ready)}],
                "containerStatuses": [{"name": "worker", "ready": ready, "restartCount": 0,
                                       "image": "i", "imageID": "", "state": state}],
            },
        }  # fmt: skip
        self.pods[name] = pod
        return pod

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{self._version}")
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        meta["resourceVersion"] = str(self._version)
        return obj

    def app(self) -> web.Application:
        """The routes the backend uses."""
        app = web.Application(middlewares=[self._record])
        one = DEPLOYMENTS + "/{name}"
        app.router.add_post(DEPLOYMENTS, self._create)
        app.router.add_get(DEPLOYMENTS, self._list_deployments)
        app.router.add_get(one, self._get)
        app.router.add_patch(one, self._patch)
        app.router.add_delete(one, self._delete)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._list_pods)
        return app

    def kubeconfig(self) -> dict[str, Any]:
        """A kubeconfig for this server: a bearer token, namespace ``kiln``."""
        return {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                "users": [{"name": "kiln", "user": {"token": TOKEN}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "kiln",
                                                          "namespace": "kiln"}}]}  # fmt: skip

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path, request.content_type))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return _status(401, "Unauthorized", "Unauthorized")
        response: web.StreamResponse = await handler(request)
        return response

    async def _create(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = body["metadata"]["name"]
        if name in self.deployments:
            return _status(409, "AlreadyExists", f'deployments.apps "{name}" already exists')
        self.deployments[name] = self._stamp(body)
        return web.json_response(body, status=201)

    async def _get(self, request: web.Request) -> web.Response:
        found = self.deployments.get(request.match_info["name"])
        return web.json_response(found) if found else _status(404, "NotFound", "not found")

    async def _patch(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if request.content_type != "application/merge-patch+json":
            return _status(415, "UnsupportedMediaType", request.content_type)
        if name not in self.deployments:
            return _status(404, "NotFound", f'deployments.apps "{name}" not found')
        merged = _merge(self.deployments[name], await request.json())
        self.deployments[name] = self._stamp(merged)
        return web.json_response(merged)

    async def _delete(self, request: web.Request) -> web.Response:
        if self.deployments.pop(request.match_info["name"], None) is None:
            return _status(404, "NotFound", "not found")
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})

    async def _list_pods(self, request: web.Request) -> web.Response:
        return self._list(request, "v1", "PodList", self.pods)

    async def _list_deployments(self, request: web.Request) -> web.Response:
        return self._list(request, "apps/v1", "DeploymentList", self.deployments)

    def _list(
        self, request: web.Request, api: str, kind: str, objects: dict[str, dict[str, Any]]
    ) -> web.Response:
        wanted = dict(
            term.split("=", 1) for term in request.query.get("labelSelector", "").split(",") if term
        )
        items = [
            obj for obj in objects.values()
            if wanted.items() <= (obj["metadata"].get("labels") or {}).items()
        ]  # fmt: skip
        return web.json_response({"apiVersion": api, "kind": kind,
                                  "metadata": {"resourceVersion": str(self._version)},
                                  "items": items})  # fmt: skip


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what ``application/merge-patch+json`` means)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip
    # exactly ``application/json``, as the API server sends (lightkube parses errors only then)
    return web.Response(
        body=json.dumps(body), status=code, headers={"Content-Type": "application/json"}
    )


@asynccontextmanager
async def serving() -> AsyncIterator[FakeKubeAPI]:
    """The fake API server on a free loopback port (``FakeKubeAPI.url``)."""
    api = FakeKubeAPI()
    runner = web.AppRunner(api.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    api.url = f"http://127.0.0.1:{port}"
    try:
        yield api
    finally:
        await runner.cleanup()
