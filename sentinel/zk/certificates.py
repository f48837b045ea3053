"""Throwaway certificates for a local TLS ZooKeeper: a CA, a server and a client certificate.

The launcher (``LocalZooKeeper(tls=True)``) makes a fresh set in the server's directory each
time it starts, so that tests and demos run TLS end to end without any file checked in. The
CA's key is used once and never written. Keys are RSA (ZooKeeper's PEM reader loads RSA keys
in every version that reads PEM) and written unencrypted, mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sentinel.zk.tls import TlsConfig

KEY_BITS = 2048
VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class LocalPki:
    """The files of one throwaway CA: what the server loads and what a client needs."""

    ca: Path  # the CA certificate: the server's trust store and the clients' CA
    server_keystore: Path  # the server's key and certificate, one PEM file (ZooKeeper's form)
    client_cert: Path
    client_key: Path

    def client_config(self) -> TlsConfig:
        """The TLS settings of a client that trusts the CA and presents the client certificate."""
        return TlsConfig(str(self.ca), str(self.client_cert), str(self.client_key))


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=KEY_BITS)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Sentinel local ZooKeeper"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _certificate(
    subject: str,
    key: rsa.RSAPrivateKey,
    issuer: tuple[x509.Name, rsa.RSAPrivateKey] | None,
    usage: ExtendedKeyUsageOID | None = None,
    names: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    """A certificate for ``key``, signed by ``issuer`` (None: self-signed CA)."""
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, signing_key = issuer or (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is None:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _private_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def write_file(path: Path, data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` with ``mode`` from its first byte (keys: 0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    return path


def make_local_pki(directory: Path) -> LocalPki:
    """A new CA, a server certificate for ``localhost`` and ``127.0.0.1``, and a client
    certificate (CN ``sentinel-client``), written into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca = _certificate("Sentinel local ZooKeeper CA", ca_key, None)
    issuer = (ca.subject, ca_key)
    server_key = _key()
    server = _certificate(
        "localhost",
        server_key,
        issuer,
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_key = _key()
    client = _certificate("sentinel-client", client_key, issuer, ExtendedKeyUsageOID.CLIENT_AUTH)
    return LocalPki(
        ca=write_file(directory / "ca.pem", _pem(ca)),
        server_keystore=write_file(
            directory / "server.pem", _private_pem(server_key) + _pem(server), 0o600
        ),
        client_cert=write_file(directory / "client.pem", _pem(client)),
        client_key=write_file(directory / "client-key.pem", _private_pem(client_key), 0o600),
    )
