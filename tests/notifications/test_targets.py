"""The SSRF guard of webhooks: one reading of the URL's host, IPv4 found
inside IPv6 transition addresses, and a connection made to the address the
check saw, with the host name kept for Host, SNI and the certificate."""

import datetime
import ipaddress
import ssl

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.utils import timezone

from notifications import delivery, pinning, targets
from notifications.models import Delivery, Webhook

LOOPBACK = ipaddress.ip_address("127.0.0.1")


@pytest.mark.parametrize("url", [
    "http://127.0.0.1\\x.attacker.example/",  # urlsplit and urllib3 read two hosts
    "http://hooks.example.com\\@127.0.0.1/",
    "http://127.0.0.1\t.attacker.example/",
    "http://hooks.example.com%2f@127.0.0.1/",
    "http://hooks.example.com%00.attacker.example/",
    "http://b\u00fccher.example/",
    "http://[v1.fe]/",
])
def test_a_host_outside_rfc_3986_is_refused_before_any_lookup(url):
    with pytest.raises(targets.UnsafeTarget):
        targets.check_syntax(url)


@pytest.mark.parametrize("address", [
    "64:ff9b::a9fe:a9fe",    # NAT64 of 169.254.169.254, the metadata service
    "64:ff9b::10.0.0.7",
    "64:ff9b:1::a00:7",      # local-use NAT64 (RFC 8215)
    "2002:a00:7::1",         # 6to4 of 10.0.0.7
    "::10.0.0.7",            # IPv4-compatible
    "::127.0.0.1",
    "::ffff:127.0.0.1",
])
def test_an_ipv6_address_that_carries_a_private_ipv4_is_refused(address, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    assert targets.refused(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["64:ff9b::8.8.8.8", "2002:808:808::1", "8.8.8.8",
                                     "2606:4700:4700::1111"])
def test_a_transition_address_of_a_public_ipv4_passes(address, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    assert not targets.refused(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", [
    "224.0.0.1", "239.255.255.250", "233.252.0.1",   # multicast, IPv4
    "ff02::1", "ff0e::1", "ff05::fb",                 # multicast, IPv6 (link to global scope)
    "255.255.255.255", "240.0.0.1",                   # broadcast, reserved
    "::ffff:0:7f00:1", "::ffff:0:808:808",            # SIIT-translated IPv4
    "::ffff:8.8.8.8",                                 # even a public IPv4, mapped
    "fe80::1", "fec0::1", "fd00::1",                  # link-local, site-local, ULA
    "2001::1", "2001:db8::1", "100::1", "::", "::1",  # Teredo, documentation, discard
    "64:ff9b::e000:1", "2002:e000:1::1",              # NAT64 and 6to4 of a multicast IPv4
    "3fff::1", "5f00::1",                             # documentation, SRv6 (2024)
])
def test_an_address_that_is_not_global_unicast_is_refused(address, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    assert targets.refused(ipaddress.ip_address(address)), address


@pytest.mark.parametrize("url", [
    "http://224.0.0.1/", "http://239.255.255.250:1900/", "http://[ff02::1]/",
    "http://[ff0e::1]/", "http://[::ffff:0:7f00:1]/", "http://[fe80::1%25eth0]/",
    "http://[2606:4700::1%25eth0]/",
])
def test_a_webhook_to_such_an_address_is_a_400_on_url(api, owner, url, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    resp = api(owner).post("/api/v1/webhooks/", {"team": "vision", "url": url,
                                                 "events": ["job.failed"]}, format="json")
    assert resp.status_code == 400 and list(resp.data) == ["url"], resp.data
    assert not Webhook.objects.exists()


def test_an_operator_may_allow_any_network_even_a_multicast_one(settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = [ipaddress.ip_network("239.255.0.0/16")]
    assert not targets.refused(ipaddress.ip_address("239.255.255.250"))
    assert targets.refused(ipaddress.ip_address("224.0.0.1"))


def test_an_allowed_network_covers_the_ipv4_inside_a_nat64_address(settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = [ipaddress.ip_network("10.1.0.0/16")]
    assert not targets.refused(ipaddress.ip_address("64:ff9b::10.1.2.3"))
    assert targets.refused(ipaddress.ip_address("64:ff9b::10.2.2.3"))


@pytest.mark.django_db
def test_a_stored_url_that_parsers_read_two_ways_is_never_sent(team, receiver, settings):
    """A webhook saved before the check was strict: its try fails for good,
    and the receiver on 127.0.0.1 (where the HTTP client would have gone)
    gets nothing, even with loopback allowed."""
    settings.WEBHOOK_ALLOWED_NETWORKS = [ipaddress.ip_network("127.0.0.0/8")]
    url = f"http://127.0.0.1\\x.attacker.example:{receiver.port}/hook"
    webhook = Webhook.objects.create(team=team, url=url, events=["job.succeeded"])
    now = timezone.now()
    row = delivery.deliver(delivery.ping(webhook, now).pk, now)
    assert row.status == Delivery.Status.FAILED and "RFC 3986" in row.last_error
    assert receiver.received == []


def test_the_connection_goes_to_the_checked_address_whatever_the_name_resolves_to(
        receiver):
    # .invalid never resolves (RFC 6761): the request arrives only because
    # the adapter connects to the address it was given, not to a new answer.
    url = f"http://rebound.invalid:{receiver.port}/hook"
    with pinning.session(LOOPBACK) as http:
        resp = http.post(url, data=b"{}", timeout=5)
    assert resp.status_code == 200
    [got] = receiver.received
    assert got.headers["Host"] == f"rebound.invalid:{receiver.port}"


def _certificate_for(name: str, tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def tls_receiver(make_receiver, tmp_path):
    """An HTTPS receiver on 127.0.0.1 whose certificate names only
    hooks.example.test (no IP address), and the SNI names it was asked for."""
    cert, key = _certificate_for("hooks.example.test", tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    asked = []
    context.sni_callback = lambda sock, name, ctx: asked.append(name)
    server = make_receiver(tls=context)
    return server, cert, asked


def test_https_to_the_checked_address_sends_sni_and_checks_the_certificate_by_name(
        tls_receiver):
    server, cert, asked = tls_receiver
    with pinning.session(LOOPBACK) as http:
        resp = http.post(f"https://hooks.example.test:{server.port}/hook", data=b"{}",
                         timeout=5, verify=str(cert))
    assert resp.status_code == 200 and asked == ["hooks.example.test"]
    assert server.received[0].headers["Host"] == f"hooks.example.test:{server.port}"


def test_https_to_a_name_the_certificate_does_not_carry_still_fails(tls_receiver):
    server, cert, _ = tls_receiver
    with pinning.session(LOOPBACK) as http, pytest.raises(requests.exceptions.SSLError):
        http.post(f"https://other.example.test:{server.port}/hook", data=b"{}",
                  timeout=5, verify=str(cert))
    assert server.received == []
