"""The reporter's HTTP: one kept-alive HTTP/1.1 connection (standard library)."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

TIMEOUT_S = 5.0


class Http:
    """One kept-alive HTTP/1.1 connection, opened again after any failure."""

    def __init__(self, url: str, token: str) -> None:
        parts = urlsplit(url)
        self.scheme, self.netloc = parts.scheme, parts.netloc
        self.prefix = parts.path.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}",
                        "Content-Type": "application/json", "Connection": "keep-alive"}
        self.conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: dict) -> tuple[int, bytes]:
        data = json.dumps(body).encode()
        if self.conn is None:
            cls = (http.client.HTTPSConnection if self.scheme == "https"
                   else http.client.HTTPConnection)
            self.conn = cls(self.netloc, timeout=TIMEOUT_S)
        try:
            self.conn.request("POST", self.prefix + path, body=data, headers=self.headers)
            resp = self.conn.getresponse()
            payload = resp.read()
        except BaseException:
            self.close()
            raise
        if resp.will_close:
            self.close()
        return resp.status, payload

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
