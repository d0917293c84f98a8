"""An HTTP adapter that connects to an address checked beforehand.

requests would resolve the URL's host again when it connects, and a second
DNS answer may differ from the one the SSRF check saw (rebinding, or a name
with several addresses). Through this adapter the TCP connection goes to
the checked address, while the Host header, TLS SNI and the certificate
check still use the name in the URL, so a receiver behind a CDN or with an
ordinary certificate sees a normal request.
"""

from __future__ import annotations

import requests
from requests.adapters import HTTPAdapter
from urllib3.util import parse_url

from .targets import Address


class PinnedAddressAdapter(HTTPAdapter):
    def __init__(self, address: Address):
        self.address = address
        super().__init__(max_retries=0)

    def build_connection_pool_key_attributes(self, request, verify, cert=None):
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(
            request, verify, cert)
        name = host_params["host"]
        host_params["host"] = f"[{self.address}]" if self.address.version == 6 \
            else str(self.address)
        if host_params["scheme"] == "https":
            pool_kwargs["server_hostname"] = name  # SNI
            pool_kwargs["assert_hostname"] = name  # the certificate must name the host
        return host_params, pool_kwargs

    def add_headers(self, request, **kwargs):
        # Without it http.client would send the address as the Host.
        request.headers["Host"] = parse_url(request.url).netloc


def session(address: Address) -> requests.Session:
    """A session whose every request connects to `address`."""
    pinned = requests.Session()
    adapter = PinnedAddressAdapter(address)
    pinned.mount("http://", adapter)
    pinned.mount("https://", adapter)
    return pinned
