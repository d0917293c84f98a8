"""Admission and conversion webhooks of the controllers in the test cluster.

Each controller serves its webhooks on a loopback port with a certificate of
the cluster's CA (pki.serving_cert), and the configurations their modules
ship call it through a Service, which nothing routes to here (no kube-proxy,
and Endpoints may not name a loopback address). So each webhook is rewritten
to call the same path by URL at the controller's port, with the CA as its
bundle: what the API server sends and how it treats the answer are
unchanged. The controllers' own cert rotators stay off, since they would
issue certificates for the Service's DNS name.
"""

from __future__ import annotations

import base64
import socket
import ssl
from pathlib import Path


def client_config(port: int, path: str, ca_bundle: bytes) -> dict:
    return {"url": f"https://127.0.0.1:{port}{path}",
            "caBundle": base64.b64encode(ca_bundle).decode()}


def by_url(doc: dict, port: int, ca_bundle: bytes) -> dict:
    """A (Mutating|Validating)WebhookConfiguration with every webhook called
    by URL at `port`, in place."""
    for hook in doc["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = client_config(port, path, ca_bundle)
    return doc


def serving(port: int, ca: Path) -> bool:
    """Whether a webhook server answers TLS on the port with a certificate
    the cluster's CA signed (the API server's own check, in short)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            with ctx.wrap_socket(sock, server_hostname="127.0.0.1"):
                return True
    except OSError:
        return False
