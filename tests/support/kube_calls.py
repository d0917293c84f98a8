"""What a client sent to the real API server, and what came back.

Not a fake: every request goes through to the server unchanged. The tests
use the record to check what the provider asked for (the verbs deploy/
grants, the selectors, the delete options), which the server's state alone
does not show.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from kubernetes import client as k8s

from clusters.providers.kubernetes import client as kube_client


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]
    body: Any = None
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


class CallLog:
    def __init__(self, made: list[Call] | None = None):
        self.made: list[Call] = [] if made is None else made

    def calls(self, method: str | None = None, path: str | None = None) -> list[Call]:
        return [c for c in self.made
                if (method is None or c.method == method)
                and (path is None or c.path.startswith(path))]


class Recorder(CallLog):
    """Wraps `api`'s REST client; `calls()` lists the requests made through it."""

    def __init__(self, api: k8s.ApiClient, made: list[Call] | None = None):
        super().__init__(made)
        self.api = api
        rest = api.rest_client
        send = rest.request

        def request(method, url, query_params=None, headers=None, body=None, **kw):
            query = {k: str(v) for k, v in (query_params or [])}
            call = Call(method, urlparse(url).path, query, _plain(body))
            self.made.append(call)
            try:
                resp = send(method, url, query_params=query_params, headers=headers,
                            body=body, **kw)
            except k8s.ApiException as exc:
                call.status, call.headers = exc.status, dict(exc.headers or {})
                raise
            call.status = getattr(resp, "status", None)
            return resp

        rest.request = request


def _plain(body):
    """The JSON the client sent, as dicts (models go through the client's
    own serializer, as on the wire)."""
    if body is None or isinstance(body, (dict, list, str)):
        return body
    return json.loads(json.dumps(k8s.ApiClient().sanitize_for_serialization(body)))


def record_every_provider(monkeypatch) -> CallLog:
    """Records the calls of every Kubernetes provider the product builds from
    a Cluster row (the reconcilers build their own) into one log."""
    made: list[Call] = []
    build = kube_client.api_client_for

    def recorded(settings):
        return Recorder(build(settings), made).api

    monkeypatch.setattr(kube_client, "api_client_for", recorded)
    return CallLog(made)
