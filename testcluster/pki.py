"""The cluster's keys and certificates, made once per state folder.

A CA, the API server's serving certificate for 127.0.0.1 and localhost
(signed by the CA, so clients verify it instead of skipping TLS checks), and
the key that signs ServiceAccount tokens.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

_DAY = datetime.timedelta(days=1)


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def ensure(folder: Path) -> dict[str, Path]:
    """Creates what is missing in `folder` and returns the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / name for name in
             ("ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub")}
    if all(p.exists() for p in paths.values()):
        return paths
    now = datetime.datetime.now(datetime.UTC)
    ca_key = _key()
    ca = (x509.CertificateBuilder().subject_name(_name("regatta-testcluster-ca"))
          .issuer_name(_name("regatta-testcluster-ca")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - _DAY).not_valid_after(now + 365 * _DAY)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    server_key = _key()
    sans = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost"),
            x509.DNSName("kubernetes.default.svc"), x509.DNSName("kubernetes")]
    server = (x509.CertificateBuilder().subject_name(_name("kube-apiserver"))
              .issuer_name(ca.subject).public_key(server_key.public_key())
              .serial_number(x509.random_serial_number())
              .not_valid_before(now - _DAY).not_valid_after(now + 365 * _DAY)
              .add_extension(x509.SubjectAlternativeName(sans), critical=False)
              .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                             critical=False)
              .sign(ca_key, hashes.SHA256()))
    sa_key = _key()
    _write_key(paths["ca.key"], ca_key)
    _write_key(paths["apiserver.key"], server_key)
    _write_key(paths["sa.key"], sa_key)
    paths["ca.crt"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["apiserver.crt"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths["sa.pub"].write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return paths


def serving_cert(folder: Path, ca_folder: Path, name: str) -> tuple[Path, Path]:
    """A serving certificate for 127.0.0.1, signed by the cluster's CA, as
    tls.crt and tls.key in `folder`: the controllers' webhook servers, which
    the API server calls by URL on loopback (testcluster/trainer_v2.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    crt, key_path = folder / "tls.crt", folder / "tls.key"
    if crt.exists() and key_path.exists():
        return crt, key_path
    ca_key = serialization.load_pem_private_key((ca_folder / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate((ca_folder / "ca.crt").read_bytes())
    now = datetime.datetime.now(datetime.UTC)
    key = _key()
    cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY).not_valid_after(now + 365 * _DAY)
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_key(key_path, key)
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return crt, key_path
